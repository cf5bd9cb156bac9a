"""Run an async core from synchronous code, even inside a running event loop.

Each synchronous executor owns an anyio blocking portal: an event loop in a thread of its own.
Calls are handed to that loop and waited for, so the caller's thread may itself be running a loop
(a Jupyter notebook cell) without ``nest_asyncio`` or "event loop is already running" errors.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

T = TypeVar("T")


class Portal:
    """A private event-loop thread; ``call`` runs a coroutine function on it and waits."""

    def __init__(self, name: str) -> None:
        self._cm: AbstractContextManager[BlockingPortal] = start_blocking_portal(name=name)
        self._portal: BlockingPortal | None = self._cm.__enter__()

    @property
    def running(self) -> bool:
        return self._portal is not None

    def call(self, func: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        if self._portal is None:
            raise RuntimeError("the executor's event-loop thread has stopped")
        return self._portal.call(functools.partial(func, *args, **kwargs))

    def stop(self) -> None:
        portal, self._portal = self._portal, None
        if portal is not None:
            self._cm.__exit__(None, None, None)


def close_on_collect(
    owner: object, portal: Portal, close: Callable[[], Awaitable[None]]
) -> weakref.finalize[Any, Any]:
    """Close the core and stop the portal if ``owner`` is collected (or at exit) unclosed.

    ``close`` is the core's bound ``close``; the finalizer holds the core, never ``owner``.
    """
    return weakref.finalize(owner, _finalize, portal, close)


def _finalize(portal: Portal, close: Callable[[], Awaitable[None]]) -> None:
    try:
        if portal.running:
            portal.call(close)
    finally:
        portal.stop()
