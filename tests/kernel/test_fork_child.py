"""A forked kernel's process is a kernel's, as a cold kernel's would be: its command line and
import path, its random seeds, the files a warm-up module opened, where its stdout goes, its
time zone, and an environment whose text never passes through the server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.connect import write_connection_file
from kx_fork import running, spare_of

from kernelexec import KernelExecutor, make_executor
from kernelexec.backends import fork_kernel


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work folder holding modules named as kernelexec's own backends are."""
    folder = tmp_path_factory.mktemp("fork-child")
    for name in ("base", "sandboxed"):
        (folder / f"{name}.py").write_text("WHO = 'the user'\n")
    return folder


@pytest.fixture(scope="module")
def ex(work: Path) -> Iterator[KernelExecutor]:
    with make_executor("fork-kernel", work_dir=work, timeout=30) as executor:
        assert isinstance(executor, KernelExecutor)
        yield executor


def _stop_servers(warm_up: Sequence[str]) -> None:
    """End this module's servers of ``warm_up`` (whatever else the server key holds)."""
    for key in [k for k in fork_kernel._servers if k[1] == tuple(warm_up)]:
        fork_kernel._servers.pop(key).stop()


def _pid(ex: KernelExecutor) -> int:
    return int(ex.execute("import os; os.getpid()").output)


def test_the_command_line_and_import_path_are_a_cold_kernels(
    ex: KernelExecutor, tmp_path: Path
) -> None:
    """The server script's folder (kernelexec's backends) was first on a forked kernel's
    sys.path, so a user's ``base.py`` imported kernelexec's; and sys.argv was the server's."""
    code = "import json, sys\nprint(json.dumps([sys.argv, sys.orig_argv, sys.path]))"
    with make_executor("kernel", work_dir=tmp_path, timeout=60) as cold:
        expected = json.loads(cold.execute(code).output)
    seen = json.loads(ex.execute(code).output)

    def general(argv: list[str]) -> list[str]:  # the connection file is each kernel's own
        at = argv.index("-f") + 1
        return [*argv[:at], "FILE", *argv[at + 1 :]]

    assert seen[2] == expected[2]
    assert general(seen[0]) == general(expected[0]) and general(seen[1]) == general(expected[1])
    assert "ipykernel_launcher" in seen[0][0]
    own = "from ipykernel.kernelapp import IPKernelApp\nIPKernelApp.instance().connection_file"
    assert ex.execute(own).output == repr(seen[0][2])
    mine = ex.execute("import base, sandboxed\nprint(base.WHO, sandboxed.WHO, base.__file__)")
    assert mine.output.split() == ["the", "user", "the", "user", str(ex.work_dir / "base.py")]


def test_a_warm_up_module_named_as_a_backend_is_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm-up ``base`` on PYTHONPATH: the server imports it, not kernelexec's ``base``."""
    (tmp_path / "base.py").write_text("WHO = 'warm'\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    warm_up = ["base"]
    try:
        with make_executor("fork-kernel", work_dir=tmp_path / "w", warm_up=warm_up) as ex:
            assert ex.execute("import sys; sys.modules['base'].WHO").output == "'warm'"
    finally:
        _stop_servers(warm_up)


def test_each_kernel_draws_its_own_numpy_random_numbers(tmp_path: Path) -> None:
    """numpy's legacy global generator was seeded when the server imported numpy.random: every
    forked kernel drew the same numbers. (``import numpy`` alone does not import it; pandas
    does.) Python's own ``random`` reseeds itself at a fork."""
    warm_up = ["numpy.random"]
    code = "import numpy as np, random\nprint(np.random.rand(), random.random())"
    draws = []
    try:
        for name in ("a", "b"):
            with make_executor(
                "fork-kernel", work_dir=tmp_path / name, timeout=30, warm_up=warm_up
            ) as ex:
                draws.append(ex.execute(code).output.split())
    finally:
        _stop_servers(warm_up)
    (np_a, py_a), (np_b, py_b) = draws
    assert np_a != np_b and py_a != py_b, draws


def test_a_file_a_warm_up_module_opened_stays_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm-up module that opens a file as it is imported: in every kernel (forked afresh or
    from the spare) the descriptor is still that file's. Closing every descriptor above 2 in
    the child let zmq reuse the number, and the module then read zmq's eventfd."""
    data = tmp_path / "data.txt"
    data.write_bytes(b"kept open by a warm-up module\n")
    (tmp_path / "kx_opens_file.py").write_text(f"F = open({str(data)!r}, 'rb', buffering=0)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    code = (
        "import os, kx_opens_file as m\n"
        "fd = m.F.fileno()\n"
        f"print(os.fstat(fd).st_ino == os.stat({str(data)!r}).st_ino,"
        f" os.pread(fd, 100, 0) == {data.read_bytes()!r})"
    )
    warm_up = ["kx_opens_file"]
    made: list[KernelExecutor] = []

    def kernel(name: str) -> KernelExecutor:
        ex = make_executor("fork-kernel", work_dir=tmp_path / name, timeout=30, warm_up=warm_up)
        assert isinstance(ex, KernelExecutor)
        made.append(ex)
        return ex

    try:
        a = kernel("a")
        first = _pid(a)
        server = int(a.execute("os.getppid()").output)
        spare = spare_of(server, {first})
        b = kernel("b")  # the spare becomes it
        assert _pid(b) == spare
        os.kill(spare_of(server, {first, spare}), signal.SIGKILL)
        c = kernel("c")  # the next spare is dead: a fresh fork
        assert _pid(c) not in {first, spare}
        assert [ex.execute(code).output.strip() for ex in made] == ["True True"] * 3
    finally:
        for ex in made:
            ex.close()
        _stop_servers(warm_up)


def test_a_flood_on_fd_1_does_not_fill_the_kernels_log(ex: KernelExecutor) -> None:
    """ipykernel echoes what a block's processes write to fd 1 to the kernel's own fd 1: as a
    local kernel's, it is /dev/null, not the log (fd 2, whose end a failed start quotes)."""
    flood = "import subprocess\nsubprocess.run('yes kx-flood | head -c 300000', shell=True)\nNone"
    assert ex.execute(flood).exit_code == 0
    log = ex.execute(
        "import os\nfrom ipykernel.kernelapp import IPKernelApp\n"
        "os.path.join(os.path.dirname(IPKernelApp.instance().connection_file), 'kernel.log')"
    ).output.strip("'")
    assert os.path.exists(log)
    assert os.path.getsize(log) < 10_000 and b"kx-flood" not in Path(log).read_bytes()
    assert ex.execute("import os; os.readlink('/proc/self/fd/0')").output == "'/dev/null'"


def test_the_kernels_time_zone_is_its_environments(tmp_path: Path) -> None:
    """TZ is read by the C library when the process starts: a forked kernel rereads it.
    (A POSIX zone string: no time zone database needed.)"""
    env = {"TZ": "KXT-9"}
    with make_executor("fork-kernel", work_dir=tmp_path, timeout=30, env=env) as ex:
        out = ex.execute("import time\nprint(*time.tzname, time.localtime().tm_gmtoff)").output
    assert out.split() == ["KXT", "KXT", "32400"], out


def test_the_environment_comes_from_a_file_the_kernel_deletes(tmp_path: Path) -> None:
    """The request names a file holding the kernel's environment (its text, a token, never
    passes through the server, whose freed memory every later kernel copies); the kernel reads
    it and deletes it. A request with the environment itself (an older host) still works."""
    setup = "import os, pathlib\npathlib.Path('seen').write_text(os.environ['KX_SECRET'])\n"

    def request(name: str, secret: str, *, in_file: bool) -> dict[str, Any]:
        folder = tmp_path / name
        folder.mkdir()
        connection_file = str(folder / "kernel.json")
        write_connection_file(connection_file, transport="ipc", ip=str(folder / "k"))
        env = dict(os.environ, KX_SECRET=secret)
        if in_file:
            (folder / "env.json").write_text(json.dumps(env))
        return {
            "connection_file": connection_file,
            "cwd": str(folder),
            "log": str(folder / "kernel.log"),
            "setup": setup,
            **({"env_file": str(folder / "env.json")} if in_file else {"env": env}),
        }

    server = subprocess.Popen(
        [sys.executable, str(fork_kernel._SERVER_SCRIPT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert server.stdin is not None and server.stdout is not None
    pids = []
    try:
        assert "ready" in json.loads(server.stdout.readline())
        for name, secret, in_file in (("file", "from a file", True), ("inline", "inline", False)):
            server.stdin.write(json.dumps(request(name, secret, in_file=in_file)) + "\n")
            server.stdin.flush()
            pids.append(int(json.loads(server.stdout.readline())["pid"]))
            seen = _appears(tmp_path / name / "seen", pids[-1])
            log = tmp_path / name / "kernel.log"
            assert seen == secret, log.read_text() if log.exists() else "no log"
        assert not (tmp_path / "file" / "env.json").exists()
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # (gone already)
                os.killpg(pid, signal.SIGKILL)
        server.stdin.close()
        server.wait(30)
        server.stdout.close()


def _appears(path: Path, pid: int, seconds: float = 30) -> str | None:
    """The text written at ``path`` by the kernel ``pid``; None if it ended without writing it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        if not running(pid):
            return path.read_text() if path.exists() else None
        time.sleep(0.02)
    return None
