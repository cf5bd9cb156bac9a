"""What a container holds against a block: no network, not root, read-only system paths, a fork
bomb, ``kill -9 1``, and none of the host's environment."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NothingLeft
from kx_adversarial import DOCKER, KERNELS, SLACK, backends

from kernelexec import make_executor

pytestmark = pytest.mark.usefixtures("nothing_left")

SECRET = "KXADV_HOST_SECRET"


@pytest.fixture(scope="module", autouse=True)
def host_secret() -> Iterator[None]:
    """A variable in the host's environment while this module's executors are built."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET, "do-not-leak")
        yield


@pytest.mark.parametrize("backend", backends(DOCKER), indirect=True)
def test_no_network(ex: Any) -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
        "    print('connected')\n"
        "except OSError:\n"
        "    print('no network')\n"
        "print(sorted(n for _, n in socket.if_nameindex()))\n"
    )
    assert ex.execute(code).output == "no network\n['lo']\n"


@pytest.mark.parametrize("backend", backends(DOCKER), indirect=True)
def test_not_root_and_system_paths_not_writable(ex: Any, token: str) -> None:
    code = (
        "import os\n"
        "print(os.getuid() != 0, os.geteuid() != 0)\n"
        f"for path in ['/etc/{token}', '/usr/lib/{token}', '/bin/{token}', '/root/{token}']:\n"
        "    try:\n"
        "        open(path, 'w').close()\n"
        "        print(path, 'written')\n"
        "    except OSError as exc:\n"
        "        print('refused')\n"
    )
    r = ex.execute(code)
    assert r.output == "True True\n" + "refused\n" * 4, r.output


@pytest.mark.parametrize("backend", backends(DOCKER), indirect=True)
def test_host_environment_not_leaked(ex: Any) -> None:
    r = ex.execute(f"import os\nprint(os.environ.get({SECRET!r}, 'absent'))")
    assert r.output == "absent\n"
    r = ex.execute(f"echo ${{{SECRET}:-absent}}", "shell")
    assert r.output == "absent\n"


@pytest.mark.parametrize("backend", backends(DOCKER), indirect=True)
def test_kill_9_pid_1(backend: str, ex: Any) -> None:
    ex.execute("kept = 'yes'")
    r = ex.execute("import os, signal\nos.kill(1, signal.SIGKILL)\nprint('sent')")
    assert "sent" in r.output, r.output
    if backend in KERNELS:
        assert ex.execute("print(kept)").output == "yes\n"
    r = ex.execute("kill -9 1; echo sent", "shell")
    assert "sent" in r.output, r.output
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(DOCKER), indirect=True)
def test_fork_bomb(backend: str, tmp_path: Path, nothing_left: NothingLeft) -> None:
    with make_executor(backend, work_dir=tmp_path, timeout=30) as ex:
        ex.execute("kept = 'yes'")
        started = time.monotonic()
        r = ex.execute(":(){ :|:& };:", "shell", timeout=5)
        assert time.monotonic() - started < 5 + SLACK
        if backend in KERNELS:
            # The kernel waits for the bomb's output to end, which it never does: every time.
            assert r.timed_out and r.exit_code == 124 and not r.state_lost, r.output
            assert ex.execute("print(kept)").output == "yes\n"
        else:
            # The block ends with the bomb's first shell, which returns at once, and its wrapper
            # kills the rest; now and then a process forked during that kill holds the output
            # open and the block times out instead (1 run in 12 measured): both are clean.
            assert r.exit_code == 0 or r.timed_out, r.output
        # The bomb is gone, not paused: the container holds only its own processes (docker
        # top, from the engine) ...
        nothing_left.check(also=(ex,))
        # ... and blocks that need processes work again.
        r = ex.execute("bash -c 'echo child'; echo done", "shell", timeout=20)
        assert (r.exit_code, r.output) == (0, "child\ndone\n"), r.output
