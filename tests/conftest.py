"""Shared test set-up: every test gets its tier marker from the folder it lives in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_containment import SEEN_AFTER, describe_cgroups, our_cgroups
from kx_xdist import group_weight, xdist_group

# Folder name -> marker (each declared in pyproject.toml; --strict-markers is on).
_TIERS = {
    "unit",
    "command",
    "kernel",
    "docker",
    "gateway",
    "cluster",
    "integrations",
    "mcp",
    "adversarial",
    "fidelity",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))


# pytest-xdist (-n in addopts) sends each group to one worker, where its tests run one after the
# other. A file is a group (its module-scoped kernels and containers are made once, its tests keep
# their order). One group, "serial", holds what must not run beside itself: the Docker/gVisor and
# Swarm tiers and the Docker files of other tiers (one engine; containers' ends awaited with
# deadlines), and every file that runs `kernelexec gc` (a sweep is host-wide: two at once race
# for the same dead host's leftovers, and one finds "removed 0").
@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown when it is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # A scheduler of our own rather than xdist_group marks and --dist loadgroup: on pytest 9.2
    # loadgroup ignores the marks (pytest-xdist issue 1386) and spreads a group over workers.
    from xdist.scheduler import LoadScopeScheduling

    class _Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # The longest group waiting goes first: one started last becomes the run's tail
            # while the other workers idle (xdist orders by test count, and the Swarm tier's
            # few tests are among the longest).
            if self.workqueue:
                queue = self.workqueue
                longest = max(queue, key=lambda g: group_weight(g, len(queue[g])))
                queue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return _Groups(config, log)


# Cgroups this test process made and never removed, each with the test after which it was first
# seen: a test that checks "none of ours is left" fails for another file's leftover otherwise
# (seen in CI: a late, small file in a worker). Reported at the end of each worker's run.
def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    for path in our_cgroups():
        SEEN_AFTER.setdefault(path.name, nodeid)


@pytest.fixture(scope="session", autouse=True)
def no_cgroup_left_behind() -> Iterator[None]:
    """Torn down last: every cgroup the run's executors made is gone (an error at the teardown
    of the worker's last test names the test that left it)."""
    yield
    left = our_cgroups()
    assert not left, f"cgroups left behind:\n{describe_cgroups(left)}"


InterruptOnMarker = Callable[[Any, str], threading.Thread]


@pytest.fixture
def interrupt_on_marker() -> Iterator[InterruptOnMarker]:
    """``start(executor, marker)``: a thread that interrupts the sync kernel ``executor`` once
    its running block prints ``marker``; an event, not a guessed sleep. Join it after the block."""
    started: list[tuple[Any, threading.Thread, threading.Event]] = []

    def start(executor: Any, marker: str) -> threading.Thread:
        seen = threading.Event()

        def watch(output: dict[str, Any]) -> None:
            if output.get("output_type") == "stream" and marker in str(output.get("text", "")):
                seen.set()

        executor.aio.on_output = watch

        def interrupt() -> None:
            if seen.wait(60):
                executor.interrupt()

        thread = threading.Thread(target=interrupt, daemon=True)
        thread.start()
        started.append((executor, thread, seen))
        return thread

    yield start
    for executor, thread, seen in started:
        seen.set()  # a block that never printed the marker must not leave the thread waiting
        thread.join(60)
        executor.aio.on_output = None


FilesContract = Callable[[Any, Path], None]


def _check_files(ex: Any, landed: Path) -> None:
    """The files API on any sync executor whose files physically live in ``landed``."""
    import os

    from kernelexec import ExecutorClosed, InvalidPath  # noqa: F401  (names the tree's errors)

    ex.write_file("notes/hello.txt", "héllo\n")
    assert (landed / "notes" / "hello.txt").read_text(encoding="utf-8") == "héllo\n"
    assert ex.read_file("notes/hello.txt") == "héllo\n".encode()
    blob = os.urandom(2_500_000)  # more than two 1 MiB chunks on a remote kernel
    ex.write_file("data.bin", blob)
    assert ex.read_file("data.bin") == blob
    ex.write_file("empty", b"")
    assert ex.read_file("empty") == b""
    # code sees what was written, and the API sees what code wrote
    r = ex.execute("print(open('notes/hello.txt', encoding='utf-8').read().upper(), end='')")
    assert r.output == "HÉLLO\n", r.output
    assert ex.execute("open('made.txt', 'w').write('by code')").exit_code == 0
    assert ex.read_file("made.txt") == b"by code"
    listing = {e.path: e for e in ex.list_files()}
    assert listing["notes"].is_dir and not listing["data.bin"].is_dir
    assert listing["data.bin"].size == len(blob)
    assert ".kernelexec" not in listing
    assert [e.path for e in ex.list_files("notes")] == ["notes/hello.txt"]
    for bad in ("../outside.txt", "/etc/passwd", "notes/../../x", "", "a\x00b"):
        with pytest.raises(InvalidPath):
            ex.read_file(bad)
        with pytest.raises(InvalidPath):
            ex.write_file(bad, b"x")
    (landed / "link").symlink_to("/etc")
    with pytest.raises(InvalidPath):
        ex.read_file("link/hostname")
    with pytest.raises(FileNotFoundError):
        ex.read_file("missing.txt")
    with pytest.raises(IsADirectoryError):
        ex.read_file("notes")
    assert ex.execute("print(2 + 2)").output.strip() == "4"  # still usable after the refusals


@pytest.fixture
def files_contract() -> FilesContract:
    """``check(executor, landed)``: the files API contract, shared by every back end's tests."""
    return _check_files


@pytest.fixture
def transfer_roundtrip(tmp_path: Path) -> Callable[[Any], None]:
    """``check(executor)``: upload a host file and download it back, byte for byte."""
    import os

    def check(ex: Any) -> None:
        source = tmp_path / "upload-me.bin"
        source.write_bytes(os.urandom(300_000))
        assert ex.upload(source) == "upload-me.bin"
        assert ex.upload(source, "in/copy.bin") == "in/copy.bin"
        assert ex.read_file("in/copy.bin") == source.read_bytes()
        out = tmp_path / "back"
        out.mkdir()
        got = ex.download("in/copy.bin", out)
        assert got == out / "copy.bin" and got.read_bytes() == source.read_bytes()
        renamed = ex.download("upload-me.bin", tmp_path / "renamed.bin")
        assert renamed.read_bytes() == source.read_bytes()

    return check
