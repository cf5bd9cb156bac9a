"""Nothing a local kernel started survives ``restart()`` or ``close()`` (issue 13.3).

Each escape form (a new session, ``setsid``, a double fork, ``nohup ... &``) is started from a
kernel block under each containment mechanism this host has. One kernel per mechanism starts
all four forms in one block, so the suite stays quick; each form's pid is checked on its own.
A timed-out block keeps the kernel's state (the interrupt still works) and loses its own
processes, not those of earlier blocks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kx_containment import (
    ESCAPES,
    describe_cgroups,
    escape_block,
    gone_within,
    kill_leftover,
    mechanisms,
    our_cgroups,
    running,
)

from kernelexec import KernelExecutor
from kernelexec.backends.local_kernel import LocalKernel


def start_all(ex: KernelExecutor, folder: Path) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    pidfiles = {form: folder / f"{form}.pid" for form in ESCAPES}
    for form, pidfile in pidfiles.items():
        result = ex.execute(escape_block(form, pidfile))
        assert result.ok and "escaped" in result.output, result.output
    for form, pidfile in pidfiles.items():  # a kernel keeps what a block started running
        assert running(int(pidfile.read_text())), f"{form} died with its block"
    return pidfiles


def assert_all_gone(pidfiles: dict[str, Path], mechanism: str, after: str) -> None:
    survivors = [f for f, p in pidfiles.items() if not gone_within(int(p.read_text()))]
    assert survivors == [], f"{survivors} survived {after} under {mechanism}"


@pytest.fixture(params=mechanisms())
def mechanism(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ex(mechanism: str, tmp_path: Path) -> Iterator[KernelExecutor]:
    backend = LocalKernel(containment=mechanism)
    with KernelExecutor(backend=backend, work_dir=tmp_path / "work", timeout=30) as executor:
        yield executor


@pytest.mark.slow
def test_restart_and_close_leave_nothing_running(
    ex: KernelExecutor, mechanism: str, tmp_path: Path
) -> None:
    pidfiles: dict[str, Path] = {}
    timed_out: dict[str, Path] = {}
    try:
        pidfiles = start_all(ex, tmp_path / "before-restart")
        ex.execute("kept = 42")
        # A timed-out block is interrupted: the kernel's state is kept, the processes that
        # block started die (escaped or not), and those earlier blocks started stay.
        timed_out = {form: tmp_path / f"timed-out-{form}.pid" for form in ESCAPES}
        for form, pidfile in timed_out.items():
            result = ex.execute(escape_block(form, pidfile, then_sleep=60), timeout=3)
            assert result.timed_out and "state were kept" in result.output, result.output
            assert gone_within(int(pidfile.read_text())), f"{form} outlived its timeout"
        assert ex.execute("print(kept)").output == "42\n"
        for form, pidfile in pidfiles.items():
            assert running(int(pidfile.read_text())), f"{form} of an earlier block was killed"
        cgroups_before = our_cgroups()
        ex.restart()
        assert_all_gone(pidfiles, mechanism, "restart()")
        if mechanism.startswith("cgroup"):
            after = our_cgroups()
            assert len(cgroups_before) == len(after) == 1 and after != cgroups_before
        pidfiles = start_all(ex, tmp_path / "before-close")
        ex.close()
        assert_all_gone(pidfiles, mechanism, "close()")
        left = our_cgroups()
        assert left == [], describe_cgroups(left)
    finally:
        for pidfile in [*pidfiles.values(), *timed_out.values()]:
            kill_leftover(pidfile)


FORKING = """
import os, pathlib, subprocess, sys, time
folder = pathlib.Path({folder!r})
loop = '''
import os, pathlib, time
folder = pathlib.Path({folder!r})
(folder / str(os.getpid())).write_text("")
for _ in range(400):  # bounded: a fork loop, not a fork bomb, if containment ever failed
    if os.fork() == 0:
        (folder / str(os.getpid())).write_text("")
        time.sleep(60)
        os._exit(0)
    time.sleep(0.02)
time.sleep(60)
'''
subprocess.Popen([sys.executable, "-c", loop], start_new_session=True)
while len(list(folder.iterdir())) < 20:
    time.sleep(0.01)
print("forking", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_timed_out_block_that_keeps_forking_loses_every_process(
    ex: KernelExecutor, mechanism: str, tmp_path: Path
) -> None:
    """The interrupt's kill goes on until the block has no process left, even while a detached
    child of the block is forking new ones; the kernel's state stays."""
    folder = tmp_path / "forks"
    folder.mkdir()
    ex.execute("kept = 7")
    try:
        result = ex.execute(FORKING.format(folder=str(folder)), timeout=3)
        assert result.timed_out and "state were kept" in result.output, result.output
        pids = [int(p.name) for p in folder.iterdir()]
        assert len(pids) >= 20
        survivors = [pid for pid in pids if not gone_within(pid)]
        assert survivors == [], f"{len(survivors)} of {len(pids)} outlived the timeout"
        count = len(list(folder.iterdir()))
        time.sleep(0.5)  # nothing left to fork more
        assert len(list(folder.iterdir())) == count, f"forks went on under {mechanism}"
        assert ex.execute("print(kept)").output == "7\n"
    finally:
        for pidfile in folder.iterdir():
            if running(int(pidfile.name)):
                os.kill(int(pidfile.name), 9)
