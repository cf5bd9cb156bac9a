"""Peak memory of what a session runs: the bench process's children (kernels, per-block
processes, docker clients) and, for containers, the container's memory cgroup.

Read from ``/proc`` and ``/sys/fs/cgroup`` directly (Linux), so no psutil is needed. A thread
samples every ``interval`` seconds; a per-block process shorter than that may be missed, which
the report states.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CGROUP_ROOTS = (
    # cgroup v1 (docker's cgroupfs driver), then v2
    "/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes",
    "/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.current",
    "/sys/fs/cgroup/docker/{id}/memory.current",
)


def _read(path: str) -> bytes:
    """A small /proc file's bytes (OSError if it is gone). A sampler reads dozens per sample
    while sessions are timed: raw reads take a third of the time pathlib's text reads did."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, 65536)]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's ``children`` list), [] if it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            text = _read(f"/proc/{pid}/task/{tid}/children")
        except OSError:
            continue
        found.extend(int(c) for c in text.split())
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, breadth first."""
    out: list[int] = []
    queue = children_of(pid)
    while queue:
        child = queue.pop()
        out.append(child)
        queue.extend(children_of(child))
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size of one process, 0 when it has gone."""
    try:
        fields = _read(f"/proc/{pid}/statm").split()
    except OSError:
        return 0
    return int(fields[1]) * _PAGE


def uss_bytes(pid: int) -> int | None:
    """Memory only this process holds (USS: its private clean and dirty pages, from
    ``smaps_rollup``); pages a forked kernel still shares with its server are not counted.
    None when it cannot be read (gone, or a kernel before Linux 4.14)."""
    return _rollup(pid, ("Private_Clean", "Private_Dirty"))


def pss_bytes(pid: int) -> int | None:
    """Proportional set size: private pages plus this process's share of shared ones (so the
    sum over a server's forked kernels is what they take of the machine together)."""
    return _rollup(pid, ("Pss",))


def _rollup(pid: int, fields: tuple[str, ...]) -> int | None:
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in fields:
                    total += int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return total


def _own_status_kib(key: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            return int(rest.split()[0])
    return None


class OwnPeakGrowth:
    """How much the bench process's own peak RSS rose over a block (the host side's memory
    while a kernel floods it with output): the peak is reset through ``/proc/self/clear_refs``
    first. ``grew`` stays None where that cannot be done."""

    def __init__(self) -> None:
        self.grew: int | None = None
        self._base: int | None = None

    def __enter__(self) -> OwnPeakGrowth:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS
        except OSError:
            return self
        self._base = _own_status_kib("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        peak = _own_status_kib("VmHWM")
        if self._base is not None and peak is not None:
            self.grew = max(0, peak - self._base) * 1024


def tree_rss(root: int) -> int:
    """Summed RSS of every descendant of ``root`` (not ``root`` itself)."""
    return sum(rss_bytes(p) for p in descendants(root))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def container_memory(container_id: str) -> int:
    """A container's current memory use from its cgroup, 0 if it cannot be read."""
    for template in _CGROUP_ROOTS:
        try:
            return int(Path(template.format(id=container_id)).read_text().strip())
        except (OSError, ValueError):
            continue
    return 0


class PeakSampler:
    """Samples the memory of the bench process's descendants (and containers) in a thread.

    ``containers`` is called on every sample, so container ids that appear mid-session count.
    """

    def __init__(
        self,
        *,
        interval: float = 0.05,
        root: int | None = None,
        containers: Callable[[], Iterable[str]] | None = None,
        exclude: Iterable[int] = (),
    ) -> None:
        self.interval = interval
        self.root = os.getpid() if root is None else root
        self._containers = containers
        self._exclude = frozenset(exclude)
        try:
            self._own_cmdline = _read(f"/proc/{self.root}/cmdline")
        except OSError:
            self._own_cmdline = b""
        self.peak = 0
        self.peak_detail: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kernelexec-bench-mem", daemon=True)

    def sample(self) -> int:
        sizes = {
            p: rss_bytes(p)
            for p in descendants(self.root)
            if p not in self._exclude and not self._unexeced_fork(p)
        }
        total = sum(sizes.values())
        containers = {c: container_memory(c) for c in (self._containers or list)()}
        total += sum(containers.values())
        self.samples += 1
        if total > self.peak:
            self.peak = total
            # What made up the peak, so a surprising figure can be explained from the JSON.
            self.peak_detail = {f"{_comm(p)}[{p}]": v for p, v in sizes.items() if v}
            self.peak_detail.update({f"container {c[:12]}": v for c, v in containers.items()})
        return total

    def _unexeced_fork(self, pid: int) -> bool:
        """A child caught between fork and exec still shows the parent's whole RSS (shared
        pages): it is the bench itself about to start a process, not what the row runs."""
        try:
            return _read(f"/proc/{pid}/cmdline") == self._own_cmdline
        except OSError:
            return False

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # a sampler must never take the run down; it reports what it saw
                continue

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        if self.samples == 0:  # a session shorter than one interval still gets its reading
            with contextlib.suppress(Exception):
                self.sample()
