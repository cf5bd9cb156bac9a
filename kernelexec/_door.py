"""The one door into a work dir: every host-side operation on a path inside one goes through here.

The code an executor runs owns its work dir: inside a container or a sandbox it can rename the
folders kernelexec made there, plant symbolic links, FIFOs, sockets and link loops, while the
host process reading and writing those paths often runs as root. A path-based ``open`` would
follow what the code planted out of the work dir (the host's ``/etc``, ``/root``), or block on a
FIFO for ever. So the host never names a work-dir path to the kernel as a whole string:

- the work dir is opened once (``O_DIRECTORY``) and held as a file descriptor; a link *at* the
  work dir itself is the caller's own choice and is followed then, once (executors resolve it
  when they are made); nothing below it ever is, and neither is a link put in the work dir's
  place once it was removed (it is opened again only as a folder);
- every component below it is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to the folder
  before it (``openat``): a link anywhere on the way is refused with ``UnsafePath``;
- a new file is created under a random temporary name with ``O_CREAT | O_EXCL | O_NOFOLLOW``
  and renamed into place within the folder's descriptor (``renameat``): a link planted at the
  final name is replaced, never written through; a failed write leaves nothing behind;
- only regular files are read: the entry is checked with ``lstat`` before it is opened
  (``O_NOFOLLOW | O_NONBLOCK``: a FIFO, a socket or a device is never opened) and again with
  ``fstat`` after, and at most the size it had then is read (a file the code keeps growing
  cannot keep the host reading);
- listings come from ``scandir`` on a descriptor with ``lstat``: a link shows as a link.

``confine`` (``_workdir``) stays the lexical check for paths named on another machine (a
gateway's work dir), where no descriptor can be held.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from ._errors import FileTooLarge, InvalidPath, InvalidWorkDir, UnsafePath

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_ROOT_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_DIR_FLAGS = _ROOT_FLAGS | _NOFOLLOW
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | os.O_NOCTTY | _CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC

#: kernelexec's own folder in every work dir. kernelexec never makes a link there, so a link
#: found on the way to a folder it makes below it is the code's: removed (never followed) and
#: replaced by the folder, so a planted link cannot stop the next block's code file or spill.
OWN_DIR = ".kernelexec"

#: Linux's limits: one name, and a whole path (PATH_MAX less its NUL)
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095
_TEMP_SUFFIX = ".kx-partial"
_COPY_CHUNK = 1 << 20

_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
}


def kind_of(mode: int) -> str:
    """What an entry is, in words (``a FIFO``, ``a symbolic link``)."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file" if stat.S_ISREG(mode) else "special")


def split(relative: str) -> list[str]:
    """``relative``'s names, checked: ``InvalidPath`` for anything that is not a plain path
    inside the work dir (absolute, ``..``, a NUL or another control character, too long)."""
    if not isinstance(relative, str) or not relative:
        raise InvalidPath(f"invalid path: {relative!r}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in relative):
        # NUL cannot reach the kernel; a newline or an escape in a name would forge lines in
        # the text a model reads ("saved: ..."), so no caller may name one.
        raise InvalidPath(f"a path may not hold control characters: {relative!r}")
    if os.path.isabs(relative) or relative.startswith("~"):
        raise InvalidPath(f"path must be relative to the work dir: {relative}")
    try:
        size = len(os.fsencode(relative))
    except UnicodeError:
        raise InvalidPath(f"path cannot be encoded for the file system: {relative!r}") from None
    if size > MAX_PATH_BYTES:
        raise InvalidPath(f"path is {size} bytes long, past the {MAX_PATH_BYTES}-byte limit")
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidPath(f"path escapes the work dir: {relative}")
    if not parts:
        raise InvalidPath(f"path names the work dir itself: {relative}")
    for part in parts:
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise InvalidPath(f"a name in the path is past {MAX_NAME_BYTES} bytes: {part[:40]}...")
    return parts


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One entry of a folder, as ``lstat`` sees it (a link is a link, never its target)."""

    name: str
    mode: int
    size: int
    mtime_ns: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)


class Door:
    """The work dir as a held directory descriptor; every method takes a path relative to it
    (or an absolute path lexically under it) and never follows a link below it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self._fd: int | None = None
        self._reopened = False
        self._lock = threading.Lock()

    # -- the held descriptor ----------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Door:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        """A private copy of the work dir's descriptor (closing it cannot race another thread)."""
        with self._lock:
            if self._fd is not None and os.fstat(self._fd).st_nlink == 0:
                os.close(self._fd)  # removed (a block deleted it): a folder made in its place
                self._fd, self._reopened = None, True
            if self._fd is None:
                self._fd = _open_root(self.root, follow=not self._reopened)
            fd = os.dup(self._fd)
        try:
            yield fd
        finally:
            os.close(fd)

    def relative(self, path: str | os.PathLike[str]) -> str:
        """``path`` relative to the work dir: a relative string as it is, an absolute path when
        it lies lexically under the work dir (``InvalidPath`` otherwise)."""
        if isinstance(path, str) and not os.path.isabs(path):
            return path
        absolute = Path(path)
        if not absolute.is_absolute():
            return absolute.as_posix()
        for base in (self.root, self.root.resolve()):
            with contextlib.suppress(ValueError):
                rel = absolute.relative_to(base).as_posix()
                return rel if rel != "." else ""
        raise InvalidPath(f"{path} is not inside the work dir {self.root}")

    @contextlib.contextmanager
    def _folder(self, parts: list[str], *, make: bool = False) -> Iterator[int]:
        """The descriptor of the folder ``parts`` names, reached without following a link;
        with ``make``, missing folders are made on the way."""
        with self._root() as root:
            fd = os.dup(root)
            reclaim = make and bool(parts) and parts[0] == OWN_DIR
            try:
                for i, name in enumerate(parts):
                    current, fd = fd, -1  # _step closes it, whatever happens
                    fd = _step(current, name, "/".join(parts[: i + 1]), make, reclaim=reclaim)
                yield fd
            finally:
                if fd >= 0:
                    os.close(fd)

    def _split(self, path: str | os.PathLike[str]) -> list[str]:
        return split(self.relative(path))

    @contextlib.contextmanager
    def _writing(self, path: str | os.PathLike[str]) -> Iterator[None]:
        """A read-only work dir is said as such (a tree error), not as a bare ``OSError``."""
        try:
            yield
        except OSError as exc:
            if exc.errno != errno.EROFS:
                raise
            raise InvalidWorkDir(
                f"the work dir {self.root} is on a read-only file system: cannot write {path}"
            ) from exc

    # -- reading ----------------------------------------------------------------------------
    def lstat(self, path: str | os.PathLike[str]) -> os.stat_result | None:
        """The entry's own ``lstat`` (a link's, not its target's); None when it is missing."""
        parts = self._split(path)
        try:
            with self._folder(parts[:-1]) as folder:
                return os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_file(self, path: str | os.PathLike[str]) -> bool:
        """True for a regular file reached without a link (False for anything else or none)."""
        try:
            st = self.lstat(path)
        except (UnsafePath, InvalidWorkDir):
            return False
        return st is not None and stat.S_ISREG(st.st_mode)

    @contextlib.contextmanager
    def open_regular(self, path: str | os.PathLike[str]) -> Iterator[tuple[BinaryIO, int]]:
        """A regular file open for reading, and its size when opened. A link, FIFO, socket or
        device is ``UnsafePath`` at once (never opened); a folder is ``IsADirectoryError``."""
        rel = self.relative(path)
        parts = split(rel)
        with self._folder(parts[:-1]) as folder:
            fd = _open_regular(folder, parts[-1], rel)
        with os.fdopen(fd, "rb") as handle:
            yield handle, os.fstat(fd).st_size

    def read_bytes(
        self, path: str | os.PathLike[str], *, limit: int | None = None, head: int | None = None
    ) -> bytes:
        """A regular file's bytes: at most the size it had when opened, at most ``head`` bytes;
        past ``limit`` bytes, ``FileTooLarge`` (nothing read)."""
        with self.open_regular(path) as (handle, size):
            if limit is not None and size > limit:
                raise FileTooLarge(
                    f"{self.relative(path)} is {size} bytes, past the {limit}-byte limit"
                )
            return handle.read(size if head is None else min(size, head))

    def scandir(self, path: str | os.PathLike[str] = "") -> list[Entry]:
        """The entries of a folder (``""`` for the work dir), sorted by name, as ``lstat``
        sees them: a link is listed as a link, whatever (or wherever) it points to."""
        rel = self.relative(path)
        parts = split(rel) if rel not in ("", ".") else []
        with self._folder(parts) as folder:
            return _entries(folder)

    def walk(
        self, path: str | os.PathLike[str] = "", *, skip: Callable[[str], bool] = lambda _: False
    ) -> Iterator[tuple[str, Entry]]:
        """Every entry under a folder, depth first, as (path relative to the work dir, entry);
        folders are entered through descriptors, never through a link. ``skip(rel)`` prunes."""
        rel = self.relative(path)
        start = split(rel) if rel not in ("", ".") else []
        with self._folder(start) as top:
            stack = [(os.dup(top), "/".join(start))]
        try:
            while stack:
                fd, prefix = stack.pop()
                try:
                    entries = _entries(fd)
                    for entry in entries:
                        child = f"{prefix}/{entry.name}" if prefix else entry.name
                        if skip(child):
                            continue
                        yield child, entry
                        if entry.is_dir:
                            with contextlib.suppress(OSError):
                                stack.append((os.open(entry.name, _DIR_FLAGS, dir_fd=fd), child))
                except OSError:
                    continue  # removed or unreadable while we walked: nothing to report there
                finally:
                    os.close(fd)
        finally:
            for fd, _ in stack:  # the caller stopped early
                os.close(fd)

    # -- writing ----------------------------------------------------------------------------
    def makedirs(self, path: str | os.PathLike[str]) -> None:
        """Make a folder and those above it (made with ``mkdir`` relative to a descriptor)."""
        with self._writing(path), self._folder(self._split(path), make=True):
            pass

    def write_bytes(
        self,
        path: str | os.PathLike[str],
        data: bytes | bytearray | memoryview,
        *,
        limit: int | None = None,
        mode: int = 0o666,
    ) -> None:
        """Replace the file with ``data`` atomically: readers see the old file or the new one;
        a failure (a full disk, a folder of that name) leaves nothing behind."""
        if limit is not None and len(data) > limit:
            raise FileTooLarge(
                f"{self.relative(path)} would be {len(data)} bytes, past the {limit}-byte limit"
            )
        with self.replacing(path, mode=mode) as handle:
            view = memoryview(data).cast("B")
            for start in range(0, len(view), _COPY_CHUNK):
                handle.write(view[start : start + _COPY_CHUNK])

    @contextlib.contextmanager
    def replacing(self, path: str | os.PathLike[str], *, mode: int = 0o666) -> Iterator[BinaryIO]:
        """A new file to write, put in place of ``path`` when the block ends without error
        (removed if it raises)."""
        parts = self._split(path)
        with self._writing(path), self._folder(parts[:-1], make=True) as folder:
            temp, handle = _new_temp(folder, mode)
            try:
                with handle:
                    yield handle
                _rename_into(folder, temp, parts[-1], "/".join(parts))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=folder)
                raise

    def create(self, path: str | os.PathLike[str], *, mode: int = 0o666) -> BinaryIO:
        """A new, empty file open for writing, in place of ``path`` at once (for a file
        written as it goes: the full output of a block). The caller closes it."""
        parts = self._split(path)
        with self._writing(path), self._folder(parts[:-1], make=True) as folder:
            temp, handle = _new_temp(folder, mode)
            try:
                _rename_into(folder, temp, parts[-1], "/".join(parts))
            except BaseException:
                handle.close()
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=folder)
                raise
            return handle

    def create_text(self, path: str | os.PathLike[str]) -> TextIO:
        """``create`` as UTF-8 text (bad characters replaced)."""
        return io.TextIOWrapper(self.create(path), encoding="utf-8", errors="replace")

    def copy_in(self, source: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
        """Stream a host file (the caller's own) into the work dir, atomically."""
        with open(source, "rb") as src, self.replacing(path) as dst:
            shutil.copyfileobj(src, dst, _COPY_CHUNK)

    def unlink(self, path: str | os.PathLike[str]) -> None:
        """Remove a file or link (never a link's target); missing is fine."""
        parts = self._split(path)
        with (
            contextlib.suppress(FileNotFoundError, NotADirectoryError),
            self._folder(parts[:-1]) as folder,
        ):
            os.unlink(parts[-1], dir_fd=folder)

    def mkdtemp(self, path: str | os.PathLike[str], prefix: str) -> str:
        """A new private folder (0700) inside ``path``; its path relative to the work dir."""
        parts = self._split(path)
        with self._writing(path), self._folder(parts, make=True) as folder:
            for _ in range(100):
                name = f"{prefix}{secrets.token_hex(6)}"
                try:
                    os.mkdir(name, 0o700, dir_fd=folder)
                except FileExistsError:
                    continue
                return "/".join([*parts, name])
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))

    def chown(self, path: str | os.PathLike[str], uid: int, gid: int) -> None:
        """Change the owner of the entry itself (a link's own, never its target's)."""
        parts = self._split(path)
        with self._folder(parts[:-1]) as folder:
            os.chown(parts[-1], uid, gid, dir_fd=folder, follow_symlinks=False)


def read_regular(path: str | os.PathLike[str], *, limit: int, tail: bool = False) -> bytes | None:
    """A saved file's bytes by its full path, for callers that no longer know its work dir (a
    result's ``files``, a kernel's log in a folder its code may write): only a regular file
    whose own name is not a link, at most ``limit`` bytes (``tail``: its last ``limit`` bytes);
    None for anything else, or a larger file without ``tail`` (a FIFO is never opened). Prefer
    ``Door`` when the work dir is known: a link planted in a folder on the way is followed
    here."""
    folder, name = os.path.split(os.fspath(path))
    try:
        fd = os.open(folder or ".", _ROOT_FLAGS)
    except OSError:
        return None
    try:
        with os.fdopen(_open_regular(fd, name, name), "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if tail:
                handle.seek(max(0, size - limit))
                return handle.read(limit)
            return handle.read(size) if size <= limit else None
    except (OSError, UnsafePath):
        return None
    finally:
        os.close(fd)


# -- the steps -------------------------------------------------------------------------------
def _open_root(root: Path, *, follow: bool) -> int:
    """The work dir's descriptor; unless ``follow`` (its first opening), a link in its place
    (put there after the folder was removed) is refused."""
    try:
        return os.open(root, _ROOT_FLAGS if follow else _DIR_FLAGS)
    except FileNotFoundError:
        raise InvalidWorkDir(f"the work dir {root} does not exist (was it removed?)") from None
    except OSError as exc:
        if not follow and os.path.islink(root):  # ENOTDIR or ELOOP, by the link's target
            raise UnsafePath(
                f"the work dir {root} was removed and a symbolic link put in its place; "
                "kernelexec does not follow it"
            ) from None
        if isinstance(exc, NotADirectoryError):
            raise InvalidWorkDir(f"the work dir {root} is not a directory") from None
        raise InvalidWorkDir(f"cannot open the work dir {root}: {exc.strerror or exc}") from exc


def _refusal(folder: int, name: str, rel: str) -> UnsafePath | None:
    """``UnsafePath`` when ``name`` in ``folder`` is a link (or a loop), else None."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return UnsafePath(
            f"{rel} is a symbolic link in the work dir; kernelexec does not follow links there"
        )
    return None


def _step(fd: int, name: str, rel: str, make: bool, *, reclaim: bool = False) -> int:
    """Open folder ``name`` inside ``fd`` (closing ``fd``), without following a link; with
    ``reclaim`` a link (or a file) in its place is removed and the folder made."""
    try:
        for _ in range(5):  # a race with the code making or removing it: try again
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise FileNotFoundError(
                        errno.ENOENT, "no such folder in the work dir", rel
                    ) from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    if reclaim:
                        os.unlink(name, dir_fd=fd)  # the entry itself: never its target
                        continue
                    refusal = _refusal(fd, name, rel)
                    if refusal is not None:
                        raise refusal from None
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", rel) from None
                raise
        raise FileNotFoundError(errno.ENOENT, "the folder keeps changing", rel)
    finally:
        os.close(fd)


def _open_regular(folder: int, name: str, rel: str) -> int:
    try:
        before = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "no such file in the work dir", rel) from None
    if stat.S_ISDIR(before.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", rel)
    if not stat.S_ISREG(before.st_mode):
        raise UnsafePath(
            f"{rel} is {kind_of(before.st_mode)}, not a regular file; only "
            "regular files are read from the work dir"
        )
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EMLINK):
            raise UnsafePath(f"{rel} changed into something other than a regular file") from None
        raise
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (
        before.st_dev,
        before.st_ino,
    ):
        os.close(fd)
        raise UnsafePath(f"{rel} changed while it was opened; not read")
    os.set_blocking(fd, True)
    return fd


def _new_temp(folder: int, mode: int) -> tuple[str, BinaryIO]:
    """A new file under a random name in ``folder``: ``O_EXCL``, so nothing planted is opened."""
    for _ in range(100):
        name = f".kx-{secrets.token_hex(8)}{_TEMP_SUFFIX}"
        try:
            fd = os.open(name, _NEW_FLAGS, mode, dir_fd=folder)
        except FileExistsError:
            continue
        return name, os.fdopen(fd, "wb")
    raise FileExistsError(errno.EEXIST, "no free temporary name in the work dir")


def _rename_into(folder: int, temp: str, name: str, rel: str) -> None:
    try:
        os.rename(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
            raise IsADirectoryError(errno.EISDIR, "a folder has that name", rel) from None
        raise


def _entries(folder: int) -> list[Entry]:
    found = []
    with os.scandir(folder) as it:
        for item in it:
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since the folder was read
            found.append(
                Entry(name=item.name, mode=st.st_mode, size=st.st_size, mtime_ns=st.st_mtime_ns)
            )
    return sorted(found, key=lambda e: e.name)
