"""The MCP server's sessions: named executors, a warm pool behind them, and their files.

``Hub`` is transport-free (no ``mcp`` import): the server maps tools onto it one to one. A session
is created by the first ``execute`` that names it; every other call on an unknown name fails with
``SessionNotFound`` listing the sessions there are. Kernel executors come from an
``AsyncKernelPool`` kept ``warm`` kernels ahead of use, so a new session does not wait for a cold
start. A call whose caller goes away mid-block interrupts the block and waits for it to end, so
nothing keeps running behind a client that left. A detached block (a job, ``submit``) is the
exception, by request: it belongs to its session, not to a connection, and runs on after the
client leaves; any client reads it by id.
"""

from __future__ import annotations

import asyncio
import logging
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio

from .._door import Door
from .._errors import (
    ForkUnsupported,
    InvalidBlock,
    JobNotFound,
    SessionExists,
    SessionLimitReached,
    SessionNotFound,
    SnapshotError,
)
from .._executor import AsyncExecutor, check_timeout, error_result
from .._jobs import AsyncJob, JobStatus
from .._registry import EXECUTORS, executor_entry, make_async_executor
from .._types import ExecutionResult, NbOutput
from .._workdir import INTERNAL_DIR, resolve_inside
from ..backends.base import KernelBackend
from ..pool import AsyncKernelPool, AsyncSessionManager, PoolOptions, SessionOptions

log = logging.getLogger(__name__)

#: executor names whose sessions are kernels, so they can come from a warm pool
POOLED = ("kernel", "docker-kernel", "gateway")
#: where a session's notebook is written (inside its work dir)
NOTEBOOK_NAME = "session.ipynb"
#: list_files gives at most this many files
_MAX_LISTED = 1000
#: jobs the hub remembers (ended ones stay readable); past it the oldest ended are forgotten
MAX_KEPT_JOBS = 200
#: how long a block gets to end after the interrupt sent when its caller left
_STOP_GRACE = 10.0

OutputListener = Callable[[NbOutput], None]


@dataclass(frozen=True, kw_only=True)
class HubOptions:
    """What the server runs blocks in, and its limits.

    ``executor`` is a registry name; ``executor_options`` are its options (``image=`` for
    Docker, ``url=`` / ``token=`` / ``user=`` / ``working_dir=`` for a gateway). ``warm``
    kernels are kept started ahead of use (kernel executors only). ``timeout`` is a block's
    default limit.
    """

    executor: str = "kernel"
    timeout: float = 60.0
    max_sessions: int = 8
    idle_timeout: float | None = 1800.0
    warm: int = 1
    executor_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        executor_entry(self.executor)  # UnknownExecutor lists the valid names
        check_timeout(self.timeout)
        if self.warm < 0:
            raise ValueError("warm must be 0 or more")
        SessionOptions(max_sessions=self.max_sessions, idle_timeout=self.idle_timeout)


@dataclass(eq=False)
class _Record:
    name: str
    executor: AsyncExecutor
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    blocks: int = 0
    busy: bool = False
    listener: OutputListener | None = None
    run: asyncio.Future[ExecutionResult] | None = None  # the block running now
    stopped: bool = False  # its process was stopped by interrupt() (stateless executors)
    notebook_dirty: bool = False


def _backend_factory(name: str, options: dict[str, Any]) -> Callable[[], KernelBackend]:
    """A factory of unstarted back ends for a pooled executor; pops the back-end options."""
    if name == "kernel":
        from ..backends.local_kernel import LocalKernel

        local = {k: options.pop(k) for k in ("kernel_name", "python") if k in options}
        return lambda: LocalKernel(**local)
    if name == "docker-kernel":
        import dataclasses

        from ..backends._docker_options import DockerOptions
        from ..backends.docker_kernel import DockerKernel

        names = {f.name for f in dataclasses.fields(DockerOptions)} | {"options"}
        docker = {k: options.pop(k) for k in list(options) if k in names}
        return lambda: DockerKernel(**docker)
    from ..backends.gateway_kernel import GatewayKernel

    url = options.pop("url")
    token, user = options.pop("token", None), options.pop("user", None)
    working_dir = options.pop("working_dir", None)
    return lambda: GatewayKernel(url, token=token, username=user, working_dir=working_dir)


class Hub:
    """Named sessions for the MCP tools (async; use it on one event loop)."""

    def __init__(self, options: HubOptions | None = None) -> None:
        self.options = options or HubOptions()
        opts = dict(self.options.executor_options)
        opts.setdefault("timeout", self.options.timeout)
        limits = SessionOptions(
            max_sessions=self.options.max_sessions, idle_timeout=self.options.idle_timeout
        )
        self.pool: AsyncKernelPool | None = None
        if self.options.executor in POOLED:
            factory = _backend_factory(self.options.executor, opts)
            warm = min(self.options.warm, self.options.max_sessions)
            sizes = PoolOptions(min_size=warm, max_size=self.options.max_sessions + warm)
            self.pool = AsyncKernelPool(factory, options=sizes, **opts)
            self.manager = AsyncSessionManager(pool=self.pool, options=limits)
        else:
            name = self.options.executor
            self.manager = AsyncSessionManager(
                lambda: make_async_executor(name, **opts), options=limits
            )
        self._records: dict[str, _Record] = {}
        self._creating: dict[str, asyncio.Task[_Record]] = {}
        self._jobs: dict[str, tuple[str, AsyncJob]] = {}  # job id -> its session, the job
        self._snapshots: dict[str, Any] = {}  # id -> a live snapshot (released with its session)

    @property
    def stateful(self) -> bool:
        return EXECUTORS[self.options.executor].stateful

    # -- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start filling the warm pool (in the background)."""
        if self.pool is not None:
            await self.pool.start()

    async def close(self) -> None:
        """Close every session (their work dirs go with them) and every kernel.

        Sessions and the pool close side by side: a client gives a stdio server two seconds
        after closing its stdin, and the pool may first have to wait out a kernel's start.
        """
        closing = [self.manager.close()]
        if self.pool is not None:
            closing.append(self.pool.close())
        outcomes = await asyncio.gather(*closing, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def __aenter__(self) -> Hub:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):  # a cancelled server still shuts its kernels down
            await self.close()

    # -- sessions --------------------------------------------------------------------------
    def names(self) -> list[str]:
        return [name for name in self._records if name in self.manager]

    def describe(self) -> list[dict[str, Any]]:
        """One entry per live session, for ``list_sessions``."""
        now = time.monotonic()
        return [
            {
                "session": r.name,
                "executor": self.options.executor,
                "work_dir": str(r.executor.work_dir),
                "blocks": r.blocks,
                "busy": r.busy,
                "idle_s": round(now - r.last_used, 1),
            }
            for r in self._records.values()
            if r.name in self.manager
        ]

    def record(self, name: str) -> _Record:
        """The live session ``name``; ``SessionNotFound`` says why not and lists the others."""
        record = self._records.get(name)
        if record is not None and name in self.manager:
            return record
        if record is not None:  # the manager culled it: say so once, then forget the name
            del self._records[name]
            why = f"session {name!r} was closed"
            try:
                self.manager.executor(name)  # raises, saying why (e.g. "after 600 s idle")
            except SessionNotFound as exc:
                why = str(exc)
            raise SessionNotFound(
                f"{why}; its variables and files are gone. execute() with this name starts a "
                f"new session. {self._listing()}"
            )
        raise SessionNotFound(f"no session named {name!r}. {self._listing()}")

    def _listing(self) -> str:
        names = self.names()
        return f"Sessions: {', '.join(names)}." if names else "There are no sessions yet."

    async def open(self, name: str) -> Path:
        """Session ``name``, started if new (or culled); returns its work dir."""
        return (await self._get_or_create(name)).executor.work_dir

    async def _get_or_create(self, name: str) -> _Record:
        if name in self._records:
            return self.record(name)
        if not name or len(name) > 100:
            raise InvalidBlock("a session name is 1 to 100 characters")
        task = self._creating.get(name)
        if task is None:
            task = asyncio.ensure_future(self._create(name))
            self._creating[name] = task
            task.add_done_callback(lambda _: self._creating.pop(name, None))
        return await asyncio.shield(task)

    async def _create(self, name: str) -> _Record:
        try:
            executor = await self.manager.create(name)
        except SessionLimitReached as exc:
            raise SessionLimitReached(f"{exc}; close one first. {self._listing()}") from None
        return self._hold(name, executor)

    def _hold(self, name: str, executor: AsyncExecutor) -> _Record:
        record = _Record(name=name, executor=executor)

        def forward(output: NbOutput) -> None:
            if record.listener is not None:
                record.listener(output)

        executor.on_output = forward
        self._records[name] = record
        return record

    # -- tools -----------------------------------------------------------------------------
    async def execute(
        self,
        name: str,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
        on_output: OutputListener | None = None,
    ) -> tuple[ExecutionResult, Path]:
        """Run a block in session ``name`` (created if new); returns the result and work dir.

        If the caller is cancelled mid-block, the block is interrupted and awaited (a stateless
        executor's process is stopped) before the cancellation goes on.
        """
        record = await self._get_or_create(name)
        async with record.lock:
            record.busy, record.listener = True, on_output
            run = asyncio.ensure_future(self.manager.execute(name, code, language, timeout=timeout))
            record.run, record.stopped = run, False
            try:
                result = await asyncio.shield(run)
            except asyncio.CancelledError:
                if not (record.stopped and run.cancelled()):  # the caller was cancelled
                    with anyio.CancelScope(shield=True):
                        await self._stop(record, run)
                    raise
                message = "Interrupted: the block's process was stopped."
                result = error_result(message, language=language, ename="KeyboardInterrupt")
            finally:
                record.busy, record.listener, record.run = False, None, None
                record.last_used = time.monotonic()
            record.blocks += 1
            record.notebook_dirty = True
            return result, record.executor.work_dir

    async def submit(
        self, name: str, code: str, language: str = "python", *, timeout: float | None = None
    ) -> AsyncJob:
        """Start a block in session ``name`` (created if new) as a job; returns at once."""
        record = await self._get_or_create(name)
        job = await record.executor.submit(code, language, timeout=timeout)
        record.blocks += 1
        record.notebook_dirty = True
        record.last_used = time.monotonic()
        self._jobs[job.id] = (name, job)
        self._forget_old_jobs()
        return job

    def job(self, job_id: str) -> tuple[str, AsyncJob]:
        """Job ``job_id`` and its session's name; ``JobNotFound`` lists the jobs there are."""
        entry = self._jobs.get(job_id)
        if entry is None:
            known = ", ".join(self._jobs) or "none yet"
            raise JobNotFound(f"no job {job_id!r} (jobs: {known})")
        return entry

    def _forget_old_jobs(self) -> None:
        ended = [job_id for job_id, (_, job) in self._jobs.items() if job.done()]
        for job_id in ended[: max(0, len(self._jobs) - MAX_KEPT_JOBS)]:
            del self._jobs[job_id]

    async def _stop(self, record: _Record, run: asyncio.Future[ExecutionResult]) -> None:
        interrupt = getattr(record.executor, "interrupt", None)
        if interrupt is not None and not run.done():
            try:
                await interrupt()
                await asyncio.wait_for(asyncio.shield(run), _STOP_GRACE)
            except Exception:  # the kernel did not stop in time: the block is cancelled below
                log.debug("session %r: the interrupt did not end the block", record.name)
        if not run.done():
            run.cancel()
        await asyncio.gather(run, return_exceptions=True)

    async def interrupt(self, name: str) -> bool:
        """Interrupt the block running in ``name`` (state kept); False if none was running."""
        record = self.record(name)
        if not record.busy and not record.executor.jobs:
            return False
        await self._interrupt_block(record)
        return True

    async def restart(self, name: str) -> None:
        """A clean kernel; a block still running is interrupted first rather than waited for."""
        await self._interrupt_if_busy(self.record(name))
        await self.manager.restart(name)

    async def close_session(self, name: str) -> None:
        """Stop the session (a running block is interrupted first); its work dir goes too."""
        await self._interrupt_if_busy(self.record(name))
        await self.manager.close_session(name)
        self._records.pop(name, None)

    # -- branching (kernel sessions that fork: see docs/branching.md) ----------------------
    def _kernel(self, name: str) -> Any:
        executor = self.record(name).executor
        if not hasattr(executor, "fork"):
            raise ForkUnsupported(f"session {name!r} runs each block afresh: no state to branch")
        return executor

    async def fork(self, name: str, new_name: str) -> Path:
        """Session ``new_name``: a fork of ``name`` (same state, a copy of its files)."""
        executor = self._kernel(name)
        if not new_name or len(new_name) > 100:
            raise InvalidBlock("a session name is 1 to 100 characters")
        if new_name in self._records or new_name in self.manager:
            raise SessionExists(f"session {new_name!r} already exists. {self._listing()}")
        child = await executor.fork()
        try:
            await self.manager.adopt(new_name, child)
        except BaseException:
            await child.close()
            raise
        return self._hold(new_name, child).executor.work_dir

    async def snapshot(self, name: str) -> str:
        """A live snapshot of session ``name``; its id (it lasts as long as the session)."""
        snapshot = await self._kernel(name).snapshot()
        key = f"snapshot-{len(self._snapshots) + 1}"
        self._snapshots[key] = snapshot
        return key

    async def restore(self, name: str, snapshot_id: str) -> None:
        """Session ``name`` back to the state of snapshot ``snapshot_id`` (of it or its forks)."""
        executor = self._kernel(name)
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None:
            known = ", ".join(self._snapshots) or "none yet"
            raise SnapshotError(f"no snapshot {snapshot_id!r} (snapshots: {known})")
        await executor.restore(snapshot)

    async def _interrupt_if_busy(self, record: _Record) -> None:
        if record.busy:
            await self._interrupt_block(record)

    async def _interrupt_block(self, record: _Record) -> None:
        """A kernel gets an interrupt (state kept); a stateless block's process is stopped."""
        interrupt = getattr(record.executor, "interrupt", None)
        if interrupt is not None:
            await interrupt()
        elif record.run is not None and not record.run.done():
            record.stopped = True
            record.run.cancel()
        else:  # a stateless session's running job: its process is stopped
            for job in record.executor.jobs:
                if job.status is JobStatus.RUNNING:
                    await job.cancel()

    # -- files -----------------------------------------------------------------------------
    def path(self, name: str, relative: str) -> Path:
        """``relative`` inside session ``name``'s work dir (``InvalidBlock`` if it escapes)."""
        record = self.record(name)
        if relative in {"", "."}:
            return record.executor.work_dir.resolve()
        target = resolve_inside(record.executor.work_dir, relative)
        if INTERNAL_DIR in target.relative_to(record.executor.work_dir.resolve()).parts:
            raise InvalidBlock(f"{relative} is kernelexec's own")
        if target.name == NOTEBOOK_NAME:
            self._save_notebook(record)
        return target

    def locate(self, name: str, relative: str) -> tuple[Path, bool]:
        """``relative``'s path on this host (refused as ``path`` refuses it), and whether the
        file lives with a kernel that does not share this host's disk (a gateway's): then it
        goes through the kernel. The session notebook is the server's own, always here."""
        target = self.path(name, relative)
        if target.name == NOTEBOOK_NAME and target.parent == self.path(name, "."):
            return target, False
        backend = getattr(self.record(name).executor, "backend", None)
        return target, not getattr(backend, "shares_work_dir", True)

    async def write_file(self, name: str, relative: str, data: bytes) -> None:
        """Write a file into the session's work dir, wherever its kernel has it."""
        target, remote = self.locate(name, relative)
        if remote:
            await self.record(name).executor.write_file(relative, data)
            return
        await asyncio.to_thread(_write_here, self.path(name, "."), target, data)

    async def read_remote(self, name: str, relative: str) -> bytes:
        """A file ``locate`` placed with the kernel (read through it, size-limited)."""
        return await self.record(name).executor.read_file(relative)

    async def list_files_async(self, name: str, relative: str = ".") -> list[dict[str, Any]]:
        """``list_files``, through the kernel when the session's files live there."""
        if not self.locate(name, relative)[1]:
            return self.list_files(name, relative)
        executor = self.record(name).executor
        entries: list[dict[str, Any]] = []
        folders = [relative]
        while folders and len(entries) < _MAX_LISTED:
            for entry in await executor.list_files(folders.pop(0)):
                if entry.is_dir:
                    folders.append(entry.path)
                elif INTERNAL_DIR not in Path(entry.path).parts:
                    entries.append({"path": entry.path, "size": entry.size})
        return sorted(entries, key=lambda e: str(e["path"]))[:_MAX_LISTED]

    def list_files(self, name: str, relative: str = ".") -> list[dict[str, Any]]:
        record = self.record(name)
        self._save_notebook(record)
        root = self.path(name, relative)
        entries = []
        # Through the door: folders entered by descriptor, links listed as nothing (never
        # followed, loops included), only regular files counted.
        with Door(record.executor.work_dir) as door:
            inner = door.relative(root)
            st = door.lstat(inner) if inner else None
            if inner and (st is None or not stat.S_ISDIR(st.st_mode)):
                raise InvalidBlock(f"not a directory: {relative}")
            for rel, entry in door.walk(inner, skip=lambda r: r.split("/")[0] == INTERNAL_DIR):
                if entry.is_file:
                    entries.append({"path": rel, "size": entry.size})
        return sorted(entries, key=lambda e: str(e["path"]))[:_MAX_LISTED]

    def _save_notebook(self, record: _Record) -> None:
        """Written when asked for, not after every block: a block's latency stays the kernel's."""
        if record.notebook_dirty and not record.executor.closed:
            record.executor.save_notebook(record.executor.work_dir / NOTEBOOK_NAME)
            record.notebook_dirty = False


def _write_here(work_dir: Path, target: Path, data: bytes) -> None:
    """A file into a work dir on this host, through its door (no planted link followed)."""
    with Door(work_dir) as door:
        door.write_bytes(target, data)
