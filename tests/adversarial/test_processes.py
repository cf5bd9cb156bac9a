"""Processes a block starts that ignore SIGTERM, SIGINT and SIGHUP: in the block's session, in a
new session, or double-forked (orphaned). None may outlive what owns it: a stateless block when it
ends, any block when it times out, a kernel when it is restarted or closed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kx_adversarial import (
    ALL,
    COMMANDS,
    KERNELS,
    SLACK,
    SPAWNERS,
    backends,
    pairs,
    processes_with,
    spawn_code,
    wait_gone,
    wait_started,
)

from kernelexec import make_executor


def _spawn(ex: Any, how: str, token: str, extra: str = "", timeout: float = 30) -> Any:
    started = time.monotonic()
    r = ex.execute(
        spawn_code(how, token) + "print('spawned', flush=True)\n" + extra, timeout=timeout
    )
    assert time.monotonic() - started < timeout + SLACK
    assert r.output.startswith("spawned\n"), r.output
    return r


@pytest.mark.parametrize(
    ("backend", "how"),
    pairs(COMMANDS, SPAWNERS),
    indirect=["backend"],
)
def test_nothing_outlives_a_stateless_block(backend: str, ex: Any, token: str, how: str) -> None:
    r = _spawn(ex, how, token)
    assert r.ok
    assert wait_gone(token) == []
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize(
    ("backend", "how"),
    pairs(KERNELS, SPAWNERS),
    indirect=["backend"],
)
def test_nothing_a_kernel_started_survives_restart(
    backend: str, ex: Any, token: str, how: str
) -> None:
    assert _spawn(ex, how, token).ok
    wait_started(token)  # a kernel's children may outlive the block: that is the point of state
    ex.restart()
    assert wait_gone(token) == []
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize(
    "backend",
    backends(ALL),
    indirect=True,
)
def test_a_timed_out_blocks_processes_die(backend: str, ex: Any, token: str) -> None:
    code = "".join(spawn_code(how, token) for how in SPAWNERS)
    r = _spawn(ex, "child", token, extra=code + "import time\ntime.sleep(600)\n", timeout=5)
    assert r.timed_out
    assert wait_gone(token) == []
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_nothing_survives_close(backend: str, token: str, tmp_path: Path) -> None:
    ex = make_executor(backend, work_dir=tmp_path, timeout=30)
    try:
        code = "".join(spawn_code(how, token) for how in SPAWNERS)
        assert ex.execute(code).ok
        if backend in KERNELS:
            wait_started(token, count=len(SPAWNERS))
    finally:
        started = time.monotonic()
        ex.close()
    assert time.monotonic() - started < SLACK
    assert wait_gone(token) == [], processes_with(token)
