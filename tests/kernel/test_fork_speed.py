"""What makes a fork fast (issue 35: fork to a first block in milliseconds), on a real kernel.

The kernel forks once (not twice, which cost a second copy of its page tables and the middle
process's exit on every fork) and reaps the child itself; the fork code is loaded, and the
set-up code compiled, once per kernel: its forks inherit both."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kx_fork import gone_within, kernel_pid

from kernelexec import KernelExecutor

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
