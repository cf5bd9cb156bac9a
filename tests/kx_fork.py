"""Helpers shared by the fork tests (fork-server kernels, forked sessions, sandboxed forks,
jobs on forks): process states, marked processes, a kernel's pid and cgroup, the server's
spare."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kx_containment import gone_within, running

from kernelexec import KernelExecutor
from kernelexec.bench.memory import children_of

__all__ = ["cgroup_of", "gone_within", "kernel_pid", "marked", "running", "spare_of"]


def marked(marker: str, *, also: str = "") -> list[int]:
    """Pids of the processes (zombies too) whose command line holds ``marker`` (and
    ``also``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ")
            except OSError:
                continue
            if marker.encode() in cmdline and also.encode() in cmdline:
                found.append(int(entry))
    return found


def kernel_pid(executor: KernelExecutor) -> int:
    """The kernel's pid as the kernel sees it."""
    return int(executor.execute("import os; os.getpid()").output)


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def spare_of(server: int, kernels: set[int], seconds: float = 10) -> int:
    """The server's one child that is not a kernel: the process the next kernel becomes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        spares = {p for p in children_of(server) if running(p)} - kernels
        if len(spares) == 1:
            return spares.pop()
        time.sleep(0.02)
    raise AssertionError(f"no single spare: children {children_of(server)}, kernels {kernels}")
