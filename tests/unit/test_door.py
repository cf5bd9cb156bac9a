"""The work dir's door (``kernelexec/_door.py``): no link followed at any component, only regular
files read, new files made with ``O_EXCL`` and renamed into place, bad names refused, every
refusal an error from the tree at once, nothing written outside and nothing left behind."""

from __future__ import annotations

import errno
import mmap
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelexec import FileTooLarge, InvalidPath, InvalidWorkDir, UnsafePath
from kernelexec._door import Door, read_regular
from kernelexec._files import LocalFiles
from kernelexec.backends.local_kernel import log_end

pytestmark = pytest.mark.unit

SECRET = b"host secret"


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A folder outside the work dir holding a host file: it must never change."""
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "file").write_bytes(SECRET)
    return folder


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


@pytest.fixture
def door(work: Path) -> Iterator[Door]:
    with Door(work) as d:
        yield d


def untouched(host: Path) -> None:
    assert sorted(p.name for p in host.iterdir()) == ["file"]
    assert (host / "file").read_bytes() == SECRET


def no_temp_left(work: Path) -> None:
    left = [p for p in work.rglob("*") if p.name.endswith(".kx-partial")]
    assert left == [], left


# -- links at every component ------------------------------------------------------------------
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_link_at_the_final_name_is_replaced_not_written_through(
    door: Door, work: Path, host: Path, depth: int
) -> None:
    folder = work.joinpath(*["d"] * depth)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.csv").symlink_to(host / "file")
    rel = "/".join([*["d"] * depth, "data.csv"])
    door.write_bytes(rel, b"new")
    untouched(host)
    assert not (folder / "data.csv").is_symlink()
    assert (folder / "data.csv").read_bytes() == b"new"
    no_temp_left(work)


@pytest.mark.parametrize("where", ["a", "a/b", "a/b/c"])
def test_a_link_at_any_folder_on_the_way_is_refused(
    door: Door, work: Path, host: Path, where: str
) -> None:
    parts = where.split("/")
    work.joinpath(*parts[:-1]).mkdir(parents=True, exist_ok=True)
    work.joinpath(*parts).symlink_to(host, target_is_directory=True)
    rel = f"{where}/file"
    with pytest.raises(UnsafePath, match="symbolic link"):
        door.write_bytes(rel, b"x")
    with pytest.raises(UnsafePath, match="symbolic link"):
        door.read_bytes(rel)
    with pytest.raises(UnsafePath):
        door.scandir(where)
    with pytest.raises(UnsafePath):
        door.makedirs(f"{where}/sub")
    with pytest.raises(UnsafePath):
        door.unlink(rel)
    untouched(host)


def test_a_link_inside_the_work_dir_is_not_followed_either(door: Door, work: Path) -> None:
    (work / "real").mkdir()
    (work / "real" / "f").write_bytes(b"in")
    (work / "alias").symlink_to(work / "real", target_is_directory=True)
    (work / "f-link").symlink_to(work / "real" / "f")
    with pytest.raises(UnsafePath):
        door.read_bytes("alias/f")
    with pytest.raises(UnsafePath, match="symbolic link, not a regular file"):
        door.read_bytes("f-link")


def test_a_planted_temp_name_is_never_opened(door: Door, work: Path, host: Path) -> None:
    # The old fixed name of the files API; the door's names are random and made with O_EXCL.
    (work / ".data.csv.kx-partial").symlink_to(host / "file")
    door.write_bytes("data.csv", b"mine")
    untouched(host)
    assert (work / "data.csv").read_bytes() == b"mine"


def test_create_replaces_a_planted_link_at_once(door: Door, work: Path, host: Path) -> None:
    (work / "out").mkdir()
    (work / "out" / "block-1.txt").symlink_to(host / "file")
    with door.create_text("out/block-1.txt") as f:
        f.write("spilled")
    untouched(host)
    assert (work / "out" / "block-1.txt").read_text() == "spilled"


# -- special files ----------------------------------------------------------------------------
def _special(work: Path, kind: str) -> str:
    if kind == "fifo":
        os.mkfifo(work / "special")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(work / "special"))
        sock.close()
    elif kind == "device-link":
        (work / "special").symlink_to("/dev/null")
    elif kind == "device":
        if os.getuid() != 0:
            pytest.skip("mknod needs root")
        os.mknod(work / "special", 0o600 | 0o020000, os.makedev(1, 3))  # a /dev/null
    return "special"


@pytest.mark.parametrize("kind", ["fifo", "socket", "device-link", "device"])
def test_only_regular_files_are_read_and_at_once(door: Door, work: Path, kind: str) -> None:
    name = _special(work, kind)
    started = time.monotonic()
    with pytest.raises(UnsafePath, match="not a regular file"):
        door.read_bytes(name)
    with pytest.raises(UnsafePath), door.open_regular(name):
        pass
    assert read_regular(work / name, limit=100) is None
    assert read_regular(work / name, limit=100, tail=True) is None
    assert log_end(str(work / name)) == ""  # a forked sandboxed kernel's log: enemy ground
    assert time.monotonic() - started < 2  # never waited on a writer


def test_a_logs_end_is_read_from_a_regular_file_only(work: Path, tmp_path: Path) -> None:
    (work / "kernel.log").write_bytes(b"x" * 5000 + b"the end\n")
    assert log_end(str(work / "kernel.log"), limit=8) == "the end"
    assert read_regular(work / "kernel.log", limit=8, tail=True) == b"the end\n"
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    (work / "linked.log").symlink_to(secret)  # the error would quote a host file
    assert log_end(str(work / "linked.log")) == ""


def test_a_fifo_is_not_opened_even_by_the_files_api(work: Path) -> None:
    import asyncio

    os.mkfifo(work / "result.csv")
    store = LocalFiles(work)
    box: list[BaseException] = []

    def read() -> None:
        try:
            asyncio.run(store.read("result.csv"))
        except BaseException as exc:
            box.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "read_file blocked on a FIFO"
    assert isinstance(box[0], UnsafePath)


def test_a_file_that_grows_is_read_to_its_size_when_opened(door: Door, work: Path) -> None:
    (work / "log").write_bytes(b"12345")
    with door.open_regular("log") as (_handle, size):
        with open(work / "log", "ab") as more:
            more.write(b"678")
        assert size == 5
    assert door.read_bytes("log", head=3) == b"123"


# -- loops and listings -------------------------------------------------------------------------
def test_links_are_listed_as_links_loops_included(door: Door, work: Path, host: Path) -> None:
    (work / "loop").symlink_to("loop")
    (work / "a").symlink_to("b")
    (work / "b").symlink_to("a")
    (work / "out").symlink_to(host, target_is_directory=True)
    (work / "sub").mkdir()
    (work / "sub" / "f").write_bytes(b"1")
    listed = {e.name: e for e in door.scandir()}
    assert {n for n, e in listed.items() if e.is_link} == {"loop", "a", "b", "out"}
    walked = [rel for rel, _ in door.walk()]
    assert sorted(walked) == ["a", "b", "loop", "out", "sub", "sub/f"]  # never into "out"
    with pytest.raises(UnsafePath):
        door.read_bytes("loop")
    with pytest.raises(UnsafePath):
        door.read_bytes("loop/x")


def test_list_files_shows_a_loop_as_a_link(work: Path) -> None:
    import asyncio

    (work / "loop").symlink_to("loop")
    (work / "x.txt").write_text("x")
    entries = asyncio.run(LocalFiles(work).listing("."))
    by_path = {e.path: e for e in entries}
    assert by_path["loop"].is_link and not by_path["loop"].is_dir
    assert not by_path["x.txt"].is_link


# -- bad names ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("a\x00b", "control"),
        ("a\nb", "control"),
        ("x" * 4096, "4095-byte limit"),
        ("x" * 256, "past 255 bytes"),
        ("/".join(["d"] * 2100), "4095-byte limit"),
        ("../out", "escapes"),
        ("a/../../out", "escapes"),
        ("/etc/passwd", "not inside the work dir"),
        ("", "invalid"),
        (".", "work dir itself"),
    ],
)
def test_bad_names_are_refused_before_anything_is_touched(
    door: Door, work: Path, name: str, match: str
) -> None:
    for op in (lambda: door.write_bytes(name, b"x"), lambda: door.read_bytes(name)):
        with pytest.raises(InvalidPath, match=match):
            op()
    assert list(work.iterdir()) == []


# -- the work dir itself ------------------------------------------------------------------------
def test_a_work_dir_that_is_a_link_is_pinned_when_first_used(tmp_path: Path, host: Path) -> None:
    real, other = tmp_path / "real", tmp_path / "other"
    real.mkdir()
    other.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with Door(link) as d:
        d.write_bytes("a", b"1")
        link.unlink()  # swapped to point elsewhere (at a host folder) afterwards
        link.symlink_to(host, target_is_directory=True)
        d.write_bytes("b", b"2")
    assert sorted(p.name for p in real.iterdir()) == ["a", "b"]
    untouched(host)


def test_a_removed_work_dir_is_a_clear_error(tmp_path: Path) -> None:
    work = tmp_path / "gone"
    work.mkdir()
    d = Door(work)
    d.write_bytes("a", b"1")
    for p in work.iterdir():
        p.unlink()
    work.rmdir()
    with pytest.raises(InvalidWorkDir, match="does not exist"):
        d.write_bytes("a", b"1")
    with pytest.raises(InvalidWorkDir):
        d.read_bytes("a")
    assert not work.exists()
    work.mkdir()  # made again (a kernel executor does so before the next block): used again
    d.write_bytes("a", b"2")
    assert (work / "a").read_bytes() == b"2"
    d.close()


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A read-only tmpfs (root only: these machines run the suite as root)."""
    if os.getuid() != 0:
        pytest.skip("mounting a file system needs root")
    where = tmp_path / "ro"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_read_only_work_dir_is_a_clear_error(read_only: Path) -> None:
    with Door(read_only) as d:
        with pytest.raises(InvalidWorkDir, match="read-only"):
            d.write_bytes("a", b"1")
        with pytest.raises(InvalidWorkDir, match="read-only"):
            d.makedirs("sub")
        with pytest.raises(FileNotFoundError):
            d.read_bytes("a")
    assert list(read_only.iterdir()) == []


# -- sizes --------------------------------------------------------------------------------------
def test_a_2gb_write_is_refused_by_the_limit_before_any_copy(door: Door, work: Path) -> None:
    # An anonymous mapping: 2 GB the test never touches (so never allocates).
    with mmap.mmap(-1, 2 * 1024**3) as big:
        view = memoryview(big)
        with pytest.raises(FileTooLarge, match="past the"):
            door.write_bytes("big.bin", view, limit=1024**3)
        view.release()
    assert list(work.iterdir()) == []


def test_a_failed_write_leaves_nothing_behind(door: Door, work: Path) -> None:
    (work / "taken").mkdir()
    with pytest.raises(IsADirectoryError):
        door.write_bytes("taken", b"x")
    with pytest.raises(RuntimeError), door.replacing("half.bin") as f:
        f.write(b"half")
        raise RuntimeError("writer failed")
    assert sorted(p.name for p in work.iterdir()) == ["taken"]
    assert list((work / "taken").iterdir()) == []


def test_a_read_past_the_limit_is_refused(door: Door, work: Path) -> None:
    (work / "big").write_bytes(b"x" * 100)
    with pytest.raises(FileTooLarge):
        door.read_bytes("big", limit=99)
    assert door.read_bytes("big", limit=100) == b"x" * 100


def test_chown_changes_the_entry_never_a_link_target(door: Door, work: Path, host: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("chown needs root")
    (work / "st").symlink_to(host, target_is_directory=True)
    before = host.stat()
    with pytest.raises(UnsafePath):
        door.chown("st/file", 1000, 1000)
    door.chown("st", 1000, 1000)  # the link itself
    after = host.stat()
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)


def test_errors_keep_their_built_in_kinds(door: Door, work: Path) -> None:
    (work / "d").mkdir()
    with pytest.raises(FileNotFoundError):
        door.read_bytes("missing")
    with pytest.raises(IsADirectoryError):
        door.read_bytes("d")
    (work / "f").write_bytes(b"")
    with pytest.raises(NotADirectoryError) as info:
        door.read_bytes("f/x")
    assert info.value.errno == errno.ENOTDIR


def test_links_in_kernelexecs_own_folder_are_removed_when_it_makes_one(
    door: Door, work: Path, host: Path
) -> None:
    (work / ".kernelexec").symlink_to(host, target_is_directory=True)
    door.write_bytes(".kernelexec/code/a.py", b"print(1)")
    assert (work / ".kernelexec").is_dir() and not (work / ".kernelexec").is_symlink()
    (work / ".kernelexec" / "output").symlink_to(host, target_is_directory=True)
    with door.create_text(".kernelexec/output/block-1.txt") as f:
        f.write("spill")
    assert (work / ".kernelexec" / "output" / "block-1.txt").read_text() == "spill"
    untouched(host)
    with pytest.raises(UnsafePath):  # reading never removes anything
        (work / ".kernelexec" / "x").symlink_to(host, target_is_directory=True)
        door.read_bytes(".kernelexec/x/file")
    assert (work / ".kernelexec" / "x").is_symlink()


def test_a_notebook_in_the_work_dir_is_written_through_the_door(work: Path, host: Path) -> None:
    from kernelexec import NotebookError
    from kernelexec._session import write_text_atomic

    (work / "nb").symlink_to(host, target_is_directory=True)
    (work / "s.ipynb").symlink_to(host / "file")
    with Door(work) as d:
        with pytest.raises(NotebookError, match="symbolic link"):
            write_text_atomic("{}", work / "nb" / "s.ipynb", door=d)
        write_text_atomic("{}", work / "s.ipynb", door=d)  # the link itself is replaced
    assert (work / "s.ipynb").read_text() == "{}" and not (work / "s.ipynb").is_symlink()
    untouched(host)


# -- 30, left open (b): a work dir that is itself a link -----------------------------------------
def test_a_link_put_in_place_of_a_removed_work_dir_is_refused(tmp_path: Path, host: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with Door(work) as d:
        d.write_bytes("a", b"1")
        (work / "a").unlink()
        work.rmdir()
        work.symlink_to(host, target_is_directory=True)  # the removed work dir, now a link
        with pytest.raises(UnsafePath, match="symbolic link put in its place"):
            d.write_bytes("evil", b"2")
        with pytest.raises(UnsafePath):
            d.write_bytes("evil", b"2")  # and on every later try
    untouched(host)


def test_an_executor_resolves_a_work_dir_link_once(tmp_path: Path, host: Path) -> None:
    """The work dir named through a link: resolved when the executor is made; blocks, the
    files API and result paths keep using that folder when the link is pointed elsewhere."""
    from kernelexec import make_executor

    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with make_executor("command", work_dir=link, timeout=30) as ex:
        assert ex.work_dir == real.resolve()
        link.unlink()
        link.symlink_to(host, target_is_directory=True)
        r = ex.execute("open('made.txt', 'w').write('block')")
        assert r.ok, r.output
        ex.write_file("api.txt", b"api")
        assert r.files == [real.resolve() / "made.txt"]
    assert (real / "made.txt").read_text() == "block" and (real / "api.txt").exists()
    untouched(host)


@pytest.mark.parametrize("target", ["missing", "loop"])
def test_a_work_dir_link_to_nothing_is_a_clear_error(tmp_path: Path, target: str) -> None:
    from kernelexec import make_executor

    link = tmp_path / "link"
    link.symlink_to(tmp_path / ("missing" if target == "missing" else "link"))
    with pytest.raises(InvalidWorkDir, match="is a symbolic link"):
        make_executor("command", work_dir=link)
    assert not (tmp_path / "missing").exists()
