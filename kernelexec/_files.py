"""Files in and out of an executor's work dir: read, write, list, upload, download.

Two stores behind one shape. ``LocalFiles`` works on the work dir directly: the local back ends
and both Docker back ends (the work dir is bind-mounted) share the disk with the host.
``KernelFiles`` goes through the kernel over the Jupyter protocol, for a kernel on another
machine (a gateway): data travels base64-encoded in chunks, with a size limit, using silent
requests that leave no history and no outputs.

Every path is relative to the work dir and confined to it, as a block's ``# filename:`` is:
absolute paths, ``..`` and symlinks leading out are refused with ``InvalidPath``. On the host's
own disk every access goes through the work dir's door (``_door``): no link is followed at all
(``UnsafePath``), only regular files are read (a FIFO is refused at once, not waited on).
"""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ._door import Door, split
from ._errors import FileTooLarge, InvalidPath, UnsafePath
from ._workdir import INTERNAL_DIR, check_relative, confine

#: Largest file moved through a remote kernel (bytes); past it, ``FileTooLarge``.
DEFAULT_TRANSFER_LIMIT = 100 * 1024 * 1024
#: Largest file ``read_file`` / ``write_file`` move on the host's own disk (both are held in
#: memory whole); past it, ``FileTooLarge`` before anything is read or written.
DEFAULT_LOCAL_LIMIT = 1024 * 1024 * 1024
# Raw bytes per protocol message (base64 makes it a third bigger on the wire).
_CHUNK = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class FileEntry:
    """One entry of ``list_files``: its path relative to the work dir, size, and kind."""

    path: str
    size: int
    is_dir: bool
    #: a symbolic link (listed as itself, never followed: ``size`` is the link's own)
    is_link: bool = False


class FileStore(Protocol):
    """Where an executor's files live, as seen from the host."""

    #: True when each operation needs the kernel (serialised with blocks)
    through_kernel: bool

    async def read(self, path: str) -> bytes: ...
    async def write(self, path: str, data: bytes | bytearray | memoryview) -> None: ...
    async def listing(self, path: str) -> list[FileEntry]: ...


class LocalFiles:
    """The work dir on the host's disk (local and Docker back ends), through its door: no link
    the code planted is followed, only regular files are read, writes land atomically."""

    through_kernel = False

    def __init__(
        self, root: Path, *, door: Door | None = None, limit: int = DEFAULT_LOCAL_LIMIT
    ) -> None:
        self.root = root
        self.door = door or Door(root)
        self.limit = limit

    async def read(self, path: str) -> bytes:
        confine(self.root, path)  # the lexical check, and its message for a link leading out
        return await asyncio.to_thread(self.door.read_bytes, path, limit=self.limit)

    async def write(self, path: str, data: bytes | bytearray | memoryview) -> None:
        confine(self.root, path)
        await asyncio.to_thread(self.door.write_bytes, path, data, limit=self.limit)

    async def listing(self, path: str) -> list[FileEntry]:
        confine(self.root, path, allow_root=True)
        return await asyncio.to_thread(_list_dir, self.door, path)

    async def copy_in(self, source: Path, path: str) -> None:
        """Stream a host file in (no size limit: nothing is held in memory)."""
        confine(self.root, path)
        if source.is_dir():
            raise IsADirectoryError(f"{source} is a directory")
        await asyncio.to_thread(self.door.copy_in, source, path)

    async def copy_out(self, path: str, dest: Path) -> None:
        confine(self.root, path)
        await asyncio.to_thread(_copy_out, self.door, path, dest)


def _copy_out(door: Door, path: str, dest: Path) -> None:
    """A work-dir file to a host path the caller chose (its size when opened, no more)."""
    with door.open_regular(path) as (handle, size):
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            left = size
            while left > 0 and (chunk := handle.read(min(left, _CHUNK))):
                out.write(chunk)
                left -= len(chunk)


def _list_dir(door: Door, path: str) -> list[FileEntry]:
    rel = door.relative(path)
    inner = "" if rel in ("", ".") else "/".join(split(rel))
    st = door.lstat(inner) if inner else None
    if inner and st is None:
        raise FileNotFoundError(f"no such file or directory in the work dir: {path}")
    if st is not None and not stat.S_ISDIR(st.st_mode):  # a file, or a link listed as a link
        return [_entry(inner, st.st_mode, st.st_size)]
    entries = []
    for entry in door.scandir(inner):
        if not inner and entry.name == INTERNAL_DIR:  # kernelexec's own files
            continue
        rel_path = f"{inner}/{entry.name}" if inner else entry.name
        entries.append(_entry(rel_path, entry.mode, entry.size))
    return entries


def _entry(path: str, mode: int, size: int) -> FileEntry:
    return FileEntry(path=path, size=size, is_dir=stat.S_ISDIR(mode), is_link=stat.S_ISLNK(mode))


# -- through the kernel -----------------------------------------------------------------------
# Runs in the kernel: one function, a JSON string back. Errors come back as data (never as a
# kernel error output), so a failed transfer cannot disturb the session.
_KERNEL_HELPER = r"""
def __kx_files__(op, root, path, *args):
    import base64, json, os, stat
    def out(**kw):
        return json.dumps(kw)
    def regular(fd, name):
        # the door's rule: only regular files, told at once (a FIFO is opened O_NONBLOCK)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else (
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special")
            raise TypeError(name + " is " + kind + ", not a regular file; only regular "
                            "files are moved through the kernel")
        os.set_blocking(fd, True)
        return fd
    def opened(name, flags):
        return regular(os.open(name, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC), path)
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, path))
    if target != base and not target.startswith(base.rstrip(os.sep) + os.sep):
        return out(error="InvalidPath", message="path escapes the work dir: " + path)
    try:
        if op == "size":
            if os.path.isdir(target):
                return out(error="IsADirectoryError", message=path + " is a directory")
            with os.fdopen(opened(target, os.O_RDONLY), "rb") as f:
                return out(size=os.fstat(f.fileno()).st_size)
        if op == "read":
            with os.fdopen(opened(target, os.O_RDONLY), "rb") as f:
                f.seek(args[0])
                return out(data=base64.b64encode(f.read(args[1])).decode())
        if op == "write":
            os.makedirs(os.path.dirname(target) or base, exist_ok=True)
            partial = target + ".kx-partial"
            if not args[1]:  # a fresh partial file: whatever has the name goes (never opened)
                try:
                    os.unlink(partial)
                except FileNotFoundError:
                    pass
            flags = os.O_WRONLY | os.O_NOFOLLOW | (
                os.O_APPEND if args[1] else os.O_CREAT | os.O_EXCL)
            with os.fdopen(opened(partial, flags), "wb") as f:
                f.write(base64.b64decode(args[0]))
            return out(ok=True)
        if op == "commit":
            os.replace(target + ".kx-partial", target)
            return out(ok=True)
        if op == "list":
            names = [""] if os.path.isfile(target) else sorted(os.listdir(target))
            rows = []
            for n in names:
                p = os.path.join(target, n) if n else target
                if n == ".kernelexec" and target == base:
                    continue
                rows.append([os.path.relpath(p, base), os.path.getsize(p), os.path.isdir(p)])
            return out(entries=rows)
        return out(error="ValueError", message="unknown operation " + op)
    except TypeError as e:
        return out(error="UnsafePath", message=str(e))
    except OSError as e:
        kind = type(e).__name__ if type(e).__name__ in (
            "FileNotFoundError", "IsADirectoryError", "NotADirectoryError", "PermissionError"
        ) else "OSError"
        return out(error=kind, message=str(e))
"""

_ERRORS: dict[str, type[Exception]] = {
    "InvalidPath": InvalidPath,
    "UnsafePath": UnsafePath,
    "FileNotFoundError": FileNotFoundError,
    "IsADirectoryError": IsADirectoryError,
    "NotADirectoryError": NotADirectoryError,
    "PermissionError": PermissionError,
}

#: Runs ``code`` silently in the kernel, then evaluates ``expression``; returns its text/plain.
Evaluate = Callable[[str, str], Awaitable[str]]


def _unquoted(text: str) -> Any:
    """The string whose repr the kernel gave. A JSON answer (base64 data, quoted with ``"``)
    comes back in single quotes with no escape in it: its body as it is, where parsing it as
    a Python literal took 0.35 s of each 4 MiB chunk's 1.2 s on a loaded host."""
    body = text[1:-1]
    if len(text) >= 2 and text[0] == text[-1] == "'" and "\\" not in body and "'" not in body:
        return body
    return ast.literal_eval(text)


class KernelFiles:
    """The work dir of a kernel on another machine, reached through the kernel itself."""

    through_kernel = True

    def __init__(
        self,
        evaluate: Evaluate,
        root: str,
        *,
        limit: int = DEFAULT_TRANSFER_LIMIT,
        chunk: int = _CHUNK,
    ):
        self._evaluate = evaluate
        self.root = root
        self.limit = limit
        #: raw bytes per message of ``fetch`` / ``send`` (fewer round trips for big files)
        self.chunk = chunk

    async def read(self, path: str) -> bytes:
        check_relative(path)
        size = (await self._op("size", path))["size"]
        self._check_size(path, size)
        chunks = []
        for offset in range(0, size, _CHUNK) if size else ():
            answer = await self._op("read", path, offset, _CHUNK)
            chunks.append(base64.b64decode(answer["data"]))
        return b"".join(chunks)

    async def write(self, path: str, data: bytes | bytearray | memoryview) -> None:
        check_relative(path)
        self._check_size(path, len(data))
        for i, offset in enumerate(range(0, max(len(data), 1), _CHUNK)):
            chunk = base64.b64encode(data[offset : offset + _CHUNK]).decode()
            await self._op("write", path, chunk, i > 0)
        await self._op("commit", path)

    async def listing(self, path: str) -> list[FileEntry]:
        if path != ".":
            check_relative(path)
        rows = (await self._op("list", path))["entries"]
        return [FileEntry(path=str(p), size=int(s), is_dir=bool(d)) for p, s, d in rows]

    async def fetch(self, path: str, dest: BinaryIO) -> int:
        """Stream one file from the kernel into ``dest``, chunk by chunk (never whole in
        memory); the bytes copied. Stops at the size the kernel gave first."""
        check_relative(path)
        size = (await self._op("size", path))["size"]
        self._check_size(path, size)
        done = 0
        while done < size:
            answer = await self._op("read", path, done, min(self.chunk, size - done))
            chunk = base64.b64decode(answer["data"])[: size - done]
            if not chunk:
                break  # the file shrank while read: what there was
            dest.write(chunk)
            done += len(chunk)
        return done

    async def send(self, source: BinaryIO, path: str) -> None:
        """Stream ``source`` into the kernel's ``path`` chunk by chunk (replaced at the end)."""
        check_relative(path)
        first = True
        while True:
            data = source.read(self.chunk)
            if not data and not first:
                break
            await self._op("write", path, base64.b64encode(data).decode(), not first)
            first = False
        await self._op("commit", path)

    def _check_size(self, path: str, size: int) -> None:
        if size > self.limit:
            raise FileTooLarge(
                f"{path} is {size} bytes, past the {self.limit}-byte limit for files moved "
                "through a remote kernel"
            )

    async def _op(self, op: str, path: str, *args: Any) -> dict[str, Any]:
        call = ", ".join(repr(a) for a in (op, self.root, path, *args))
        text = await self._evaluate(_KERNEL_HELPER, f"__kx_files__({call})")
        answer: dict[str, Any] = json.loads(_unquoted(text))
        if "error" in answer:
            raise _ERRORS.get(answer["error"], OSError)(answer["message"])
        return answer
