"""Escape attempts against the bubblewrap-sandboxed back ends; each refused, executor usable.

Both back ends (``sandboxed-kernel``, ``sandboxed-command``) are driven through the registry, as
``--executor`` builds them. The host side of every check is looked at from the host.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_close import check_stopped_by_close, close_during_block, host_processes_with, unique_seconds
from kx_sandbox import sandbox_unavailable

from kernelexec import BackendUnavailable, make_executor
from kernelexec.backends._sandbox import SandboxOptions

KINDS = ["sandboxed-kernel", "sandboxed-command"]
#: the escape attempts run against these; warm-command is sandboxed by its sandbox= option
ATTACKED = [*KINDS, "warm-command"]
OPTIONS: dict[str, dict[str, Any]] = {"warm-command": {"warm_up": ("numpy",)}}  # quick to start


@pytest.fixture(scope="module")
def secret_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("secrets")
    (folder / "key").write_text("TOP-SECRET")
    return folder


@pytest.fixture(scope="module", params=ATTACKED)
def ex(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, secret_dir: Path
) -> Iterator[Any]:
    reason = sandbox_unavailable()
    if reason is not None:
        pytest.skip(reason)
    os.environ["KX_HOST_SECRET"] = "do-not-leak"
    try:
        options = SandboxOptions(hide=[str(secret_dir)], tmp_size=32 * 1024 * 1024)
        work = tmp_path_factory.mktemp(request.param)
        with make_executor(
            request.param,
            work_dir=work,
            timeout=30,
            sandbox=options,
            env={"MINE": "given"},
            **OPTIONS.get(request.param, {}),
        ) as executor:
            yield executor
    finally:
        del os.environ["KX_HOST_SECRET"]


def run(ex: Any, code: str) -> str:
    r = ex.execute(code)
    assert r.exit_code == 0, r.output
    return str(r.output)


def test_the_work_dir_is_writable_and_nothing_else(ex: Any, tmp_path: Path) -> None:
    out = run(
        ex,
        "import os\nopen('inside.txt', 'w').write('ok')\n"
        f"for p in ['/etc/kx-escape', os.path.expanduser('~root/kx-escape'), "
        f"{str(tmp_path / 'kx-escape')!r}, '/usr/kx-escape']:\n"
        "    try:\n        open(p, 'w').write('x'); print('WROTE', p)\n"
        "    except OSError as e:\n        print('refused', e.strerror)\n",
    )
    assert "WROTE" not in out and out.count("refused") == 4, out
    assert (ex.work_dir / "inside.txt").read_text() == "ok"
    assert not (tmp_path / "kx-escape").exists() and not Path("/etc/kx-escape").exists()


def test_the_private_tmp_is_private_and_bounded(ex: Any) -> None:
    marker = f"kx-tmp-{os.getpid()}-{time.monotonic_ns()}"
    out = run(
        ex,
        f"open('/tmp/{marker}', 'w').write('x')\n"
        "for fill in ['/tmp/fill', '/dev/shm/fill']:\n"
        "    try:\n        open(fill, 'wb').write(b'x' * 64 * 1024 * 1024); print('FILLED')\n"
        "    except OSError as e:\n        print('full:', e.strerror)\n",
    )
    assert out.count("full: No space left on device") == 2, out
    assert not Path(f"/tmp/{marker}").exists()
    assert run(ex, "print('still here')") == "still here\n"


def test_hidden_paths_and_host_environment_are_not_seen(ex: Any, secret_dir: Path) -> None:
    out = run(
        ex,
        "import os\n"
        f"print(os.listdir({str(secret_dir)!r}))\n"
        "print(os.environ.get('KX_HOST_SECRET'), os.environ.get('MINE'))\n",
    )
    assert out == "[]\nNone given\n", out


def test_no_network_not_even_the_hosts_loopback(ex: Any) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        out = run(
            ex,
            "import socket\n"
            f"for addr in [('1.1.1.1', 80), ('127.0.0.1', {port})]:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=2); print('CONNECTED', addr)\n"
            "    except OSError as e:\n        print('BLOCKED', e.strerror)\n",
        )
    assert "CONNECTED" not in out and out.count("BLOCKED") == 2, out


def test_host_processes_cannot_be_seen_signalled_or_traced(ex: Any) -> None:
    host = os.getpid()
    out = run(
        ex,
        "import ctypes, os, signal\n"
        f"try:\n    os.kill({host}, signal.SIGTERM); print('SIGNALLED')\n"
        "except ProcessLookupError:\n    print('no such process')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"rc = libc.ptrace(16, {host}, None, None)  # PTRACE_ATTACH\n"
        "print('ptrace', rc, os.strerror(ctypes.get_errno()))\n"
        "print(len([p for p in os.listdir('/proc') if p.isdigit()]) < 20)\n",
    )
    assert out.startswith("no such process\nptrace -1 No such process\nTrue"), out


def test_a_detached_child_does_not_outlive_the_sandbox(tmp_path: Path) -> None:
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    marker = f"kx-sandbox-child-{time.monotonic_ns()}"
    code = (
        "import subprocess\n"
        f"subprocess.Popen(['bash', '-c', 'exec -a {marker} sleep 300'], start_new_session=True)\n"
        "print('started')\n"
    )
    for kind in KINDS:
        ex = make_executor(kind, work_dir=tmp_path / kind, timeout=30)
        assert run(ex, code) == "started\n"
        ex.close()
        assert _gone(marker), f"{kind}: {marker} still running after close()"


def test_close_from_another_thread_stops_a_running_sandboxed_command(tmp_path: Path) -> None:
    """close() waited for the running block to end (issue 31.7): it kills the sandbox now."""
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    seconds = unique_seconds()
    ex = make_executor("sandboxed-command", work_dir=tmp_path)
    took, result = close_during_block(ex, seconds)
    check_stopped_by_close(took, result)
    assert host_processes_with(f"sleep\0{seconds}") == []


def test_missing_bubblewrap_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    for kind in KINDS:
        with pytest.raises(BackendUnavailable, match="apt install bubblewrap"):
            make_executor(kind, work_dir=tmp_path / kind)


def _gone(marker: str, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(marker.encode() in _cmdline(pid) for pid in os.listdir("/proc")):
            return True
        time.sleep(0.05)
    return False


def _cmdline(pid: str) -> bytes:
    if not pid.isdigit():
        return b""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_an_interpreter_under_tmp_stays_visible_read_only(tmp_path: Path) -> None:
    """A virtualenv in /tmp (CI's fresh venv, a user's scratch env) would vanish under the
    sandbox's private /tmp: its root is bound back, read-only."""
    from kernelexec.backends._sandbox import bwrap_argv

    reason = sandbox_unavailable()
    if reason is not None:
        pytest.skip(reason)  # bwrap_argv names the bwrap binary it found

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("")
    argv = bwrap_argv(SandboxOptions(), [str(python), "x.py"], work_dir=tmp_path, env={})
    pairs = [argv[i : i + 3] for i in range(len(argv) - 2)]
    assert ["--ro-bind", str(venv), str(venv)] in pairs
    # after the private /tmp, or it would be hidden again
    assert argv.index(str(venv)) > argv.index("/tmp", argv.index("--tmpfs"))


ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0, reason="the host runs as root here only")


@ROOT_ONLY
def test_without_setpriv_the_host_interpreter_drops_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """setpriv (util-linux) is missing on some hosts: the host's own interpreter becomes the
    unprivileged user instead, with the same result."""
    from kernelexec.backends import _sandbox

    if reason := sandbox_unavailable():
        pytest.skip(reason)
    monkeypatch.setattr(_sandbox, "_setpriv", lambda: None)
    code = (
        "import os\n"
        "caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
        "print(os.getuid(), os.getgid(), caps[0].split()[1])\n"
    )
    with make_executor("sandboxed-command", work_dir=tmp_path, timeout=30) as ex:
        assert "setpriv" not in " ".join(_sandbox._drop_privileges(_sandbox.SandboxOptions()))
        assert run(ex, code) == "1000 1000 0000000000000000\n"
        assert (tmp_path / ".kernelexec").stat().st_uid == 0  # kernelexec's own stays root's
        assert tmp_path.stat().st_uid == _sandbox.NOBODY  # the work dir is the sandbox's


def test_readable_shows_a_path_under_a_hidden_place(tmp_path: Path) -> None:
    """Homes are hidden; ``readable=`` shows one folder of one, read-only."""
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    shared = Path("/home") / f"kx-readable-{os.getpid()}-{time.monotonic_ns()}"
    (shared / "data").mkdir(parents=True)
    (shared / "data" / "x.csv").write_text("1,2\n")
    (shared / "secret").write_text("no")
    try:
        options = SandboxOptions(readable=[str(shared / "data")])
        code = (
            f"print(open({str(shared / 'data' / 'x.csv')!r}).read().strip())\n"
            f"print(sorted(__import__('os').listdir({str(shared)!r})))\n"
            f"try:\n    open({str(shared / 'data' / 'y')!r}, 'w')\n"
            "except OSError as e:\n    print(e.strerror)\n"
        )
        with make_executor(
            "sandboxed-command", work_dir=tmp_path, timeout=30, sandbox=options
        ) as ex:
            assert run(ex, code) == "1,2\n['data']\nRead-only file system\n"
    finally:
        shutil.rmtree(shared)


@ROOT_ONLY
def test_a_work_dir_the_sandbox_cannot_own_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A file system without owners (vfat) or a root-squashed NFS refuses the chown (mocked
    here): the back end says so, in kernelexec's own terms."""
    from kernelexec.backends import _sandbox

    if reason := sandbox_unavailable():
        pytest.skip(reason)

    def refuse(*args: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(_sandbox.os, "chown", refuse)
    with pytest.raises(BackendUnavailable, match=r"cannot give .* to the sandbox's user 65534"):
        _sandbox.give_to_sandbox(tmp_path, SandboxOptions())


def test_a_host_not_root_runs_one_bwrap_as_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not root, the host has no right to drop: one bwrap, in a user namespace where bwrap can
    make one (the sandbox's uid is the host user's, so bwrap keeps no capability)."""
    from kernelexec.backends import _sandbox

    if reason := sandbox_unavailable():
        pytest.skip(reason)
    monkeypatch.setattr(_sandbox, "host_is_root", lambda: False)
    argv = _sandbox.bwrap_argv(SandboxOptions(), ["python", "x.py"], work_dir=tmp_path, env={})
    assert argv.count(argv[0]) == 1 and "--unshare-all" in argv
    assert not any("setpriv" in a for a in argv) and argv[-2:] == ["python", "x.py"]
    for hidden in ("/root", "/run"):
        assert argv[argv.index(hidden) - 1] == "--tmpfs"


def test_a_virtualenv_under_a_hidden_home_still_runs(tmp_path: Path) -> None:
    """Homes are hidden (CI's checkout may live in /root or /home/runner): the interpreter's
    virtualenv, and the installation behind it, are bound back read-only, nothing else."""
    import subprocess
    import sys

    if reason := sandbox_unavailable():
        pytest.skip(reason)
    venv = Path("/home") / f"kx-venv-{os.getpid()}-{time.monotonic_ns()}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    try:
        code = "import os, sys\nprint(sys.prefix)\nprint(os.listdir('/home'))\n"
        with make_executor(
            "sandboxed-command", work_dir=tmp_path, timeout=30, python=str(venv)
        ) as ex:
            assert run(ex, code) == f"{venv}\n{[venv.name]}\n"
    finally:
        shutil.rmtree(venv)
