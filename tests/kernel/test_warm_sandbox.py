"""``warm-command`` with ``sandbox=True``: the warm spawner lives in a bubblewrap sandbox, so
every block forked from it is sandboxed; the blocks share that sandbox, so nothing one leaves in
it (a process, a file in the private /tmp or /dev/shm, a System V segment) may reach the next.

The escape attempts shared with the other sandboxed back ends (host writes, hidden paths, no
network, host processes) run against it in ``test_sandbox.py``; this file holds what is its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_close import check_stopped_by_close, close_during_block, host_processes_with, unique_seconds
from kx_sandbox import sandbox_unavailable

from kernelexec import make_executor


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("warm-sandbox")
    with make_executor(
        "warm-command", work_dir=work, timeout=30, sandbox=True, warm_up=("numpy",)
    ) as executor:
        yield executor


def run(ex: Any, code: str) -> str:
    r = ex.execute(code)
    assert r.exit_code == 0, r.output
    return str(r.output)


def test_blocks_are_sandboxed_and_warm(warm: Any) -> None:
    out = run(
        warm,
        "import os, sys\n"
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
        "print(os.getuid(), caps[0], 'numpy' in sys.modules)\n"
        "try:\n    open('/etc/kx-warm-escape', 'w')\nexcept OSError as e:\n    print(e.strerror)\n",
    )
    assert out == "1000 0000000000000000 True\nRead-only file system\n", out
    assert not Path("/etc/kx-warm-escape").exists()


def test_the_spawner_is_not_root_on_the_host(warm: Any) -> None:
    """Seen from the host: every process under bwrap that is not bwrap's (the spawner, the
    spare) runs as the unprivileged user when the host is root, never as root."""
    tree = _descendants(warm.backend.pid)
    pythons = [p for p in tree if _cmdline(p).split("\0")[0] == warm.backend.python]
    assert pythons, "the spawner is not among bwrap's descendants"
    for pid in pythons:
        uids = _status(pid, "Uid").split()
        assert "0" not in uids, (pid, uids)


def test_nothing_left_in_the_sandbox_reaches_the_next_block(warm: Any) -> None:
    marker = f"kx-warm-left-{os.getpid()}-{time.monotonic_ns()}"
    out = run(
        warm,
        "import subprocess\n"
        f"subprocess.Popen(['bash', '-c', 'exec -a {marker} sleep 300'], start_new_session=True)\n"
        f"open('/tmp/{marker}', 'w').write('x'); open('/dev/shm/{marker}', 'w').write('x')\n"
        "import ctypes; libc = ctypes.CDLL(None)\n"
        "print(libc.shmget(0x4B58, 4096, 0o1666) >= 0)\n",  # IPC_CREAT | 0666
    )
    assert out == "True\n"
    out = run(
        warm,
        "import os, ctypes\n"
        f"print(os.path.exists('/tmp/{marker}'), os.path.exists('/dev/shm/{marker}'))\n"
        "print(ctypes.CDLL(None).shmget(0x4B58, 4096, 0o666))\n"
        "mine = [p for p in os.listdir('/proc') if p.isdigit()\n"
        f"        and b'{marker}' in open(f'/proc/{{p}}/cmdline', 'rb').read()]\n"
        "print(mine)\n",
    )
    assert out == "False False\n-1\n[]\n", out
    assert host_processes_with(marker) == []
    # the work dir (bound into the sandbox) is the executor's, as the command executor has it
    assert run(warm, "open('kept.txt', 'w').write('1')") == ""
    assert run(warm, "print(open('kept.txt').read())") == "1\n"


def test_a_block_cannot_trace_the_spawner(warm: Any) -> None:
    """Same user as the spawner and the spare: without PR_SET_DUMPABLE 0 a block could write
    into them, and so into every later block."""
    out = run(
        warm,
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.ptrace(16, os.getppid(), None, None)  # PTRACE_ATTACH\n"
        "print(rc, os.strerror(ctypes.get_errno()))\n"
        "try:\n    open(f'/proc/{os.getppid()}/mem', 'rb'); print('READ')\n"
        "except OSError as e:\n    print(e.strerror)\n"
        "print(libc.ptrace(0, 0, None, None))  # PTRACE_TRACEME: a block is traceable itself\n",
    )
    assert out == "-1 Operation not permitted\nPermission denied\n0\n", out


def test_a_timeout_kills_the_block_inside_the_sandbox(warm: Any) -> None:
    seconds = unique_seconds()
    started = time.monotonic()
    r = warm.execute(f"import subprocess\nsubprocess.run(['sleep', '{seconds}'])", timeout=1)
    assert r.timed_out and time.monotonic() - started < 15
    assert host_processes_with(f"sleep\0{seconds}") == []
    assert run(warm, "print('after')") == "after\n"


def test_close_during_a_block_leaves_nothing(tmp_path: Path) -> None:
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    seconds = unique_seconds()
    ex = make_executor("warm-command", work_dir=tmp_path, sandbox=True, warm_up=())
    spawner = ex.backend.pid
    took, result = close_during_block(ex, seconds)
    check_stopped_by_close(took, result)
    assert host_processes_with(f"sleep\0{seconds}") == []
    assert not os.path.exists(f"/proc/{spawner}")


def _descendants(root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _status(pid: int, field: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1]
    return ""


def test_the_cli_flag_sandboxes_warm_command() -> None:
    """``--sandbox`` with ``--executor warm-command`` asks for the sandbox option (the other
    local back ends turn into their sandboxed twins)."""
    from kernelexec.cli import build_parser, executor_flags

    args = build_parser().parse_args(["run", "x.py", "--executor", "warm-command", "--sandbox"])
    name, flags = executor_flags(args)
    assert (name, flags.get("sandbox")) == ("warm-command", True)
