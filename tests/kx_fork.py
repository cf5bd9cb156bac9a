"""Helpers shared by the fork-kernel tests: process states and the server's spare."""

from __future__ import annotations

import time

from kernelexec.bench.memory import children_of


def running(pid: int) -> bool:
    """Alive and not a zombie (the fork server reaps its children, but not instantly)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def gone_within(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.02)
    return False


def spare_of(server: int, kernels: set[int], seconds: float = 10) -> int:
    """The server's one child that is not a kernel: the process the next kernel becomes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        spares = {p for p in children_of(server) if running(p)} - kernels
        if len(spares) == 1:
            return spares.pop()
        time.sleep(0.02)
    raise AssertionError(f"no single spare: children {children_of(server)}, kernels {kernels}")
