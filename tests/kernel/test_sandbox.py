"""Escape attempts against the bubblewrap-sandboxed back ends; each refused, executor usable.

Both back ends (``sandboxed-kernel``, ``sandboxed-command``) are driven through the registry, as
``--executor`` builds them. The host side of every check is looked at from the host.
"""

from __future__ import annotations

import os
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


@pytest.fixture(scope="module")
def secret_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("secrets")
    (folder / "key").write_text("TOP-SECRET")
    return folder


@pytest.fixture(scope="module", params=KINDS)
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
            request.param, work_dir=work, timeout=30, sandbox=options, env={"MINE": "given"}
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
        "try:\n    open('/tmp/fill', 'wb').write(b'x' * 64 * 1024 * 1024); print('FILLED')\n"
        "except OSError as e:\n    print('full:', e.strerror)\n",
    )
    assert "full: No space left on device" in out, out
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
