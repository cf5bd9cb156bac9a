"""Who made a leftover, and whether that process is gone: what ``kernelexec gc`` decides on.

Everything kernelexec leaves on a machine (a container, a Swarm service, a private temp folder)
carries an ``Owner``: the process that made it, named so that no other process can be taken
for it. A pid alone is not enough: pids are reused, and the same number means another process
in another pid namespace (a host in a container). So the record also holds the process's start
time (clock ticks since boot), the boot it started in, and its pid and time namespaces.

``owner_state`` answers ``gone``, ``alive`` or ``unknown``, and ``gc`` removes only what is
``gone``: a record it cannot judge (another machine, another pid namespace it cannot see into,
a record it cannot read) is left alone, as is everything a live process made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

#: the environment variable a provisioned kernel's service carries its owner in (the launcher
#: copies its environment into the service; labels cannot be passed through it)
OWNER_ENV = "KERNELEXEC_OWNER"
#: the label a container carries its owner in (JSON, ``Owner.to_text``)
OWNER_LABEL = "kernelexec.owner"
#: the file a private temp folder carries its owner in
OWNER_FILE = ".kernelexec-owner.json"
#: the kernel's fixed inode of the initial pid namespace (PROC_PID_INIT_INO): a process in it
#: sees every process of the machine
_INIT_PID_NS = "pid:[4026531836]"
_MAX_RECORD = 4096
#: the private temp folders a local and a forked kernel make (their sockets, connection file,
#: log); ``sweep_temp_folders`` looks at these names only, never at a work dir in the temp folder
TEMP_PREFIXES = ("kernelexec-ipc-", "kernelexec-fork-", "kernelexec-run-link-")
#: a Docker kernel's short alias to its runtime folder (a deep ``bind_dir`` work dir's): a
#: folder with a record and one link in it (``docker_kernel.short_alias``)
ALIAS_PREFIX = TEMP_PREFIXES[2]
#: a provisioned kernel's launcher log, a file whose first line is its owner's record
LAUNCHER_LOG_PREFIX = "kernelexec-launcher-"
OWNER_LINE = "kernelexec-owner: "
#: where a private folder made outside the standard temp folder (another ``TMPDIR``) is noted,
#: so that ``gc`` run with any ``TMPDIR`` finds it: one file per folder, holding its path
INDEX_ENV = "KERNELEXEC_GC_INDEX"
_STANDARD_TEMP = "/tmp"

State = Literal["gone", "alive", "unknown"]


@dataclass(frozen=True, kw_only=True)
class Owner:
    """One process, named so that it can be told apart from any other on the machine."""

    pid: int
    #: start time, clock ticks since boot (``/proc/PID/stat`` field 22)
    start: int | None
    #: ``/proc/sys/kernel/random/boot_id``
    boot: str | None
    #: ``/proc/self/ns/pid`` and ``/proc/self/ns/time`` (``pid:[4026531836]``)
    pidns: str | None
    timens: str | None
    host: str

    def to_text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> Owner | None:
        """The record in ``text``, or None when it is not one (never an exception)."""
        try:
            data = json.loads(text)
            owner = cls(
                pid=data["pid"],
                start=data["start"],
                boot=data["boot"],
                pidns=data["pidns"],
                timens=data["timens"],
                host=data["host"],
            )
        except (ValueError, TypeError, KeyError, RecursionError):
            return None
        ok = isinstance(owner.pid, int) and owner.pid > 0 and isinstance(owner.host, str)
        ok = ok and (owner.start is None or isinstance(owner.start, int))
        texts = (owner.boot, owner.pidns, owner.timens)
        return owner if ok and all(t is None or isinstance(t, str) for t in texts) else None


def this_process() -> Owner:
    """The record of the calling process (computed afresh: a forked child is another owner)."""
    pid = os.getpid()
    return Owner(
        pid=pid,
        start=_start_time(pid),
        boot=_read("/proc/sys/kernel/random/boot_id"),
        pidns=_readlink("/proc/self/ns/pid"),
        timens=_readlink("/proc/self/ns/time"),
        host=socket.gethostname(),
    )


def owner_state(owner: Owner) -> State:
    """Whether the process ``owner`` names is gone, alive, or cannot be told from here."""
    me = this_process()
    if owner.boot is None or me.boot is None or owner.start is None:
        # An old or partial record: the pid is all there is, and only on its own host.
        if owner.host != me.host or owner.pidns not in (None, me.pidns):
            return "unknown"
        return "alive" if _pid_exists(owner.pid) else "gone"
    if owner.boot != me.boot:
        # Another boot: on this host (same name), the machine restarted since; else it is
        # another machine (a remote engine, another Swarm node), whose processes we cannot see.
        return "gone" if owner.host == me.host else "unknown"
    if owner.timens != me.timens:
        return "unknown"  # start times are shifted in another time namespace
    if owner.pidns == me.pidns:
        return "alive" if _same_process(owner.pid, owner.start) else "gone"
    if me.pidns == _INIT_PID_NS and os.geteuid() == 0:
        # This machine's whole process table is visible: a host in a container (Docker out of
        # Docker, a provisioned kernel's client) is found by its start time and its own pid.
        return "alive" if _found_anywhere(owner) else "gone"
    return "unknown"


def mark_folder(folder: str | os.PathLike[str]) -> None:
    """Write the calling process's record into a private folder it has just made (and note
    the folder in the index when it lies outside the standard temp folder)."""
    path = os.path.join(folder, OWNER_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(this_process().to_text())
    where = os.path.abspath(folder)
    if os.path.dirname(where) != _STANDARD_TEMP:
        with contextlib.suppress(OSError):  # best effort: gc with that TMPDIR still finds it
            _note_in_index(where)


def index_dir() -> str:
    return os.environ.get(INDEX_ENV) or os.path.join(_STANDARD_TEMP, f"kernelexec-{os.geteuid()}")


def _open_index(*, make: bool) -> int:
    """The index folder's descriptor: a real folder of this user's, private (else OSError)."""
    path = index_dir()
    if make:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)  # someone else's, or open to others: not trusted
        raise PermissionError(f"the gc index {path} is not this user's private folder")
    return fd


def _note_in_index(folder: str) -> None:
    index = _open_index(make=True)
    try:
        name = os.path.basename(folder) + ".path"
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=index
        )
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(folder)
    finally:
        os.close(index)


def _indexed_folders() -> list[tuple[str, str]]:
    """(entry name, folder path) of each folder noted in the index: its own entries only."""
    try:
        index = _open_index(make=False)
    except OSError:
        return []
    found = []
    try:
        for name in sorted(os.listdir(index)):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=index)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                    continue
                path = f.read(_MAX_RECORD).decode("utf-8", errors="replace")
            if os.path.isabs(path) and os.path.basename(path).startswith(TEMP_PREFIXES):
                found.append((name, path))
    finally:
        os.close(index)
    return found


def _drop_index_entry(name: str) -> None:
    with contextlib.suppress(OSError):
        index = _open_index(make=False)
        try:
            os.unlink(name, dir_fd=index)
        finally:
            os.close(index)


def owner_line() -> bytes:
    """The first line of a temp file kernelexec makes: the calling process's record."""
    return f"{OWNER_LINE}{this_process().to_text()}\n".encode()


def read_folder_owner(dir_fd: int) -> Owner | None:
    """The record in an open folder (``dir_fd``): a regular file of ours, never a link."""
    try:
        fd = os.open(OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        text = f.read(_MAX_RECORD + 1)
    if len(text) > _MAX_RECORD:
        return None
    return Owner.from_text(text.decode("utf-8", errors="replace"))


def sweep_temp_folders(*, dry_run: bool = False, base: str | None = None) -> list[str]:
    """Remove kernelexec's private temp folders (``kernelexec-ipc-*``, ``kernelexec-fork-*``,
    ``kernelexec-run-link-*``) whose owner is gone; the paths removed (or, with ``dry_run``,
    that would be).

    Only real folders directly in the temp folder, owned by this user and holding a record of
    ours: a link of the same name (to ``/etc``, say) is never followed, another user's folder
    and a folder without a record (someone else's, or an older kernelexec's) are left alone.
    """
    base = base or tempfile.gettempdir()
    found = _sweep_indexed(dry_run=dry_run)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return found
    for name in names:
        path = os.path.join(base, name)
        if path in found:
            continue
        if name.startswith(TEMP_PREFIXES) and _folder_state(path) == "gone":
            found.append(path)
            if not dry_run:
                # rmtree opens the folder and compares it with what lstat saw (no link
                # followed, inside either): on Linux it cannot be led out of the folder.
                shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(LAUNCHER_LOG_PREFIX) and _file_state(path) == "gone":
            found.append(path)
            if not dry_run:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # the name, never what a link would point at
    return found


def _sweep_indexed(*, dry_run: bool) -> list[str]:
    """The folders the index names (made under another ``TMPDIR``) whose owner is gone,
    removed as the temp folder's are; entries of folders already gone are dropped."""
    found = []
    for entry, path in _indexed_folders():
        if not os.path.lexists(path):
            if not dry_run:
                _drop_index_entry(entry)
            continue
        if _folder_state(path) != "gone":
            continue  # alive, a link, someone else's, no record: left alone
        found.append(path)
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
            _drop_index_entry(entry)
    return found


def _file_state(path: str) -> State:
    """The owner state of a temp file whose first line is a record: a regular file of ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "unknown"
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return "unknown"
        first = f.readline(_MAX_RECORD).decode("utf-8", errors="replace")
    if not first.startswith(OWNER_LINE):
        return "unknown"
    owner = Owner.from_text(first[len(OWNER_LINE) :])
    return "unknown" if owner is None else owner_state(owner)


def _folder_state(path: str) -> State:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return "unknown"  # a link, a file, gone already
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return "unknown"
        owner = read_folder_owner(fd)
    finally:
        os.close(fd)
    return "unknown" if owner is None else owner_state(owner)


# -- the process table ---------------------------------------------------------------------------
def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    try:
        return None if fields is None else int(fields[19])
    except (IndexError, ValueError):
        return None


def _pid_exists(pid: int) -> bool:
    fields = _stat_fields(pid)
    if fields is not None:
        return fields[0] not in {"Z", "X"}
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process we may not inspect: it exists
    return True


def _same_process(pid: int, start: int) -> bool:
    """Whether ``pid`` (in our pid namespace) runs and is the process that started at ``start``."""
    fields = _stat_fields(pid)
    if fields is None:
        # Hidden from us (hidepid) but there: count it as alive; absent: gone.
        return _pid_exists(pid)
    with contextlib.suppress(IndexError, ValueError):
        return fields[0] not in {"Z", "X"} and int(fields[19]) == start
    return True  # a stat line we cannot parse: do not call that process dead


def _found_anywhere(owner: Owner) -> bool:
    """Whether a live process on this machine started at ``owner.start`` and is ``owner.pid``
    in its own pid namespace (the innermost of ``NSpid``)."""
    assert owner.start is not None
    try:
        names = os.listdir("/proc")
    except OSError:
        return True  # no process table: cannot say it is gone
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields is None or fields[0] in {"Z", "X"}:
            continue
        with contextlib.suppress(IndexError, ValueError):
            if int(fields[19]) != owner.start:
                continue
            if _inner_pid(name) == owner.pid and _readlink(f"/proc/{name}/ns/pid") in (
                None,
                owner.pidns,
            ):
                return True
    return False


def _inner_pid(pid: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return None


def _read(path: str) -> str | None:
    with contextlib.suppress(OSError):
        return Path(path).read_text().strip() or None
    return None


def _readlink(path: str) -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink(path)
    return None
