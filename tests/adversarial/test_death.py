"""The process running the block dies: ``os._exit``, a segfault, memory past the container limit."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import NothingLeft
from kx_adversarial import ALL, DOCKER, KERNELS, SLACK, backends

from kernelexec import make_executor

# After each case: nothing left running (a dead kernel's processes, a dead kernel's container).
pytestmark = pytest.mark.usefixtures("nothing_left")

# The pause lets "before" leave the process: a message still queued in a kernel that dies is
# sometimes lost with it (seen on the Docker kernel, about 1 run in 8: see the suite's report).
BEFORE = "import time\nprint('before', flush=True)\ntime.sleep(0.5)\n"
SEGFAULT = BEFORE + "import ctypes\nctypes.string_at(0)\n"


def _timed(ex: Any, code: str, timeout: float = 30) -> Any:
    started = time.monotonic()
    r = ex.execute(code, timeout=timeout)
    assert time.monotonic() - started < timeout + SLACK
    return r


def _check_kernel_died(ex: Any, r: Any) -> None:
    assert not r.ok and r.kernel_died and r.state_lost, r.output
    assert r.error is not None and r.error.ename == "KernelDied"
    assert "died" in r.output and "lost" in r.output, r.output
    assert _timed(ex, "print('kept' in dir())").output == "False\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_os_exit(backend: str, ex: Any) -> None:
    ex.execute("kept = 1")
    r = _timed(ex, BEFORE + "import os\nos._exit(3)\n")
    assert r.output.startswith("before\n"), r.output
    if backend in KERNELS:
        _check_kernel_died(ex, r)
    else:
        assert r.exit_code == 3 and r.error is not None, r.output
    assert _timed(ex, "print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_segfault_names_the_signal(backend: str, ex: Any) -> None:
    ex.execute("kept = 1")
    r = _timed(ex, SEGFAULT)
    assert r.output.startswith("before\n"), r.output
    assert "SIGSEGV" in r.output, r.output
    if backend in KERNELS:
        _check_kernel_died(ex, r)
    else:
        assert r.exit_code == 139 and r.error is not None
    assert _timed(ex, "print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(DOCKER), indirect=True)
def test_memory_past_the_container_limit(
    backend: str, tmp_path: Path, nothing_left: NothingLeft
) -> None:
    with make_executor(backend, work_dir=tmp_path, timeout=60, memory="256m") as ex:
        ex.execute("kept = 1")
        r = _timed(ex, BEFORE + "big = bytearray(1024 ** 3)\n", timeout=60)
        assert not r.ok and r.output.startswith("before\n"), r.output
        assert "out of memory" in r.output, r.output
        if backend in KERNELS:
            _check_kernel_died(ex, r)
        assert _timed(ex, "print('usable')").output == "usable\n"
        # The killed block left nothing in the container, nor an old container behind.
        nothing_left.check(also=(ex,))
