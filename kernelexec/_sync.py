"""The one sync front: run an async core from synchronous code, even inside a running loop.

Each synchronous front (executor, pool, session manager) owns a ``Portal``: an asyncio event
loop in a thread of its own. Calls are handed to that loop and waited for, so the caller's thread
may itself be running a loop (a Jupyter notebook cell) without ``nest_asyncio`` or "event loop is
already running" errors.

Why not anyio's ``BlockingPortal``: measured on these machines, a trivial kernel round trip took
about 2 ms longer through it than through ``asyncio.run_coroutine_threadsafe`` on a plain loop
thread (6.1 ms against 4.1 ms), which alone would break the stateful executor's overhead target.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from ._errors import ExecutorClosed, ReentrantCall
from ._render import PUMP_INTERVAL, pumps

T = TypeVar("T")


class Portal:
    """A private event-loop thread; ``call`` runs a coroutine function on it and waits."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped = False
        # A child forked from this process (os.fork, multiprocessing's fork start) inherits the
        # portal but not its thread: there it is closed, and its front's close at exit does
        # nothing (waiting for the missing thread hung the child; the kernels are the parent's).
        self._owner = os.getpid()
        # Daemon: an executor the caller forgot to close must not keep the interpreter alive;
        # its finalizer (see close_on_collect) still closes it at exit.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    @property
    def running(self) -> bool:
        return not self._stopped and os.getpid() == self._owner

    def check(self, closed: str = "the event-loop thread has stopped") -> None:
        """Raise ExecutorClosed (saying ``closed``) unless calls can run here."""
        if os.getpid() != self._owner:
            raise ExecutorClosed(
                f"it was made in process {self._owner}, and this process was forked from that"
                " one: a forked child cannot use it; make a new one here"
            )
        if self._stopped:
            raise ExecutorClosed(closed)

    def call(self, func: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        self.check()
        if threading.current_thread() is self._thread:
            # e.g. an on_output callback calling the sync API: waiting here would deadlock.
            raise ReentrantCall("a synchronous executor cannot be called from its own callbacks")
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(func, args, kwargs), self._loop)
        try:
            _wait_showing(future)
            return future.result()
        except BaseException:
            # KeyboardInterrupt in the caller (or any error): do not leave the work running.
            future.cancel()
            raise

    def submit(
        self, func: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Start ``func`` on this loop and return at once (await it with ``asyncio.wrap_future``
        from another loop; cancelling that future cancels the work here)."""
        self.check()
        return asyncio.run_coroutine_threadsafe(_as_coroutine(func, args, kwargs), self._loop)

    def stop(self) -> None:
        """Cancel what is still running, close the loop and join the thread. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if os.getpid() != self._owner:
            return  # the loop and its thread are the parent's
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_forever()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        loop = self._loop
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


async def _as_coroutine(
    func: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    return await func(*args, **kwargs)


class _Core(Protocol):
    """What a sync front needs of its async core."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


C = TypeVar("C", bound=_Core)
_F = TypeVar("_F", bound="SyncFront[Any]")


class SyncFront(Generic[C]):
    """The synchronous face of an async core: every call runs on the core's event-loop thread.

    The one sync front: executors, pools and session managers all derive from it, so starting,
    calling and closing work the same way for each. A front owns its portal, or shares another
    front's (an executor lent by a pool runs on the pool's loop, where its kernel lives): closing
    a front closes its core, and stops the portal only if the front owns it. An unclosed front
    is closed when collected or at interpreter exit.
    """

    def __init__(self, core: C, *, portal: Portal | None = None) -> None:
        owns_portal = portal is None
        self._portal = portal or Portal(name=f"kernelexec-{type(core).__name__}")
        self._core = core
        self._finalizer = weakref.finalize(self, _finalize, self._portal, core.close, owns_portal)

    @property
    def aio(self) -> C:
        """The async core (for callers that have an event loop of their own)."""
        return self._core

    def start(self) -> None:
        """Start the core now (otherwise it starts on first use, or in ``with``)."""
        self._call(self._core.start)

    def close(self) -> None:
        """Close the core (and stop the event-loop thread if this front owns it). Idempotent."""
        self._finalizer()

    def __enter__(self: _F) -> _F:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, func: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Run ``func(*args, **kwargs)`` on the core's loop and wait for it."""
        self._portal.check(f"{type(self).__name__} is closed")
        return self._portal.call(func, *args, **kwargs)


def _wait_showing(future: concurrent.futures.Future[Any]) -> None:
    """Wait for ``future``; meanwhile show, from this thread, what live displays made here
    received from the loop's thread (a notebook cell's outputs must come from the cell)."""
    live = pumps()
    while live and not future.done():
        concurrent.futures.wait([future], timeout=PUMP_INTERVAL)
        for display in live:
            display.flush()


def _finalize(portal: Portal, close: Callable[[], Awaitable[None]], stop_portal: bool) -> None:
    try:
        if portal.running:
            portal.call(close)
    finally:
        if stop_portal:
            portal.stop()
