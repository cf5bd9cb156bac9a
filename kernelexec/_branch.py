"""What forks and live snapshots of a kernel session share: the work-dir copy, the handles.

The kernel side of a fork is ``backends/forked_kernel.py``; the executor side (``fork()``,
``snapshot()``, ``restore()``) is in ``_kernel.py``. Here: copying a work dir from one executor
to another through their doors (regular files and folders only: a link, FIFO or device the code
planted is never followed nor copied), and the snapshot handle a caller holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._door import Door
from ._errors import InvalidPath, SnapshotError
from ._workdir import INTERNAL_DIR

_T = TypeVar("_T")

_COPY_CHUNK = 1 << 20
#: back ends whose kernel process kernelexec forks (``fork()``, live snapshots)
FORKABLE = (
    "local-kernel",
    "fork-kernel",
    "forked-kernel",
    "sandboxed-kernel",
    "sandboxed-forked-kernel",
    "docker-kernel",
    "docker-forked-kernel",
)


def _skip(rel: str) -> bool:
    return rel == INTERNAL_DIR or rel.startswith(INTERNAL_DIR + "/")


def copy_work_dir(
    source: Door, dest: Door, *, replace: bool = False, owner: tuple[int, int] | None = None
) -> int:
    """Copy every regular file and folder of ``source``'s work dir into ``dest``'s (kernelexec's
    own folder excluded); with ``replace``, what ``dest`` held is removed first. Links, FIFOs,
    sockets and devices are skipped (never followed). ``owner``: (uid, gid) each copy is given
    to (a sandbox's user, who must write its files), through the door (a link is never
    followed). Returns the number of files copied."""
    if replace:
        empty_work_dir(dest)
    copied = 0
    for rel, entry in source.walk(skip=_skip):
        try:
            if entry.is_dir:
                dest.makedirs(rel)
            elif entry.is_file:
                with source.open_regular(rel) as (src, _), dest.replacing(rel) as dst:
                    shutil.copyfileobj(src, dst, _COPY_CHUNK)
                copied += 1
            if owner is not None:
                dest.chown(rel, *owner)
        except (OSError, InvalidPath):
            continue  # removed meanwhile, or a planted link: not copied
    return copied


def empty_work_dir(door: Door) -> None:
    """Everything in the work dir but kernelexec's own folder, removed without following a
    link (a link is removed as a link)."""
    root = door.root
    for entry in door.scandir():
        if entry.name == INTERNAL_DIR:
            continue
        path = root / entry.name
        if entry.is_dir:
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def pause(pid: int | None, *, paused: bool) -> None:
    """Stop (or continue) a snapshot's kernel and everything in its process group."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGSTOP if paused else signal.SIGCONT)


class AsyncLiveSnapshot:
    """A live snapshot of a kernel session: a paused forked copy of its kernel (copy-on-write)
    and a copy of its work dir. ``restore`` it into its session (or a fork of it) any number of
    times; ``release()`` frees it. Taken with ``AsyncKernelExecutor.snapshot()``."""

    def __init__(
        self,
        holder: Any,
        *,
        lineage: object,
        kind: str,
        release: Callable[[], Awaitable[None]],
    ) -> None:
        self._holder = holder  # the paused copy's executor (private: never runs a block)
        self._lineage = lineage
        #: the back end kind of the session it was taken from
        self.kind = kind
        #: when it was taken (``time.time()``)
        self.taken_at = time.time()
        #: what it is, in a result's words (``recovered_from``)
        self.label = "live snapshot"
        self._release = release
        self._released = False
        # The paused copy's kernel client lives on the loop it was taken on (the session's):
        # a fork of the session restoring it, on a loop of its own, asks it there.
        self._loop = asyncio.get_running_loop()

    @property
    def released(self) -> bool:
        return self._released

    async def release(self) -> None:
        """Free the snapshot: its paused kernel is ended, its work-dir copy removed. Twice is
        fine; restoring it afterwards is ``SnapshotError``."""
        if self._released:
            return
        self._released = True
        await self.at_home(self._release)

    async def at_home(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """``fn()`` run on the loop the snapshot was taken on, from any loop."""
        if self._loop is asyncio.get_running_loop():
            return await fn()
        if self._loop.is_closed() or not self._loop.is_running():
            raise SnapshotError("the session this snapshot was taken from has ended")
        future = asyncio.run_coroutine_threadsafe(_call(fn), self._loop)
        return await asyncio.wrap_future(future)

    def __repr__(self) -> str:
        state = "released" if self._released else "live"
        return f"<AsyncLiveSnapshot of a {self.kind} session, {state}>"


async def _call(fn: Callable[[], Awaitable[_T]]) -> _T:
    return await fn()


class LiveSnapshot:
    """The synchronous handle of a live snapshot (``KernelExecutor.snapshot()``)."""

    def __init__(self, core: AsyncLiveSnapshot, call: Callable[..., Any]) -> None:
        self.aio = core
        self._call = call

    @property
    def kind(self) -> str:
        return self.aio.kind

    @property
    def taken_at(self) -> float:
        return self.aio.taken_at

    @property
    def released(self) -> bool:
        return self.aio.released

    def release(self) -> None:
        """Free the snapshot (see ``AsyncLiveSnapshot.release``)."""
        self._call(self.aio.release)

    def __repr__(self) -> str:
        state = "released" if self.released else "live"
        return f"<LiveSnapshot of a {self.kind} session, {state}>"
