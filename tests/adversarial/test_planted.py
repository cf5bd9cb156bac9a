"""Links and special files planted by the code in its own work dir, on every back end that
shares the work dir with the host (issue 30, items 1, 3 and 4).

The code (in a container, a sandbox, gVisor, or a local process) owns its work dir: it renames
kernelexec's ``.kernelexec`` and ``outputs`` and plants links to host paths, FIFOs and link loops
where the host will write or read next. The host (root on these machines) must never write
through them, never block on them, and answer each with a result or an error from the tree;
the host file and folder outside stay exactly as they were and nothing is left behind.
Every case is a real executor built through the registry; one per back end for the module.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_adversarial import DOCKER, Running, kill_all, new_token

from kernelexec import InvalidPath, KernelExecError, UnsafePath, make_executor

SECRET = b"host file: never written by kernelexec"
KERNEL_KINDS = ("kernel", "fork-kernel", "docker-kernel", "sandboxed-kernel")
COMMAND_KINDS = ("command", "docker-command", "sandboxed-command")

# (registry name, runtime): every back end whose work dir is the host's own folder
_BACKENDS = [
    ("command", None, [pytest.mark.command]),
    ("kernel", None, [pytest.mark.kernel]),
    ("fork-kernel", None, [pytest.mark.kernel]),
    ("sandboxed-command", None, [pytest.mark.kernel]),
    ("sandboxed-kernel", None, [pytest.mark.kernel]),
    ("docker-command", None, [pytest.mark.docker]),
    ("docker-kernel", None, [pytest.mark.docker]),
    ("docker-command", "runsc", [pytest.mark.docker, pytest.mark.gvisor]),
    ("docker-kernel", "runsc", [pytest.mark.docker, pytest.mark.gvisor]),
]


def planted(kinds: tuple[str, ...] = KERNEL_KINDS + COMMAND_KINDS) -> list[Any]:
    return [
        pytest.param((name, runtime), marks=marks, id=name + ("-gvisor" if runtime else ""))
        for name, runtime, marks in _BACKENDS
        if name in kinds
    ]


def _gvisor_problem(client: Any) -> str | None:
    if client is None:
        return "no Docker engine"
    return None if "runsc" in (client.info().get("Runtimes") or {}) else "runsc not registered"


def _require(name: str, runtime: str | None, docker_problem: str | None, client: Any) -> None:
    problem, flag = None, ""
    if name.startswith("sandboxed"):
        from kernelexec import BackendUnavailable
        from kernelexec.backends._sandbox import check_sandbox

        try:
            check_sandbox()
        except BackendUnavailable as exc:
            problem, flag = str(exc), "KERNELEXEC_REQUIRE_SANDBOX"
    elif name in DOCKER:
        problem, flag = docker_problem, "KERNELEXEC_REQUIRE_DOCKER"
        if problem is None and runtime == "runsc":
            problem, flag = _gvisor_problem(client), "KERNELEXEC_REQUIRE_GVISOR"
    if problem is not None:
        if os.environ.get(flag) == "1":
            pytest.fail(f"{problem} ({flag}=1, so this is a failure)")
        pytest.skip(problem)


class _Cache:
    """One executor per (back end, runtime) for the module, closed together at its end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.open: dict[tuple[str, str | None], Any] = {}

    def get(self, name: str, runtime: str | None) -> Any:
        key = (name, runtime)
        if key not in self.open:
            work = self.root / f"{name}-{runtime or 'default'}"
            options: dict[str, Any] = {"runtime": runtime} if runtime else {}
            self.open[key] = make_executor(name, work_dir=work, timeout=30, **options)
        return self.open[key]

    def checked(self) -> list[Any]:
        """The executors whose containers ``Running`` can look into: under gVisor the engine's
        process list of a container is gVisor's own, not the container's processes."""
        return [e for (_, runtime), e in self.open.items() if runtime is None]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Cache]:
    found = _Cache(tmp_path_factory.mktemp("planted"))
    yield found
    for executor in found.open.values():
        executor.close()


@pytest.fixture
def ex(
    request: pytest.FixtureRequest, cache: _Cache, docker_problem: str | None, docker_client: Any
) -> Iterator[Any]:
    """The module's executor of the case's back end; after the case: nothing left running,
    no temporary file of the door's left in the work dir."""
    name, runtime = request.param
    _require(name, runtime, docker_problem, docker_client)
    executor = cache.get(name, runtime)
    executor.kx_kind = name
    executor.start()  # its kernel or container is its own, not something the case left
    client = docker_client if name in DOCKER else None
    token = new_token()
    running = Running.now(cache.checked(), token, client)
    yield executor
    kill_all(token)
    left = running.left(cache.checked())
    assert left == [], f"left running: {left}"
    temps = [p for p in executor.work_dir.rglob(".kx-*.kx-partial")]
    assert temps == [], f"temporary files left: {temps}"


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A host folder outside every work dir, with a host file: neither may ever change."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "file").write_bytes(SECRET)
    before = folder.stat()
    yield folder
    assert sorted(p.name for p in folder.iterdir()) == ["file"], list(folder.iterdir())
    assert (folder / "file").read_bytes() == SECRET
    after = folder.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    ), "the host folder changed owner or mode"


def run(ex: Any, code: str) -> Any:
    r = ex.execute(code)
    assert r.ok, r.output
    return r


_MOVE_OWN = """
import os
if os.path.lexists('.kernelexec'):
    os.rename('.kernelexec', '.kx-moved-' + os.urandom(4).hex())
os.makedirs('.kernelexec/output')
"""


# -- 1. the spill file ---------------------------------------------------------------------------
@pytest.mark.parametrize("ex", planted(), indirect=True)
def test_the_spill_file_is_not_written_through_a_planted_link(ex: Any, outside: Path) -> None:
    host_file = str(outside / "file")
    code = _MOVE_OWN + (
        "for i in range(1, 400):\n"
        f"    os.symlink({host_file!r}, '.kernelexec/output/block-%d.txt' % i)\n"
        "print('y' * 60000)\n"
    )
    r = run(ex, code)
    assert r.truncated and "characters omitted" in r.output
    spill = r.full_output_file
    if spill is not None:  # the message names a true file: kernelexec's own, in the work dir
        assert not spill.is_symlink() and spill.is_file(), spill
        assert spill.resolve().is_relative_to(ex.work_dir.resolve())
        assert spill.read_text().startswith("y" * 1000)
        assert str(spill) in r.output


# -- 2. outputs/ as a link to a host folder --------------------------------------------------------
@pytest.mark.parametrize("ex", planted(KERNEL_KINDS), indirect=True)
def test_display_files_do_not_land_in_a_planted_host_folder(ex: Any, outside: Path) -> None:
    code = (
        "import os, base64\n"
        "from IPython.display import display\n"
        "if os.path.lexists('outputs'):\n"
        "    os.rename('outputs', 'outputs-moved-' + os.urandom(4).hex())\n"
        f"os.symlink({str(outside)!r}, 'outputs')\n"
        "display({'image/png': base64.b64encode(b'chosen bytes').decode(),"
        " 'text/plain': 'img'}, raw=True)\n"
    )
    try:
        r = run(ex, code)
        assert all(p.resolve().is_relative_to(ex.work_dir.resolve()) for p in r.files), r.files
        assert any(o.get("output_type") == "display_data" for o in r.outputs)  # still an output
        # and the result says the file was refused, and why (never "saved to")
        assert "[image/png not saved to outputs/" in r.output and "symbolic link" in r.output
    finally:
        (ex.work_dir / "outputs").unlink(missing_ok=True)


# -- 3. the files API's temporary name, and a folder link on the way -------------------------------
@pytest.mark.parametrize("ex", planted(), indirect=True)
def test_write_file_never_writes_through_a_planted_name(ex: Any, outside: Path) -> None:
    token = new_token()
    code = (
        "import os\n"
        f"os.symlink({str(outside / 'file')!r}, '.data-{token}.csv.kx-partial')\n"
        f"os.symlink({str(outside / 'file')!r}, 'linked-{token}.csv')\n"
        f"os.symlink({str(outside)!r}, 'dir-{token}')\n"
    )
    run(ex, code)
    ex.write_file(f"data-{token}.csv", b"agent data")
    assert ex.read_file(f"data-{token}.csv") == b"agent data"
    assert not (ex.work_dir / f"data-{token}.csv").is_symlink()
    with pytest.raises(InvalidPath):  # a link at the name itself, pointing out
        ex.write_file(f"linked-{token}.csv", b"x")
    with pytest.raises(InvalidPath):
        ex.write_file(f"dir-{token}/new.csv", b"x")
    with pytest.raises(InvalidPath):
        ex.read_file(f"dir-{token}/file")
    with pytest.raises(InvalidPath):
        ex.upload(outside / "file", f"dir-{token}/up.csv")


# -- 4. kernelexec's own folders as links to a host folder -----------------------------------------
@pytest.mark.parametrize("ex", planted(COMMAND_KINDS), indirect=True)
def test_code_files_never_land_in_a_planted_host_folder(ex: Any, outside: Path) -> None:
    code = _MOVE_OWN + "".join(
        f"os.symlink({str(outside)!r}, '.kernelexec/{sub}')\n" for sub in ("code", "mpl", "status")
    )
    code = code.replace("os.makedirs('.kernelexec/output')", "os.makedirs('.kernelexec')")
    run(ex, code)
    # The links in kernelexec's own folder are removed (never followed) and the block runs.
    r = ex.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nprint('next')")
    assert r.ok and r.stdout.endswith("next\n"), r.output
    assert r.code_file and Path(r.code_file).resolve().is_relative_to(ex.work_dir.resolve())
    assert not (ex.work_dir / ".kernelexec" / "code").is_symlink()
    if ex.kx_kind == "docker-command":
        # A new session on this work dir hands .kernelexec/status to the container user: never
        # the host folder a link there points to (the outside fixture checks its owner).
        shutil.rmtree(ex.work_dir / ".kernelexec")
        os.makedirs(ex.work_dir / ".kernelexec")
        (ex.work_dir / ".kernelexec" / "status").symlink_to(outside)
        runtime = ex.backend.options.runtime
        extra = {"runtime": runtime} if runtime else {}
        with make_executor("docker-command", work_dir=ex.work_dir, timeout=30, **extra) as again:
            assert again.execute("print('second')").output == "second\n"
        assert (ex.work_dir / ".kernelexec" / "status").is_dir()


# -- 5. a FIFO where the host reads ----------------------------------------------------------------
@pytest.mark.parametrize("ex", planted(), indirect=True)
def test_a_planted_fifo_is_refused_at_once(ex: Any, tmp_path: Path) -> None:
    token = new_token()
    run(ex, f"import os\nos.mkfifo('result-{token}.csv')\n")
    name = f"result-{token}.csv"
    fifo = ex.work_dir / name
    if not os.path.lexists(fifo):
        # gVisor keeps a FIFO made inside it in its own file system: the host sees no file.
        assert ex.kx_kind.startswith("docker") and ex.backend.options.runtime == "runsc"
        with pytest.raises(FileNotFoundError):
            ex.read_file(name)
        return
    box: list[BaseException] = []

    def read() -> None:
        try:
            ex.read_file(name)
        except BaseException as exc:  # handed to the test thread
            box.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # the defect: free the reader (a writer opens the FIFO), then fail
        with open(fifo, "wb"):
            pass
        reader.join(10)
        pytest.fail("read_file blocked on a FIFO planted in the work dir")
    assert isinstance(box[0], UnsafePath) and "FIFO" in str(box[0]), box
    with pytest.raises(UnsafePath):
        ex.download(name, tmp_path / "copy.csv")
    assert not (tmp_path / "copy.csv").exists()
    listed = {e.path: e for e in ex.list_files(".")}
    assert name in listed and not listed[name].is_dir
    assert ex.execute("print('usable')").output == "usable\n"


# -- 6. link loops and links out in a listing ------------------------------------------------------
@pytest.mark.parametrize("ex", planted(), indirect=True)
def test_loops_and_links_are_listed_as_links(ex: Any, outside: Path) -> None:
    token = new_token()
    run(
        ex,
        "import os\n"
        f"os.symlink('loop-{token}', 'loop-{token}')\n"
        f"os.symlink({str(outside)!r}, 'out-{token}')\n",
    )
    listed = {e.path: e for e in ex.list_files(".")}
    assert listed[f"loop-{token}"].is_link and listed[f"out-{token}"].is_link
    assert not listed[f"out-{token}"].is_dir  # never followed into the host folder
    for op in (
        lambda: ex.list_files(f"loop-{token}"),
        lambda: ex.read_file(f"loop-{token}"),
        lambda: ex.list_files(f"out-{token}"),
        lambda: ex.read_file(f"out-{token}/file"),
    ):
        with pytest.raises(InvalidPath):
            op()


# -- 7. bad input to the files API and a work dir taken away ---------------------------------------
_CHEAP = ("command", "docker-command")


@pytest.mark.parametrize("ex", planted(_CHEAP), indirect=True)
@pytest.mark.parametrize("name", ["a\x00b.txt", "a\nb.txt", "x" * 4096, "d/" + "x" * 300])
def test_bad_names_are_refused_by_the_files_api(ex: Any, name: str) -> None:
    before = sorted(p.name for p in ex.work_dir.iterdir())
    with pytest.raises(InvalidPath):
        ex.write_file(name, b"x")
    with pytest.raises(InvalidPath):
        ex.read_file(name)
    assert sorted(p.name for p in ex.work_dir.iterdir()) == before


@pytest.mark.parametrize("ex", planted(_CHEAP), indirect=True)
def test_a_2gb_write_file_is_refused_and_leaves_nothing(ex: Any) -> None:
    import mmap

    from kernelexec import FileTooLarge

    before = sorted(p.name for p in ex.work_dir.iterdir())
    with mmap.mmap(-1, 2 * 1024**3) as big:  # never touched, so never allocated
        view = memoryview(big)
        with pytest.raises(FileTooLarge):
            ex.write_file("big.bin", view)
        view.release()
    assert sorted(p.name for p in ex.work_dir.iterdir()) == before


@pytest.mark.parametrize("ex", planted(("command", "kernel")), indirect=True)
def test_a_work_dir_removed_by_the_code_is_said_then_made_again(ex: Any) -> None:
    from kernelexec import InvalidWorkDir

    r = ex.execute("import os, shutil\nwhere = os.getcwd()\nos.chdir('/')\nshutil.rmtree(where)\n")
    assert r.ok, r.output
    with pytest.raises((InvalidWorkDir, FileNotFoundError)) as info:
        ex.read_file("anything.txt")
    assert isinstance(info.value, (KernelExecError, FileNotFoundError))
    assert ex.execute("print('back')").output == "back\n"  # the next block makes it again
    ex.write_file("again.txt", b"ok")
    assert ex.read_file("again.txt") == b"ok"
