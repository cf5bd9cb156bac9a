"""Containment: every process a block or a kernel starts can be found and killed as a whole.

A process group is not enough: ``setsid``, ``start_new_session=True``, ``nohup ... &`` and a
double fork all leave it. Three mechanisms, best first:

``cgroup``
    A control group of our own per command executor or per kernel, made under the host
    process's own cgroup. The child joins it between fork and exec, so nothing it starts can
    leave (only root or the cgroup's owner may move a process out). The command back end's child
    is a resident spawner (``_resident``) that starts every block inside it: joining a cgroup
    waits for an RCU grace period each time (5 to 20 ms), being born in one costs nothing.
    Killing: cgroup v2's ``cgroup.kill`` where the kernel has it (5.14+), else the v1 freezer
    (freeze, SIGKILL every member, thaw), else SIGKILL member by member until it is empty; after
    a block, every member but the spawner (frozen first, unless none is left). The cgroup is
    removed when the executor closes or the kernel is stopped. Its name holds the host's pid, so
    ``sweep_orphans()`` (``kernelexec gc``) can remove what a killed host left behind.
``subreaper``
    A small helper process (``_reaper.py``) marks itself child subreaper
    (``prctl(PR_SET_CHILD_SUBREAPER)``) and runs the command or kernel as its child: whatever
    is orphaned below it is re-parented to the helper instead of to init, so the helper can
    always find and kill it. When the main child exits, or when asked (SIGUSR1), the helper
    kills every descendant and exits.
``process-group``
    The last resort: the child leads a session and process group of its own, and the group is
    killed. A process that starts a new session or process group escapes.

``containment=`` on the back ends, or the ``KERNELEXEC_CONTAINMENT`` environment variable,
chooses one (``auto``, the default, takes the first that works on this host).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import errno
import functools
import os
import signal
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .._errors import BackendUnavailable

ENV_VAR = "KERNELEXEC_CONTAINMENT"
#: accepted values of ``containment=`` / ``KERNELEXEC_CONTAINMENT``
CHOICES = ("auto", "cgroup", "cgroup-v2", "cgroup-v1", "subreaper", "process-group")
_PREFIX = "kernelexec-"
_REAPER = str(Path(__file__).with_name("_reaper.py"))
_PR_SET_CHILD_SUBREAPER = 36
_EMPTY_WAIT = 5.0  # seconds a killed cgroup gets to empty before we give up on removing it


def mechanism(requested: str | None = None) -> str:
    """The mechanism to use: ``requested``, else the environment variable, else the best here.

    Raises ``BackendUnavailable`` when a mechanism is asked for by name and this host lacks it.
    """
    choice = requested or os.environ.get(ENV_VAR) or "auto"
    if choice not in CHOICES:
        raise ValueError(f"containment must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "auto":
        if _cgroup_parent("v2", need_kill=True) or _cgroup_parent("v1"):
            return "cgroup"
        return "subreaper" if subreaper_available() else "process-group"
    if choice == "cgroup" and not (_cgroup_parent("v2") or _cgroup_parent("v1")):
        raise BackendUnavailable("containment='cgroup': no writable cgroup hierarchy here")
    if choice in ("cgroup-v2", "cgroup-v1") and not _cgroup_parent(choice[-2:]):
        raise BackendUnavailable(f"containment={choice!r}: not available on this host")
    if choice == "subreaper" and not subreaper_available():
        raise BackendUnavailable("containment='subreaper' needs Linux (prctl)")
    return choice


class Jail(ABC):
    """Holds the processes of one block or one kernel."""

    name: str

    def popen_kwargs(self) -> dict[str, Any]:
        """Extra ``Popen`` arguments for the contained process."""
        return {"start_new_session": True}

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv to start instead of ``argv``."""
        return list(argv)

    @property
    def procs_file(self) -> Path | None:
        """A file a process joins the jail by writing ``0`` to (a cgroup's), if there is one:
        for a process this back end does not start itself (a forked kernel)."""
        return None

    def started(self, pid: int) -> None:  # noqa: B027 - optional hook
        """Called with the pid of the process just started (it leads its own session)."""

    @abstractmethod
    def pids(self) -> set[int]:
        """The processes in the jail now (the contained process itself included)."""

    @abstractmethod
    def kill(self) -> None:
        """Kill every contained process, and wait (briefly) until they are gone."""

    def close(self) -> None:
        """Kill everything and release the jail itself. Safe to call twice."""
        self.kill()

    def members(self) -> set[Member]:
        """The processes in the jail now, each with its start time (a pid alone can be reused)."""
        return {(pid, _start_time(pid)) for pid in self.pids()}

    async def kill_new_after_sigint(
        self, before: set[Member], spare: Iterable[int | None] = (), *, settle: float = 1.0
    ) -> None:
        """``kill_new``, once the SIGINT just sent has had up to ``settle`` seconds to end the
        block's processes itself. A kernel that passes it on (bash_kernel, to its shell's
        terminal) then sees them end as it expects; killed at once, the shell also printed
        "Killed" and a second prompt, and the next block read the first one: every later
        block's output came one block late."""
        keep = {pid for pid in spare if pid is not None}
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            if not any(pid not in keep and _running(pid) for pid, _ in self.members() - before):
                return
            await asyncio.sleep(0.02)
        await asyncio.to_thread(self.kill_new, before, keep)

    def kill_new(self, before: set[Member], spare: Iterable[int | None] = ()) -> None:
        """Kill every process that joined since ``before`` (except ``spare``), and go on until
        none is left: what a block that keeps forking starts is caught on a later pass. What was
        there before is left alone. (Not frozen first: a kernel frozen just after its SIGINT
        sometimes never raised KeyboardInterrupt, seen under cgroup v1 and v2.)"""
        keep = {pid for pid in spare if pid is not None}
        deadline = time.monotonic() + _EMPTY_WAIT
        while time.monotonic() < deadline:
            # A killed process can stay listed as a zombie until its parent reaps it: only
            # running ones count.
            fresh = self.members() - before
            new = {pid for pid, _ in fresh if pid not in keep and _running(pid)}
            if not new:
                return
            kill_pids(new)
            time.sleep(0.005)


Member = tuple[int, int | None]


def make_jail(mechanism_name: str) -> Jail:
    """A new jail of the given mechanism (as returned by ``mechanism()``)."""
    if mechanism_name == "cgroup":
        flavour = "v2" if _cgroup_parent("v2", need_kill=True) else "v1"
        if not _cgroup_parent(flavour):
            flavour = "v2"
        return _CgroupJail(flavour)
    if mechanism_name in ("cgroup-v2", "cgroup-v1"):
        return _CgroupJail(mechanism_name[-2:])
    if mechanism_name == "subreaper":
        return _SubreaperJail()
    return _GroupJail()


class _GroupJail(Jail):
    name = "process-group"

    def __init__(self) -> None:
        self._pgid: int | None = None

    def started(self, pid: int) -> None:
        if pid > 0:  # never 0: killpg(0) would be our own group
            self._pgid = pid

    def pids(self) -> set[int]:
        if self._pgid is None:
            return set()
        return {pid for pid, _, pgrp in _proc_table() if pgrp == self._pgid}

    def kill(self) -> None:
        if self._pgid is not None and self._pgid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pgid, signal.SIGKILL)


class _SubreaperJail(_GroupJail):
    """The child runs under ``_reaper.py``; SIGUSR1 asks it to kill everything and exit."""

    name = "subreaper"

    def __init__(self) -> None:
        super().__init__()
        self._pid: int | None = None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        # -I: nothing from the work dir or the environment; -S: no site (faster, stdlib only)
        return [sys.executable, "-I", "-S", _REAPER, *argv]

    def started(self, pid: int) -> None:
        super().started(pid)
        if pid > 0:
            self._pid = pid

    def pids(self) -> set[int]:
        """The helper and every process below it (orphans are re-parented to the helper)."""
        if self._pid is None:
            return set()
        children: dict[int, list[int]] = {}
        for pid, ppid, _ in _proc_table():
            children.setdefault(ppid, []).append(pid)
        found, frontier = {self._pid}, [self._pid]
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
        return found

    def kill(self) -> None:
        if self._pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self._pid, signal.SIGUSR1)
        # The helper exits once its descendants are gone; it is our child, so it is reaped by
        # whoever waits on it (asyncio or jupyter_client). Wait until it no longer runs.
        deadline = time.monotonic() + _EMPTY_WAIT
        while time.monotonic() < deadline and _running(self._pid):
            time.sleep(0.01)
        super().kill()  # the helper's own group, in case the helper itself was stuck


class _CgroupJail(Jail):
    def __init__(self, flavour: str, existing: Path | None = None) -> None:
        self.name = f"cgroup-{flavour}"
        self._flavour = flavour
        self._closed = False
        self._spawn_fds: list[int] = []
        if existing is not None:  # an orphan found by sweep_orphans()
            self.path = existing
            return
        parent = _cgroup_parent(flavour)
        if parent is None:
            raise BackendUnavailable(f"no writable cgroup {flavour} hierarchy here")
        # The owner's pid and start time (a pid alone can be reused): see ``sweep_orphans``.
        pid = os.getpid()
        self.path = parent / f"{_PREFIX}{pid}-t{_start_time(pid)}-{uuid.uuid4().hex[:12]}"
        try:
            self.path.mkdir()
        except OSError as exc:
            raise BackendUnavailable(f"cannot create cgroup {self.path}: {exc}") from exc

    @property
    def procs_file(self) -> Path | None:
        return self.path / "cgroup.procs"

    def popen_kwargs(self) -> dict[str, Any]:
        # The child writes "0" (itself) into cgroup.procs after fork, before exec: nothing it
        # runs exists outside the cgroup, not even for an instant. The fd is the parent's, open
        # until the spawn is done; the function only calls os.write (no allocation, no locks).
        fd = os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        self._spawn_fds.append(fd)
        return {"start_new_session": True, "preexec_fn": functools.partial(_join, fd)}

    def started(self, pid: int) -> None:
        fds, self._spawn_fds[:] = list(self._spawn_fds), []
        for fd in fds:
            os.close(fd)

    def pids(self) -> set[int]:
        return _members(self.path)

    def kill(self) -> None:
        if self._closed:
            return
        kill_file = self.path / "cgroup.kill"
        if self._flavour == "v2" and kill_file.exists():
            _write(kill_file, "1")
        elif self._flavour == "v1":
            self._kill_frozen()
        deadline = time.monotonic() + _EMPTY_WAIT
        while (members := self.pids()) and time.monotonic() < deadline:
            for pid in members:  # the fallback; also catches a fork racing the freezer
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def _kill_frozen(self) -> None:
        state = self.path / "freezer.state"
        _write(state, "FROZEN")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and _read(state) == "FREEZING":
            time.sleep(0.002)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _write(state, "THAWED")  # frozen processes die once thawed

    def kill_others(self, keep: int | Iterable[int | None]) -> None:
        """Kill every member but ``keep`` (a resident spawner, its spare), frozen so none can
        fork meanwhile; when none is left (the usual end of a block) this reads one file."""
        kept = {keep} if isinstance(keep, int) else {pid for pid in keep if pid is not None}
        if not self.pids() - kept or self._closed:
            return
        self._freeze(True)
        try:
            kill_pids(self.pids() - kept)
        finally:
            self._freeze(False)  # frozen processes die once thawed (v1); ``keep`` runs on
        deadline = time.monotonic() + _EMPTY_WAIT
        while (others := self.pids() - kept) and time.monotonic() < deadline:
            kill_pids(others)  # one that forked before the freezer caught it
            time.sleep(0.005)

    def _freeze(self, frozen: bool) -> None:
        if self._flavour == "v1":
            _write(self.path / "freezer.state", "FROZEN" if frozen else "THAWED")
        else:
            _write(self.path / "cgroup.freeze", "1" if frozen else "0")
        deadline = time.monotonic() + 1.0
        while frozen and time.monotonic() < deadline and not self._frozen():
            time.sleep(0.002)

    def _frozen(self) -> bool:
        if self._flavour == "v1":
            return _read(self.path / "freezer.state") != "FREEZING"
        return "frozen 1" in _read(self.path / "cgroup.events")

    def close(self) -> None:
        if self._closed:
            return
        self.kill()
        self.started(0)  # a spawn that failed leaves its fd open
        _remove_cgroup(self.path)
        self._closed = True


def sweep_orphans(*, dry_run: bool = False) -> list[str]:
    """Remove the cgroups of kernelexec hosts that are gone (killed before they could clean up).

    Their processes are killed first. Returns the cgroup paths removed (or, with ``dry_run``,
    that would be).
    """
    found: list[str] = []
    for flavour in ("v2", "v1"):
        parent = _cgroup_parent(flavour)
        if parent is None:
            continue
        for path in sorted(parent.glob(f"{_PREFIX}*")):
            if not path.is_dir() or not _owner_gone(path.name):
                continue
            found.append(str(path))
            if not dry_run:
                _CgroupJail(flavour, existing=path).close()
    return found


def _owner_gone(name: str) -> bool:
    """Whether the process a cgroup's name records (``kernelexec-PID-tSTART-ID``, or an older
    ``kernelexec-PID-ID``) no longer runs; a reused pid, started at another time, is not it."""
    pid, _, rest = name[len(_PREFIX) :].removeprefix("probe-").partition("-")
    if not pid.isdigit():
        return False
    if not _running(int(pid)):
        return True
    start = rest.partition("-")[0]
    return start[:1] == "t" and start[1:].isdigit() and int(start[1:]) != _start_time(int(pid))


def subreaper_available() -> bool:
    return sys.platform.startswith("linux") and _libc() is not None


# -- helpers --------------------------------------------------------------------------------------


def _join(fd: int) -> None:
    os.write(fd, b"0")


@functools.cache
def _libc() -> Any:
    with contextlib.suppress(OSError):
        return ctypes.CDLL(None, use_errno=True)
    return None


@functools.cache
def _cgroup_parent(flavour: str, *, need_kill: bool = False) -> Path | None:
    """Where this process may create cgroups in the ``v2`` or ``v1`` (freezer) hierarchy."""
    if not sys.platform.startswith("linux"):
        return None
    mount, own = _mount_and_own(flavour)
    if mount is None or own is None:
        return None
    parent = mount / own.lstrip("/")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return None
    probe = parent / f"{_PREFIX}probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return None
    has_kill = (probe / "cgroup.kill").exists()  # the root cgroup never has the file
    with contextlib.suppress(OSError):
        probe.rmdir()
    if need_kill and not has_kill:
        return None
    return parent


def _mount_and_own(flavour: str) -> tuple[Path | None, str | None]:
    """Where the hierarchy is mounted, and our own cgroup's path relative to that mount.

    From ``/proc/self/mountinfo``, whose fourth field is the mount's root inside the hierarchy:
    in a container the mount's root is the container's own cgroup, not the hierarchy's root.
    """
    mount: Path | None = None
    mount_root = "/"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            fstype, options = tail[0], tail[2].split(",")
            if (flavour == "v2" and fstype == "cgroup2") or (
                flavour == "v1" and fstype == "cgroup" and "freezer" in options
            ):
                mount_root, mount = fields[3], Path(fields[4])
                break
    own: str | None = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if (flavour == "v2" and controllers == "") or (
                flavour == "v1" and "freezer" in controllers.split(",")
            ):
                own = path
                break
    if own is not None and mount_root != "/":
        if own != mount_root and not own.startswith(mount_root.rstrip("/") + "/"):
            return mount, None  # our cgroup is not visible through this mount
        own = own[len(mount_root.rstrip("/")) :] or "/"
    return mount, own


#: cgroups that were still busy when their jail closed: their removal is tried again at every
#: later close in this process and at its exit (``sweep_orphans`` only takes a dead host's)
_PENDING: set[Path] = set()


def _remove_cgroup(path: Path) -> None:
    deadline = time.monotonic() + _EMPTY_WAIT
    while not _removed(path):
        if time.monotonic() > deadline:
            # Seen on a loaded machine: a killed kernel still leaving its cgroup after the
            # wait. Never raise from a clean-up, and never leave it for good either.
            if not _PENDING:
                atexit.register(_remove_pending)
            _PENDING.add(path)
            return
        time.sleep(0.01)
    _remove_pending()


def _removed(path: Path) -> bool:
    """Whether ``path`` is gone now (a busy cgroup's members are killed again on the way)."""
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            return True  # a retry would not change it: given up, as ever
        kill_pids(_members(path))  # busy: a member still dying, or one that slipped in
        return False
    return True


def _remove_pending() -> None:
    for path in list(_PENDING):
        if _removed(path):
            _PENDING.discard(path)


def _members(path: Path) -> set[int]:
    try:
        return {int(p) for p in (path / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def _proc_table() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process (none known without /proc)."""
    table: list[tuple[int, int, int]] = []
    for name in _proc_names():
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] not in {"Z", "X"}:
            table.append((int(name), int(fields[1]), int(fields[2])))
    return table


def first_child(parent: int) -> int | None:
    """The oldest live child of ``parent`` (by start time), or None."""
    best: tuple[int, int] | None = None
    for name in _proc_names():
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] not in {"Z", "X"}:
            started = int(fields[19])  # field 22 of stat: start time, in clock ticks
            if best is None or started < best[0]:
                best = (started, int(name))
    return None if best is None else best[1]


def _start_time(pid: int) -> int | None:
    """A process's start time in clock ticks (None once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def kill_pids(pids: Iterable[int | None]) -> None:
    """SIGKILL each of ``pids`` that still exists."""
    for pid in pids:
        if pid is not None and pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _proc_names() -> list[str]:
    try:
        return os.listdir("/proc")
    except OSError:  # no /proc (macOS): no process table to read
        return []


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text().strip()
    return ""


def _write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(text)
