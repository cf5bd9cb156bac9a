"""Kernels started before they are asked for, and many named sessions at once.

``AsyncKernelPool`` keeps kernels (from any ``KernelBackend`` factory: local, Docker, gateway)
started and idle, so handing a fresh kernel to a new conversation costs a dictionary pop and a
little set-up instead of a cold start. A kernel is used by one executor only: when that executor
closes, the kernel is shut down and a new one is started in the background.

``AsyncSessionManager`` maps names to executors, queues the calls made on one session so they never
interleave, culls sessions left idle, and refuses to hold more than its maximum.

``KernelPool`` and ``SessionManager`` are the synchronous twins: each drives its async core on an
event-loop thread of its own, so they can be called from any thread (or from inside a running
event loop, e.g. a notebook cell).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import queue
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ._errors import (
    ExecutorClosed,
    KernelStartFailed,
    PoolExhausted,
    SessionExists,
    SessionLimitReached,
    SessionNotFound,
)
from ._executor import AsyncExecutor, SyncExecutor
from ._kernel import AsyncKernelExecutor, KernelExecutor
from ._sync import SyncFront
from ._types import ExecutionResult
from .backends.base import KernelBackend, KernelClientLike
from .backends.local_kernel import LocalKernel

log = logging.getLogger(__name__)

BackendFactory = Callable[[], KernelBackend]
"""Builds one (unstarted) kernel back end, e.g. ``LocalKernel`` or ``DockerKernel``."""

ExecutorFactory = Callable[[], "AsyncExecutor | Awaitable[AsyncExecutor]"]
"""Builds the executor of a new session (may be a coroutine function, e.g. a pool's acquire)."""

_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class PoolOptions:
    """How many kernels a pool keeps, and how it prepares them.

    ``min_size`` kernels are kept started and idle; ``max_size`` bounds every kernel the pool
    has at once (idle, starting and handed out). ``warmup_code`` runs in each kernel before it is
    idle (e.g. ``"import numpy, pandas"``).
    """

    min_size: int = 1
    max_size: int = 4
    warmup_code: str | None = None
    start_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ValueError("max_size must be at least 1")
        if not 0 <= self.min_size <= self.max_size:
            raise ValueError("min_size must be between 0 and max_size")
        if self.start_timeout <= 0:
            raise ValueError("start_timeout must be positive")


@dataclass(frozen=True, kw_only=True)
class SessionOptions:
    """Limits of a session manager.

    A session unused for ``idle_timeout`` seconds is closed (None: never); the check runs every
    ``cull_interval`` seconds (default: a quarter of the idle timeout, at most a minute).
    """

    max_sessions: int = 16
    idle_timeout: float | None = 600.0
    cull_interval: float | None = None

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive (or None)")
        if self.cull_interval is not None and self.cull_interval <= 0:
            raise ValueError("cull_interval must be positive (or None)")

    @property
    def check_every(self) -> float | None:
        if self.idle_timeout is None:
            return None
        return self.cull_interval or min(self.idle_timeout / 4, 60.0)


# -- the pool ---------------------------------------------------------------------------------


#: how long after an acquire the pool starts its replacement (see ``_refill_later``)
REFILL_DELAY = 0.25


def _default_backend() -> KernelBackend:
    return LocalKernel()


class _PooledBackend(KernelBackend):
    """A pooled kernel's back end; its shutdown tells the pool the slot is free again."""

    def __init__(self, inner: KernelBackend, pool: AsyncKernelPool) -> None:
        self.inner = inner
        self.kind = inner.kind
        # What the executor asks of its back end is the inner one's: a pooled Docker or gateway
        # kernel gets no host environment, and a gateway's files still go through its kernel.
        self.inherits_host_env = inner.inherits_host_env
        self.shares_work_dir = inner.shares_work_dir
        self._pool = pool
        self._shut = False

    @property
    def workspace(self) -> str | None:
        return self.inner.workspace

    @property
    def client(self) -> KernelClientLike:
        return self.inner.client

    @property
    def runs_other_kernels(self) -> bool:
        return self.inner.runs_other_kernels

    def other_kernel(self, kernel_name: str) -> KernelBackend | None:
        # Another language's kernel is started on a session's first block of it, not pooled.
        return self.inner.other_kernel(kernel_name)

    def install_hint(self, kernel_name: str) -> str | None:
        return self.inner.install_hint(kernel_name)

    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        await self.inner.start(work_dir=work_dir, env=env, timeout=timeout)

    async def interrupt(self) -> None:
        await self.inner.interrupt()

    async def restart(self, *, timeout: float) -> None:
        await self.inner.restart(timeout=timeout)

    async def is_alive(self) -> bool:
        return await self.inner.is_alive()

    async def seems_gone(self) -> bool:
        return await self.inner.seems_gone()

    def death_reason(self) -> str | None:
        return self.inner.death_reason()

    async def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        try:
            await self.inner.shutdown()
        finally:
            self._pool._released(self)


class AsyncKernelPool:
    """Keeps kernel executors started (and warmed up) and idle; ``acquire`` hands one out.

    >>> async with AsyncKernelPool(options=PoolOptions(min_size=2)) as pool:  # doctest: +SKIP
    ...     executor = await pool.acquire()
    ...     await executor.execute("x = 1")
    ...     await executor.close()  # the kernel is shut down; a fresh one is started

    ``executor_options`` (timeout, env, output_limit, on_output, ...) go to every executor; each
    gets a work dir of its own.
    """

    def __init__(
        self,
        backend_factory: BackendFactory | None = None,
        *,
        options: PoolOptions | None = None,
        **executor_options: Any,
    ) -> None:
        if "work_dir" in executor_options or "backend" in executor_options:
            raise ValueError("each pooled kernel gets its own work_dir and back end")
        self.options = options or PoolOptions()
        self._factory = backend_factory or _default_backend
        self._executor_options: dict[str, Any] = {"startup_timeout": self.options.start_timeout}
        self._executor_options.update(executor_options)
        self._idle: deque[AsyncKernelExecutor] = deque()
        self._starting = 0
        self._lent: set[_PooledBackend] = set()
        self._lent_executors: weakref.WeakSet[AsyncKernelExecutor] = weakref.WeakSet()
        self._tasks: set[asyncio.Task[None]] = set()
        self._refill_handle: asyncio.TimerHandle | None = None
        self._changed: asyncio.Condition | None = None
        self._closed = False
        self.last_error: BaseException | None = None

    # -- public ---------------------------------------------------------------------------------
    @property
    def idle(self) -> int:
        """Kernels started and waiting."""
        return len(self._idle)

    @property
    def size(self) -> int:
        """Every kernel the pool has now: idle, starting and lent out."""
        return len(self._idle) + self._starting + len(self._lent)

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> None:
        """Begin filling the pool (in the background)."""
        self._check_open()
        self._refill()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until ``min_size`` kernels are idle (or the pool cannot get there)."""
        self._check_open()
        self._refill()  # an unstarted pool starts filling here
        cond = self._condition()
        async with cond:
            await asyncio.wait_for(cond.wait_for(self._ready_or_stuck), timeout)
        if len(self._idle) < self.options.min_size and self.last_error is not None:
            raise KernelStartFailed(f"the pool could not start kernels: {self.last_error}")

    async def acquire(self) -> AsyncKernelExecutor:
        """A started kernel executor no one else has used; ``PoolExhausted`` at ``max_size``.

        Closing the executor shuts its kernel down; the pool starts a fresh one.
        """
        self._check_open()
        executor = await self._take()
        assert isinstance(executor.backend, _PooledBackend)
        self._lent.add(executor.backend)
        self._lent_executors.add(executor)
        self._refill_later()
        return executor

    async def close(self) -> None:
        """Close every executor handed out and shut down every kernel. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._refill_handle is not None:
            self._refill_handle.cancel()
            self._refill_handle = None
        # Starts in flight are awaited, not cancelled: a kernel cancelled half-way through its
        # start can be left running with no one holding it. Each closes itself (closed pool).
        await asyncio.gather(*self._tasks, return_exceptions=True)
        cond = self._condition()
        async with cond:
            cond.notify_all()  # acquirers waiting for a refill see the pool closed
        idle, self._idle = list(self._idle), deque()
        executors = idle + list(self._lent_executors)
        await asyncio.gather(*(ex.close() for ex in executors), return_exceptions=True)

    async def __aenter__(self) -> AsyncKernelPool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- internals ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorClosed("the kernel pool is closed")

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def _ready_or_stuck(self) -> bool:
        enough = len(self._idle) >= self.options.min_size
        return enough or self._closed or (self._starting == 0 and self.last_error is not None)

    async def _take(self) -> AsyncKernelExecutor:
        """An idle kernel that is still alive (one can die while it waits: killed, out of
        memory, or its fork server stopped by ``stop_fork_servers()``), else a new one."""
        while True:
            executor = await self._take_any()
            if await executor.backend.is_alive():
                return executor
            reason = executor.backend.death_reason() or "it is not running"
            log.warning("an idle kernel of the pool had died (%s); taking another", reason)
            with contextlib.suppress(Exception):
                await executor.close()
            self._refill_later()

    async def _take_any(self) -> AsyncKernelExecutor:
        cond = self._condition()
        async with cond:
            while True:
                self._check_open()
                if self._idle:
                    return self._idle.popleft()
                if self._starting:  # a refill is on its way: wait for it rather than start two
                    await cond.wait()
                    continue
                if self.size >= self.options.max_size:
                    raise PoolExhausted(
                        f"all {self.options.max_size} kernels of the pool are in use"
                    )
                break
        # Nothing idle or starting: start one for this caller (its errors are the caller's).
        self._starting += 1
        try:
            return await self._start_one()
        finally:
            self._starting -= 1

    def _refill_later(self) -> None:
        """Refill after ``REFILL_DELAY``: a kernel's launch forks a process on this loop
        (jupyter_client's Popen), which held up the first block of the executor just handed
        out by 20 to 40 ms (measured: a new MCP session's first call)."""
        if self._refill_handle is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._refill_handle = loop.call_later(REFILL_DELAY, self._refill_now)

    def _refill_now(self) -> None:
        self._refill_handle = None
        self._refill()

    def _refill(self) -> None:
        if self._closed:
            return
        want = self.options.min_size - len(self._idle) - self._starting
        room = self.options.max_size - self.size
        for _ in range(max(0, min(want, room))):
            self._starting += 1
            task = asyncio.create_task(self._refill_one(), name="kernelexec-pool-refill")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _refill_one(self) -> None:
        executor: AsyncKernelExecutor | None = None
        try:
            executor = await self._start_one()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # kept for wait_ready and logged; acquire starts its own
            self.last_error = exc
            log.warning("kernel pool: starting a kernel failed: %s", exc)
        finally:
            self._starting -= 1
        if executor is not None and self._closed:
            await executor.close()
            return
        cond = self._condition()
        async with cond:
            if executor is not None:
                self._idle.append(executor)
                self.last_error = None
            cond.notify_all()

    async def _start_one(self) -> AsyncKernelExecutor:
        backend = _PooledBackend(self._factory(), self)
        executor = AsyncKernelExecutor(backend, **self._executor_options)
        try:
            await executor.start()
            if self.options.warmup_code:
                code, timeout = self.options.warmup_code, self.options.start_timeout
                await run_silently(backend.client, code, timeout)
        except BaseException:
            await executor.close()
            await backend.shutdown()  # close() skips it when start() did not finish
            raise
        return executor

    def _released(self, backend: _PooledBackend) -> None:
        if backend in self._lent:  # only a kernel that was handed out frees a slot
            self._lent.discard(backend)
            self._refill()


async def run_silently(client: KernelClientLike, code: str, timeout: float) -> None:
    """Run set-up code on a kernel and wait until it is idle again; a failure is a start failure.

    Waits for the iopub ``idle`` of the request too, so none of its messages are left queued
    for the executor that gets the kernel next.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    msg_id = client.execute(code, silent=True, store_history=False)
    reply: dict[str, Any] | None = None
    idle = False
    while reply is None or not idle:
        left = deadline - loop.time()
        if left <= 0:
            raise KernelStartFailed(f"warm-up code did not finish within {timeout:g} s")
        get = client.get_shell_msg if reply is None else client.get_iopub_msg
        try:
            msg = await get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if reply is None:
            reply = msg
        else:
            content = msg.get("content", {})
            idle = msg.get("msg_type") == "status" and content.get("execution_state") == "idle"
    content = reply.get("content", {})
    if content.get("status") != "ok":
        raise KernelStartFailed(
            f"warm-up code failed: {content.get('ename')}: {content.get('evalue')}"
        )


# -- sessions ---------------------------------------------------------------------------------


def _idle_since(session: _Session, now: float) -> float:
    """Seconds since the session was last used; a job running or just ended is use."""
    if session.executor.jobs:
        return 0.0
    return now - max(session.last_used, session.executor.last_job_end)


@dataclass(eq=False)
class _Session:
    name: str
    executor: AsyncExecutor
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False


class AsyncSessionManager:
    """Many named sessions, each its own executor.

    Calls on one session run one at a time, in the order they were made; calls on different
    sessions run concurrently. Sessions idle for ``idle_timeout`` are closed; using one afterwards
    raises ``SessionNotFound`` saying so.

    ``executor_factory`` builds a session's executor (default: a local kernel executor with
    ``executor_options``); give ``pool=`` to take kernels from a pool instead.
    """

    def __init__(
        self,
        executor_factory: ExecutorFactory | None = None,
        *,
        pool: AsyncKernelPool | None = None,
        options: SessionOptions | None = None,
        **executor_options: Any,
    ) -> None:
        if executor_factory is not None and pool is not None:
            raise ValueError("give either executor_factory= or pool=, not both")
        self.options = options or SessionOptions()
        self.pool = pool
        self._factory = executor_factory or self._default_factory
        self._executor_options = executor_options
        self._sessions: dict[str, _Session] = {}
        self._reserved = 0
        self._culled: OrderedDict[str, None] = OrderedDict()
        self._culler: asyncio.Task[None] | None = None
        self._dropping: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- public ---------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._sessions)

    def __contains__(self, name: object) -> bool:
        return name in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    async def create(self, name: str) -> AsyncExecutor:
        """Start a new session; ``SessionLimitReached`` at the maximum, ValueError if it exists."""
        self._check_open()
        if name in self._sessions:
            raise SessionExists(f"session {name!r} already exists")
        if len(self._sessions) + self._reserved >= self.options.max_sessions:
            raise SessionLimitReached(
                f"the session manager holds its maximum of {self.options.max_sessions} sessions"
            )
        self._reserved += 1  # counted while the executor starts, so a burst cannot overshoot
        try:
            executor = await self._new_executor()
        finally:
            self._reserved -= 1
        if self._closed or name in self._sessions:
            await executor.close()
            self._check_open()
            raise SessionExists(f"session {name!r} already exists")
        self._sessions[name] = _Session(name=name, executor=executor)
        self._culled.pop(name, None)
        self._ensure_culler()
        return executor

    async def adopt(self, name: str, executor: AsyncExecutor) -> None:
        """Hold an executor made elsewhere (a fork of a session) as session ``name``; it is
        closed with the session. ``SessionLimitReached`` / ``SessionExists`` as for ``create``."""
        self._check_open()
        if name in self._sessions:
            raise SessionExists(f"session {name!r} already exists")
        if len(self._sessions) + self._reserved >= self.options.max_sessions:
            raise SessionLimitReached(
                f"the session manager holds its maximum of {self.options.max_sessions} sessions"
            )
        self._sessions[name] = _Session(name=name, executor=executor)
        self._culled.pop(name, None)
        self._ensure_culler()

    async def get_or_create(self, name: str) -> AsyncExecutor:
        session = self._sessions.get(name)
        return session.executor if session is not None else await self.create(name)

    def executor(self, name: str) -> AsyncExecutor:
        """The session's executor (calls made on it directly bypass the session's queue)."""
        return self._lookup(name).executor

    async def execute(
        self, name: str, code: str, language: str = "python", *, timeout: float | None = None
    ) -> ExecutionResult:
        """Run a block in a session, after every call made on it before."""
        return await self._locked(name, lambda ex: ex.execute(code, language, timeout=timeout))

    async def execute_message(
        self, name: str, message: Any, *, timeout: float | None = None
    ) -> ExecutionResult:
        return await self._locked(name, lambda ex: ex.execute_message(message, timeout=timeout))

    async def restart(self, name: str) -> None:
        await self._locked(name, lambda ex: ex.restart())

    async def close_session(self, name: str) -> None:
        session = self._lookup(name)
        async with session.lock:
            await self._drop(session)

    async def cull_idle(self) -> list[str]:
        """Close sessions unused for longer than ``idle_timeout``; returns their names."""
        limit = self.options.idle_timeout
        if limit is None:
            return []
        now = time.monotonic()
        stale = [
            s
            for s in self._sessions.values()
            if not s.lock.locked() and _idle_since(s, now) > limit
        ]
        for session in stale:
            self._remember_culled(session.name)
        closing = [self._drop_soon(s) for s in stale]
        # Shielded: stopping the culler must not cut a kernel's shutdown in half (close()
        # waits for these instead).
        await asyncio.shield(asyncio.gather(*closing, return_exceptions=True))
        return [s.name for s in stale]

    async def start(self) -> None:
        """Nothing to start ahead of use (sessions start on ``create``); checks it is open."""
        self._check_open()

    async def close(self) -> None:
        """Close every session (and stop culling). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._culler is not None:
            self._culler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._culler
        for session in list(self._sessions.values()):
            self._drop_soon(session)
        await asyncio.gather(*self._dropping, return_exceptions=True)

    async def __aenter__(self) -> AsyncSessionManager:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- internals ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorClosed("the session manager is closed")

    def _default_factory(self) -> AsyncExecutor | Awaitable[AsyncExecutor]:
        if self.pool is not None:
            return self.pool.acquire()
        return AsyncKernelExecutor(**self._executor_options)

    async def _new_executor(self) -> AsyncExecutor:
        made = self._factory()
        executor = await made if inspect.isawaitable(made) else made
        try:
            await executor.start()
        except BaseException:
            await executor.close()
            raise
        return executor

    def _lookup(self, name: str) -> _Session:
        self._check_open()
        session = self._sessions.get(name)
        if session is None:
            raise self._not_found(name)
        return session

    def _not_found(self, name: str) -> SessionNotFound:
        if name in self._culled:
            return SessionNotFound(
                f"session {name!r} was closed after {self.options.idle_timeout:g} s idle"
            )
        return SessionNotFound(f"no session named {name!r}")

    async def _locked(self, name: str, call: Callable[[AsyncExecutor], Awaitable[_T]]) -> _T:
        session = self._lookup(name)
        async with session.lock:
            if session.closed:  # culled or closed while this call waited its turn
                raise self._not_found(name)
            try:
                return await call(session.executor)
            finally:
                session.last_used = time.monotonic()

    def _drop_soon(self, session: _Session) -> asyncio.Task[None]:
        task = asyncio.create_task(self._drop(session), name=f"kernelexec-close-{session.name}")
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)
        return task

    async def _drop(self, session: _Session) -> None:
        session.closed = True
        if self._sessions.get(session.name) is session:
            del self._sessions[session.name]
        await session.executor.close()

    def _remember_culled(self, name: str) -> None:
        self._culled[name] = None
        while len(self._culled) > 10_000:  # a long-lived service must not grow without bound
            self._culled.popitem(last=False)

    def _ensure_culler(self) -> None:
        every = self.options.check_every
        if every is not None and self._culler is None:
            self._culler = asyncio.create_task(self._cull_forever(every), name="kernelexec-cull")

    async def _cull_forever(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                culled = await self.cull_idle()
            except Exception:  # a failing close must not stop culling
                log.exception("session manager: culling failed")
                continue
            if culled:
                log.info("session manager: culled idle sessions %s", culled)


# -- synchronous twins ------------------------------------------------------------------------


class KernelPool(SyncFront[AsyncKernelPool]):
    """Synchronous kernel pool; ``acquire`` returns a synchronous kernel executor.

    Takes ``AsyncKernelPool``'s arguments. Like an executor it starts filling in ``with`` (or
    ``start()``); ``acquire`` works either way.

    >>> with KernelPool(options=PoolOptions(min_size=1, max_size=2)) as pool:  # doctest: +SKIP
    ...     with pool.acquire() as executor:
    ...         executor.execute("print(1)").output
    '1\\n'
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(AsyncKernelPool(*args, **kwargs))

    @property
    def options(self) -> PoolOptions:
        return self.aio.options

    @property
    def idle(self) -> int:
        return self.aio.idle

    @property
    def size(self) -> int:
        return self.aio.size

    def wait_ready(self, timeout: float | None = None) -> None:
        self._call(self.aio.wait_ready, timeout)

    def acquire(self) -> KernelExecutor:
        """A started executor, driven on the pool's loop (where its kernel lives)."""
        executor = SyncExecutor.wrap(self._call(self.aio.acquire), portal=self._portal)
        assert isinstance(executor, KernelExecutor)
        return executor


class SessionManager(SyncFront[AsyncSessionManager]):
    """Synchronous session manager, safe to call from many threads at once.

    Takes the same arguments as ``AsyncSessionManager``; a ``KernelPool`` may be given as
    ``pool=`` (its async core is used, on the pool's own event-loop thread).
    """

    def __init__(self, *args: Any, pool: KernelPool | None = None, **kwargs: Any) -> None:
        # A pool's kernels live on its event loop, so the sessions share that loop.
        core = AsyncSessionManager(*args, pool=None if pool is None else pool.aio, **kwargs)
        super().__init__(core, portal=None if pool is None else pool._portal)

    @property
    def options(self) -> SessionOptions:
        return self.aio.options

    def names(self) -> list[str]:
        return self.aio.names()

    def __contains__(self, name: object) -> bool:
        return name in self.aio

    def __len__(self) -> int:
        return len(self.aio)

    def create(self, name: str) -> None:
        self._call(self.aio.create, name)

    def get_or_create(self, name: str) -> None:
        self._call(self.aio.get_or_create, name)

    def execute(
        self, name: str, code: str, language: str = "python", *, timeout: float | None = None
    ) -> ExecutionResult:
        return self._call(self.aio.execute, name, code, language, timeout=timeout)

    def execute_message(
        self, name: str, message: Any, *, timeout: float | None = None
    ) -> ExecutionResult:
        return self._call(self.aio.execute_message, name, message, timeout=timeout)

    def restart(self, name: str) -> None:
        self._call(self.aio.restart, name)

    def close_session(self, name: str) -> None:
        self._call(self.aio.close_session, name)

    def cull_idle(self) -> list[str]:
        return self._call(self.aio.cull_idle)
