"""What makes a fork fast (issue 35: fork to a first block in milliseconds), on a real kernel.

The kernel forks once (not twice, which cost a second copy of its page tables and the middle
process's exit on every fork) and reaps the child itself; the fork code is loaded, and the
set-up code compiled, once per kernel: its forks inherit both. The host moves the fork into its
cgroup once the kernel answered (a move waits out an RCU grace period, 15 to 25 ms, which the
child's rebuild overlaps), before it connects: the fork's first block runs inside it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_fork import cgroup_of, gone_within, kernel_pid

from kernelexec import KernelExecutor
from kernelexec.backends import _containment
from kernelexec.backends.forked_kernel import ForkedKernel

pytestmark = pytest.mark.kernel

_LOADED = "import sys; m = sys.modules['_kx_fork']; print(id(m), len(m._codes))"


@pytest.fixture(scope="module")
def ex() -> Iterator[KernelExecutor]:
    with KernelExecutor(timeout=60) as executor:
        assert executor.execute("x = 41").exit_code == 0
        yield executor


def test_the_fork_code_is_loaded_once_and_its_forks_inherit_it(ex: KernelExecutor) -> None:
    first = ex.fork()
    try:
        loaded = ex.execute(_LOADED).output.split()
        assert loaded[1] == "1"  # the set-up code, compiled in the kernel before it forked
        # The fork holds the same module (and the compiled code) without loading anything.
        assert first.execute(_LOADED).output.split() == loaded
        second = ex.fork()
        second.close()
        assert ex.execute(_LOADED).output.split() == loaded  # not loaded again
        grandchild = first.fork()
        try:
            assert grandchild.execute("print(x)").output.strip() == "41"
        finally:
            grandchild.close()
    finally:
        first.close()


def test_the_kernel_reaps_its_fork_once_closed(ex: KernelExecutor) -> None:
    parent = kernel_pid(ex)
    child = ex.fork()
    pid = kernel_pid(child)
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        assert ppid == parent  # forked once: the session's kernel is its parent
    finally:
        child.close()
    assert gone_within(pid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            open(f"/proc/{pid}/stat").close()  # a zombie still has one
        except OSError:
            break
        time.sleep(0.02)
    else:
        raise AssertionError(f"fork {pid} was never reaped (a zombie of the kernel)")
    assert ex.execute("print(x)").output.strip() == "41"


def test_the_host_moves_the_fork_into_its_cgroup_before_its_first_block(
    ex: KernelExecutor, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The kernel is not asked to wait for the move (the request names no cgroup); yet when
    the fork's first block runs, the fork and every thread of it are in its own cgroup (the
    one its back end made), and so is a process the block starts."""
    if not _containment.mechanism().startswith("cgroup"):
        pytest.skip("no cgroup here: a forked kernel is contained by its process group only")
    requests: list[dict[str, Any]] = []
    prepare = ForkedKernel.prepare

    def recorded(self: ForkedKernel, **kwargs: Any) -> dict[str, Any]:
        requests.append(request := prepare(self, **kwargs))
        return request

    monkeypatch.setattr(ForkedKernel, "prepare", recorded)
    parent = kernel_pid(ex)
    child = ex.fork()
    try:
        seen = tmp_path / "seen"
        block = (
            "import os, subprocess\n"
            f"subprocess.run(['sh', '-c', 'cat /proc/$$/cgroup > {seen}'], check=True)\n"
            "tasks = {t: open(f'/proc/self/task/{t}/cgroup').read()"
            " for t in os.listdir('/proc/self/task')}\n"
            "print(os.getpid(), len(set(tasks.values())), len(tasks))"
        )
        result = child.execute(block)
        assert result.exit_code == 0, result.output
        pid, kinds, threads = (int(v) for v in result.output.split())
        assert [r["cgroup"] for r in requests] == [None]  # the kernel did not wait for it
        jail = child.aio.backend._jail
        assert jail is not None and jail.procs_file is not None
        assert str(pid) in jail.procs_file.read_text().split()  # the fork's own cgroup
        assert kinds == 1 and threads > 1  # every thread of it, in that one cgroup
        assert seen.read_text() == cgroup_of(pid) != cgroup_of(parent)
    finally:
        child.close()


def test_the_fork_does_not_wait_for_the_kernels_output_thread(ex: KernelExecutor) -> None:
    """The kernel empties its streams before it forks without waiting for its iopub thread
    (a round trip to it: 10 ms and more on a loaded machine): with that thread held up for
    4 s, the fork is taken at once, and the session's output is whole once the thread is free."""
    held = ex.execute(
        "import threading, time\n"
        "from ipykernel.kernelapp import IPKernelApp\n"
        "_t = IPKernelApp.instance().iopub_thread\n"
        "threading.Timer(0.5, lambda t=_t: t.schedule(lambda: time.sleep(4))).start()\n"
        "del _t\n"
        "print('held')"
    )
    returned = time.monotonic()
    assert held.output == "held\n", held.output
    time.sleep(1.0)  # the iopub thread is asleep now, for 3.5 s more (from 0.5 s after the block)
    started = time.monotonic()
    assert started - returned < 1.5  # (the block itself did not wait for the hold)
    child = ex.fork()
    try:
        took = time.monotonic() - started
        assert child.execute("print(x)").output == "41\n"
    finally:
        child.close()
    assert took < 2.5, f"the fork waited {took:.1f} s for the kernel's iopub thread"
    assert ex.execute("print(x, 'after')").output == "41 after\n"


def test_text_the_session_writes_as_it_forks_stays_the_sessions(ex: KernelExecutor) -> None:
    """A thread of the session writing while it forks: none of its text reaches a fork's
    blocks (the fork's streams are its own; what the session held is queued for its own
    iopub thread), and the session's next block is its own."""
    ticking = ex.execute(
        "import sys, threading, time\n"
        "_stop = threading.Event()\n"
        "def _tick():\n"
        "    while not _stop.is_set():\n"
        "        sys.stdout.write('tick')\n"
        "        time.sleep(0.001)\n"
        "_ticker = threading.Thread(target=_tick, daemon=True)\n"
        "_ticker.start()"
    )
    assert ticking.exit_code == 0, ticking.output
    forks = []
    try:
        for _ in range(3):
            forks.append(ex.fork())
            assert forks[-1].execute("print('mine', x)").output == "mine 41\n"
    finally:
        for child in forks:
            child.close()
        stopped = ex.execute("_stop.set(); _ticker.join(); del _stop, _ticker, _tick")
    assert stopped.exit_code == 0, stopped.output
    assert ex.execute("print('after')").output == "after\n"
