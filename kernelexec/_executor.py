"""What every executor shares: block validation, the work dir, artifacts, ordering, sync front.

``AsyncExecutor`` is the async core. A concrete executor implements ``_start``, ``_run_block``,
``_restart`` and ``_close``; everything users call (``execute``, ``execute_code_blocks``,
``execute_message``, ``restart``, ``close``, context managers) lives here once, so the stateless
and stateful executors cannot drift apart. ``SyncExecutor`` is the typed synchronous twin that
drives a core through a private event-loop thread (see ``_sync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import numbers
import os
import shutil
import stat
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from nbformat import NotebookNode

from ._budget import DEFAULT_OUTPUT_LIMIT
from ._door import Door
from ._errors import ExecutorClosed, InvalidBlock, InvalidPath, InvalidTimeout, InvalidWorkDir
from ._extract import MarkdownCodeExtractor, normalize_language
from ._files import FileEntry, FileStore, LocalFiles
from ._functions import (
    DEFAULT_MODULE,
    check_module_name,
    describe_functions,
    install_code,
    loader_code,
    module_source,
)
from ._guard import REFUSAL, dangerous_command, shell_part
from ._jobs import AsyncJob, Job, JobStatus
from ._session import SessionNotebook
from ._sync import Portal, SyncFront
from ._types import EXIT_ERROR, EXIT_OK, CodeBlock, ErrorInfo, ExecutionResult, NbOutput
from ._workdir import INTERNAL_DIR, Snapshot, filename_from_code, folder_option, resolve_inside

OutputCallback = Callable[[NbOutput], None]
"""Receives each output (an nbformat v4 output dict) as it arrives."""

# A running job's outputs reach the session notebook (and its file) at most this often.
_JOB_FLUSH_INTERVAL = 0.5

# Work dirs with fewer files than this are scanned on the event loop (see ``_snapshot``).
_INLINE_SNAPSHOT_ENTRIES = 500

_T = TypeVar("_T")

NO_BLOCKS_MESSAGE = "No code blocks found in the message; nothing was run."


@dataclass(frozen=True, kw_only=True)
class ExecutorOptions:
    """Settings shared by every executor (read once, when the executor is built)."""

    timeout: float = 60.0
    env: Mapping[str, str] = field(default_factory=dict)
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    cleanup_code_files: bool = False
    #: where rich outputs (plots, HTML, ...) are saved, relative to the work dir ("." the work
    #: dir itself); None: not saved as files (they stay in ``outputs`` and the session notebook)
    outputs_dir: str | None = "outputs"
    #: refuse shell commands that wreck the host (``rm -rf``, ``dd``, a fork bomb...: AG2's
    #: list, see ``_guard``) before running a block: a guard-rail against an LLM's careless
    #: command, not a sandbox (a determined block gets past it)
    refuse_dangerous: bool = False
    #: a kernel also gives each matplotlib figure (and Plotly / Altair chart) shown as a chart
    #: document and each DataFrame as a table document, summed up in ``output`` (docs/charts.md)
    charts: bool = True


@dataclass(frozen=True, kw_only=True)
class PreparedBlock:
    """A validated block: canonical language, and the file it must be saved to, if any."""

    code: str
    language: str
    index: int
    target: Path | None  # from a first-line ``# filename:``; None means "name it yourself"


def error_result(
    message: str, *, language: str, ename: str = "InvalidBlock", not_run: bool = False
) -> ExecutionResult:
    """A result for a block that was refused (``not_run``: before any of it ran)."""
    return ExecutionResult(
        exit_code=EXIT_ERROR,
        output=message,
        stderr=message,
        error=ErrorInfo(ename=ename, evalue=message),
        outputs=[{"output_type": "error", "ename": ename, "evalue": message, "traceback": []}],
        language=language,
        not_run=not_run,
    )


def check_timeout(timeout: object) -> float:
    """``timeout`` as a float; ``InvalidTimeout`` unless it is a positive, finite number. The
    one check of every timeout a caller gives (constructors, calls, the MCP server, the
    notebook runner): a string such as ``"5"`` is refused like ``True`` or ``nan``, not read."""
    value = math.nan
    if isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        value = float(timeout)
    if not 0 < value < math.inf:
        raise InvalidTimeout(
            f"timeout must be a positive, finite number of seconds, not {timeout!r}"
        )
    return value


def pinned_work_dir(path: Path) -> Path:
    """``path``, or its target when it is itself a symbolic link: resolved once, here, so every
    later use (the door, a block's cwd, a container's mount, result paths) names the same folder
    whatever the link points to later. A link to nothing, or a loop, is ``InvalidWorkDir``."""
    if not path.is_symlink():
        return path
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # ENOENT, ELOOP (RuntimeError before 3.13)
        raise InvalidWorkDir(
            f"the work dir {path} is a symbolic link to {os.readlink(path)!r}, "
            "which is not an existing folder"
        ) from exc


def make_work_dir(path: Path) -> None:
    """Create the work dir; ``InvalidWorkDir`` when it is a file or cannot be made."""
    if path.exists() and not path.is_dir():
        raise InvalidWorkDir(f"the work dir {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidWorkDir(f"cannot create the work dir {path}: {exc.strerror or exc}") from exc


def combine_results(results: Sequence[ExecutionResult]) -> ExecutionResult:
    """One result for a list of blocks run in order (the last one decides the exit code)."""
    if not results:
        return ExecutionResult(exit_code=EXIT_OK, output=NO_BLOCKS_MESSAGE)
    if len(results) == 1:
        return results[0]
    last = results[-1]
    files: list[Path] = []
    for r in results:
        files.extend(f for f in r.files if f not in files)
    return ExecutionResult(
        exit_code=last.exit_code,
        output="\n".join(r.output for r in results if r.output),
        stdout="".join(r.stdout for r in results),
        stderr="".join(r.stderr for r in results),
        error=next((r.error for r in results if r.error is not None), None),
        outputs=[o for r in results for o in r.outputs],
        files=files,
        code_file=last.code_file,
        timed_out=any(r.timed_out for r in results),
        truncated=any(r.truncated for r in results),
        duration_s=sum(r.duration_s for r in results),
        language=last.language,
        kernel_died=any(r.kernel_died for r in results),
        state_lost=any(r.state_lost for r in results),
        not_run=any(r.not_run for r in results),
        full_output_file=next(
            (r.full_output_file for r in results if r.full_output_file is not None), None
        ),
        execution_count=last.execution_count,
        block_results=list(results),
        network_log=[event for r in results for event in r.network_log],
    )


def executor_label(executor: AsyncExecutor) -> str:
    """The back end's kind (``local-command``, ``docker-kernel``) or else the executor's."""
    backend = getattr(executor, "backend", None)
    return str(getattr(backend, "kind", None) or executor.kind)


class AsyncExecutor(ABC):
    """The async core every executor shares."""

    #: ``"command"`` or ``"kernel"``; recorded in results' notebooks and benchmarks
    kind: ClassVar[str] = "executor"

    def __init__(
        self,
        *,
        work_dir: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        cleanup_code_files: bool = False,
        outputs_dir: str | None = "outputs",
        on_output: OutputCallback | None = None,
        code_extractor: MarkdownCodeExtractor | None = None,
        notebook_path: str | os.PathLike[str] | None = None,
        refuse_dangerous: bool = False,
        charts: bool = True,
    ) -> None:
        self.options = ExecutorOptions(
            timeout=check_timeout(timeout),
            env=dict(env or {}),
            output_limit=output_limit,
            cleanup_code_files=cleanup_code_files,
            # "." is the work dir itself (where autogen-ext's Jupyter executor saves them);
            # an empty name is a mistake, not a way to say it.
            outputs_dir=folder_option(outputs_dir, "outputs_dir", allow_root=bool(outputs_dir)),
            refuse_dangerous=bool(refuse_dangerous),
            charts=bool(charts),
        )
        self._owns_work_dir = work_dir is None
        if work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="kernelexec-"))
        else:
            self._work_dir = pinned_work_dir(Path(work_dir).absolute())
            make_work_dir(self._work_dir)
        self.on_output = on_output
        self.code_extractor = code_extractor or MarkdownCodeExtractor()
        self._lock = asyncio.Lock()
        self._started = False
        self._closed = False
        # Its kernel, container, work dir and sockets are this process's: a child forked from
        # it (os.fork, multiprocessing) is refused them, and its close() lets them be.
        self._owner = os.getpid()
        self._block_count = 0
        self._last_snapshot_size = 0
        # Every host-side access to a path inside the work dir goes through this door.
        self._door = Door(self._work_dir)
        # Every session is a notebook; with a path it is rewritten after each block.
        self._notebook = SessionNotebook(path=notebook_path, door=self._door)
        # Blocks and jobs waiting for their turn, in order (a job's position is read here).
        self._line: list[object] = []
        self._jobs: list[AsyncJob] = []  # submitted and not yet ended
        self._job: AsyncJob | None = None  # the job whose block runs now
        self._job_cell = -1  # its cell in the session notebook
        self._job_flush: asyncio.TimerHandle | None = None
        # Set by a back end whose cancelled block had to have its kernel replaced.
        self._state_lost_by_cancel = False
        self._closing = False  # close() is cancelling the jobs
        self._job_ended_at = 0.0  # time.monotonic() when the latest job ended

    # -- public API -------------------------------------------------------------------------
    @property
    def work_dir(self) -> Path:
        return self._work_dir

    @property
    def timeout(self) -> float:
        return self.options.timeout

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def notebook(self) -> NotebookNode:
        """The session so far as an nbformat v4 notebook (a copy; one cell per block run)."""
        return self._notebook.copy()

    def save_notebook(self, path: str | os.PathLike[str]) -> Path:
        """Write the session notebook to ``path`` atomically; returns the absolute path."""
        return self._notebook.save(path, door=self._door)

    # -- files in and out (paths relative to the work dir, confined to it) ---------------------
    async def read_file(self, path: str) -> bytes:
        """The bytes of a file in the work dir."""
        return await self._with_files(lambda store: store.read(path))

    async def write_file(self, path: str, data: bytes | bytearray | memoryview | str) -> None:
        """Write ``data`` (str is written as UTF-8) to a file in the work dir, atomically."""
        # bytes-like data is not copied: a file past the size limit is refused before any copy
        raw = data.encode("utf-8") if isinstance(data, str) else data
        await self._with_files(lambda store: store.write(path, raw))

    async def list_files(self, path: str = ".") -> list[FileEntry]:
        """The entries of a folder of the work dir (kernelexec's own ``.kernelexec`` hidden)."""
        return await self._with_files(lambda store: store.listing(path))

    async def upload(self, local_path: str | os.PathLike[str], dest: str | None = None) -> str:
        """Copy a host file into the work dir (as ``dest``, default its name); returns ``dest``."""
        source = Path(local_path)
        name = dest or source.name
        store = self._file_store()
        if isinstance(store, LocalFiles):
            await self._with_files(lambda _: store.copy_in(source, name))
        else:
            data = await asyncio.to_thread(source.read_bytes)
            await self._with_files(lambda s: s.write(name, data))
        return name

    async def download(self, path: str, local_path: str | os.PathLike[str]) -> Path:
        """Copy a work-dir file to the host (to ``local_path``, or into it if a folder)."""
        target = Path(local_path).absolute()
        if self._is_folder(target):
            target = target / Path(path).name
        store = self._file_store()
        if isinstance(store, LocalFiles) and self._inside(target) is None:
            await self._with_files(lambda _: store.copy_out(path, target))
        else:
            data = await self._with_files(lambda s: s.read(path))
            await asyncio.to_thread(self._write_host_file, target, data)
        return target.absolute()

    def _file_store(self) -> FileStore:
        """Where the files are; a kernel on another machine overrides this."""
        return LocalFiles(self._work_dir, door=self._door)

    async def _with_files(self, op: Callable[[FileStore], Awaitable[_T]]) -> _T:
        self._check_open()
        store = self._file_store()
        if not store.through_kernel:  # the disk is shared: no need to wait for a block
            return await op(store)
        async with self._lock:  # requests through the kernel queue behind blocks, in order
            self._check_open()
            await self._ensure_started()
            return await op(store)

    @property
    @abstractmethod
    def supported_languages(self) -> tuple[str, ...]:
        """Canonical names of the languages this executor runs."""

    async def start(self) -> None:
        """Start the back end (a kernel, a container). Called for you on first use."""
        self._check_open()
        async with self._lock:
            await self._ensure_started()

    async def execute(
        self, code: str, language: str = "python", *, timeout: float | None = None
    ) -> ExecutionResult:
        """Run one block of code."""
        return await self.execute_block(CodeBlock(code=code, language=language), timeout=timeout)

    async def execute_block(
        self, block: CodeBlock, *, timeout: float | None = None
    ) -> ExecutionResult:
        self._check_open()
        if timeout is not None:
            check_timeout(timeout)
        async with self._turn(object()):
            self._check_open()
            prepared = self._prepare(block)
            if isinstance(prepared, ExecutionResult):
                return prepared
            await self._ensure_started()
            limit = self.options.timeout if timeout is None else check_timeout(timeout)
            return await self._run_and_observe(prepared, limit)

    async def submit(
        self, code: str, language: str = "python", *, timeout: float | None = None
    ) -> AsyncJob:
        """Start a block in the background and return its job at once.

        The job waits behind the block running and those sent before it (``job.position``);
        blocks sent after it (``execute``, ``submit``) wait behind it. ``timeout`` is the
        block's own limit once it runs (default: the executor's), as for ``execute``.
        """
        self._check_open()
        limit = self.options.timeout if timeout is None else check_timeout(timeout)
        job = AsyncJob(
            CodeBlock(code=code, language=language),
            limit=self.options.output_limit,
            position=self._position,
        )
        self._line.append(job)  # in line now, so a block sent right after comes after it
        self._jobs.append(job)
        job.start(lambda j: self._run_job(j, limit))
        # Let the job's task reach the lock (it does not wait before that), so that the lock's
        # own first-come order is the line's order.
        await asyncio.sleep(0)
        return job

    @property
    def jobs(self) -> list[AsyncJob]:
        """The jobs submitted here that have not ended yet, in order."""
        return list(self._jobs)

    @property
    def last_job_end(self) -> float:
        """``time.monotonic()`` when the latest job ended (0.0: none has): a session manager
        counts it as use, so a session is not culled as idle while, or right after, a job
        runs."""
        return self._job_ended_at

    async def execute_code_blocks(
        self, code_blocks: Sequence[Any], *, timeout: float | None = None
    ) -> ExecutionResult:
        """Run blocks in order; stop at the first that fails. Accepts AG2/AutoGen blocks too."""
        if timeout is not None:
            check_timeout(timeout)  # before the first block runs
        results: list[ExecutionResult] = []
        for raw in code_blocks:
            block = CodeBlock(code=raw.code, language=getattr(raw, "language", "python") or "")
            result = await self.execute_block(block, timeout=timeout)
            results.append(result)
            if result.exit_code != EXIT_OK:
                break
        return combine_results(results)

    async def execute_message(
        self, message: Any, *, timeout: float | None = None
    ) -> ExecutionResult:
        """Extract the fenced code blocks of a markdown message and run them."""
        blocks = self.code_extractor.extract_code_blocks(message)
        return await self.execute_code_blocks(blocks, timeout=timeout)

    async def add_functions(
        self, functions: Sequence[Any], *, module: str = DEFAULT_MODULE
    ) -> ExecutionResult:
        """Make ``functions`` importable by the code (``from functions import add``).

        Their source goes to ``<module>.py`` in the work dir, their ``python_packages`` are
        pip-installed into the code's interpreter, and the module is loaded once: in a kernel
        the functions are then defined in the session too. The result is that run's (exit code
        0: ready); a function without readable source raises ``InvalidBlock``. A kernel restart
        keeps the module file, not the names bound in the session: call again to bind them.
        """
        specs = describe_functions(functions)
        check_module_name(module)
        await self.write_file(f"{module}.py", module_source(specs))
        self._functions_added()
        install = install_code([p for spec in specs for p in spec.packages])
        blocks = [] if install is None else [CodeBlock(code=install, language="python")]
        load = loader_code(module, [spec.name for spec in specs])
        return await self.execute_code_blocks([*blocks, CodeBlock(code=load, language="python")])

    async def restart(self) -> None:
        """Start afresh: for a kernel, a new kernel (all state is lost)."""
        self._check_open()
        async with self._lock:
            if self._started:
                await self._restart()
                self._notebook.record_restart()
            else:
                await self._ensure_started()

    async def close(self) -> None:
        """Stop the back end and remove what this executor created. Safe to call twice. Jobs
        still queued or running are cancelled first (they end ``cancelled``)."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner:
            return  # a forked child: what this executor holds is its parent's to close
        await self._end_jobs()
        async with self._lock:
            try:
                if self._started:
                    await self._close()
            finally:
                self._started = False
                self._door.close()
                if self._owns_work_dir:
                    shutil.rmtree(self._work_dir, ignore_errors=True)

    async def __aenter__(self: _A) -> _A:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- for subclasses -----------------------------------------------------------------------
    @abstractmethod
    async def _start(self) -> None:
        """Start the back end."""

    @abstractmethod
    async def _run_block(self, block: PreparedBlock, timeout: float) -> ExecutionResult:
        """Run one validated block; ``files`` and ``duration_s`` are filled in by the caller."""

    @abstractmethod
    async def _restart(self) -> None:
        """Restart the back end."""

    @abstractmethod
    async def _close(self) -> None:
        """Stop the back end."""

    def _functions_added(self) -> None:
        """Called when a functions module is written to the work dir: a kernel imports from
        its working dir already; a stateless executor puts the work dir on the path."""
        return  # the kernels' case: nothing to do

    def _internal_path(self, *parts: str) -> Path:
        """A path under the work dir's ``.kernelexec/`` folder (kernelexec's own files)."""
        return self._work_dir.joinpath(INTERNAL_DIR, *parts)

    def _save_code(self, path: Path, code: str) -> None:
        """Write a block's code file through the door (a link planted at its name or on the
        way is replaced or refused, never written through)."""
        self._door.write_bytes(path, code.encode("utf-8", errors="replace"))

    def _inside(self, target: Path) -> str | None:
        """``target`` relative to the work dir when it lies in it, else None."""
        try:
            return self._door.relative(target)
        except InvalidPath:
            return None

    def _is_folder(self, target: Path) -> bool:
        """A folder, asked through the door when it is in the work dir (no link followed)."""
        inside = self._inside(target)
        if inside is None:
            return target.is_dir()
        return inside == "" or _is_dir(self._door.lstat(inside))

    def _write_host_file(self, target: Path, data: bytes) -> None:
        """A downloaded file to the caller's path: through the door when that path is in the
        work dir (where the code may have planted links), else as the caller named it."""
        inside = self._inside(target)
        if inside is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        else:
            self._door.write_bytes(inside, data)

    def _emit(self, output: NbOutput) -> None:
        if self._job is not None:
            self._job.log.add(output)
            self._schedule_job_flush()
        if self.on_output is not None:
            self.on_output(output)

    def _after_block(self, block: PreparedBlock, result: ExecutionResult) -> None:
        """Called with every finished block's result: the session notebook records it."""
        if self._job is not None:
            self._finish_job_cell(block, result, JobStatus.DONE)
            return
        self._notebook.record(block.code, block.language, result, executor=executor_label(self))

    # -- jobs -------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _turn(self, entry: object) -> AsyncIterator[None]:
        """Hold the executor for one block, after those in line before ``entry``."""
        if entry not in self._line:
            self._line.append(entry)
        try:
            async with self._lock:
                self._line.remove(entry)
                yield
        finally:
            if entry in self._line:  # cancelled while waiting
                self._line.remove(entry)

    def _position(self, job: AsyncJob) -> int | None:
        try:
            ahead = self._line.index(job)
        except ValueError:
            return None
        return ahead + (1 if self._lock.locked() else 0)

    async def _run_job(self, job: AsyncJob, timeout: float) -> ExecutionResult:
        try:
            async with self._turn(job):
                self._check_open()
                prepared = self._prepare(job.block)
                if isinstance(prepared, ExecutionResult):
                    return prepared
                await self._ensure_started()
                return await self._run_job_block(job, prepared, timeout)
        except asyncio.CancelledError:  # cancelled while it waited: nothing of it ran
            job.mark_cancelled()
            return job.cancelled_result(f"{job.id} was cancelled before it ran.", ran=False)
        except ExecutorClosed as exc:
            job.mark_cancelled()
            return job.cancelled_result(f"{job.id} was not run: {exc}.", ran=False)
        finally:
            self._jobs.remove(job)
            self._job_ended_at = time.monotonic()

    async def _run_job_block(
        self, job: AsyncJob, block: PreparedBlock, timeout: float
    ) -> ExecutionResult:
        job.mark_running()
        label = executor_label(self)
        self._job, self._state_lost_by_cancel = job, False
        self._job_cell = self._notebook.begin_job(
            block.code, block.language, executor=label, job=job.id
        )
        try:
            return await self._run_and_observe(block, timeout)
        except asyncio.CancelledError:
            # The back end has stopped the block (a kernel: interrupted, its state kept) before
            # the cancel reached here; what it printed is in the job's log.
            lost = self._state_lost_by_cancel
            why = f"{job.id} was cancelled while running; " + (
                "it ignored the interrupt, so the kernel was replaced: its state is gone."
                if lost
                else "the session's state is kept."
            )
            if self._closing:
                why = f"{job.id} was cancelled while running: the executor was closed."
            result = job.cancelled_result(why, ran=True, state_lost=lost)
            job.mark_cancelled()
            self._finish_job_cell(block, result, JobStatus.CANCELLED)
            return result
        finally:
            self._job = None
            if self._job_flush is not None:
                self._job_flush.cancel()
                self._job_flush = None

    def _finish_job_cell(
        self, block: PreparedBlock, result: ExecutionResult, status: JobStatus
    ) -> None:
        job = self._job
        assert job is not None
        self._notebook.finish_job(
            self._job_cell,
            block.code,
            block.language,
            result,
            executor=executor_label(self),
            job=job.id,
            status=status.value,
        )

    def _schedule_job_flush(self) -> None:
        """Show the running job's outputs in the session notebook soon (at most every
        ``_JOB_FLUSH_INTERVAL``: a chatty job must not rewrite the file per line)."""
        if self._job_flush is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # fed from another thread: the cell is written when the job ends
        self._job_flush = loop.call_later(_JOB_FLUSH_INTERVAL, self._flush_job)

    def _flush_job(self) -> None:
        self._job_flush = None
        if self._job is not None:
            self._notebook.job_progress(self._job_cell, self._job.log.outputs())

    async def _end_jobs(self) -> None:
        """Cancel every job not yet ended and wait for them (the executor is closing)."""
        self._closing = True
        # All asked at once: a queued job must not start while the one before it stops.
        await asyncio.gather(*(job.cancel() for job in list(self._jobs)))

    # -- internals ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if os.getpid() != self._owner:
            raise ExecutorClosed(
                f"{type(self).__name__} was made in process {self._owner}; this process was"
                " forked from it and cannot use it: make a new one here"
            )
        if self._closed:
            raise ExecutorClosed(f"{type(self).__name__} is closed")

    async def _ensure_started(self) -> None:
        if not self._started:
            make_work_dir(self._work_dir)
            await self._start()
            self._started = True

    def _prepare(self, block: CodeBlock) -> PreparedBlock | ExecutionResult:
        language = normalize_language(block.language) if block.language else ""
        if not language:
            return error_result(
                "Not run: the block has no language tag and is not valid Python.",
                language="",
                ename="UnknownLanguage",
                not_run=True,
            )
        if language not in self.supported_languages:
            supported = ", ".join(self.supported_languages)
            return error_result(
                f"unsupported language: {block.language} (this executor runs: {supported})",
                language=language,
                ename="UnsupportedLanguage",
                not_run=True,
            )
        if "\x00" in block.code:
            # No back end can run it whole: Python refuses source with a NUL, a file written
            # for bash or argv ends at it, and ipykernel answered "ok" having run nothing.
            line = block.code.count("\n", 0, block.code.index("\x00")) + 1
            return error_result(
                f"Block refused: the code holds a NUL byte (line {line}); nothing was run.",
                language=language,
                not_run=True,
            )
        why = None
        if self.options.refuse_dangerous:
            why = dangerous_command(shell_part(block.code, language))
        if why is not None:
            return error_result(
                f"Block refused: {REFUSAL}{why} (refuse_dangerous=True); nothing was run.",
                language=language,
                ename="DangerousCommand",
                not_run=True,
            )
        target = None
        name = filename_from_code(block.code)
        if name is not None:
            try:
                target = resolve_inside(self._work_dir, name)
            except InvalidBlock as exc:
                return error_result(f"Block refused: {exc}", language=language, not_run=True)
        self._block_count += 1
        return PreparedBlock(
            code=block.code, language=language, index=self._block_count, target=target
        )

    async def _snapshot(self) -> Snapshot:
        # A small work dir is scanned in microseconds, less than a hop to a worker thread costs
        # (measured by benchmarks/kernel_roundtrip.py); a big one must not block the loop.
        if self._last_snapshot_size < _INLINE_SNAPSHOT_ENTRIES:
            snap = Snapshot.take(self._work_dir)
        else:
            snap = await asyncio.to_thread(Snapshot.take, self._work_dir)
        self._last_snapshot_size = len(snap.entries)
        return snap

    async def _run_and_observe(self, block: PreparedBlock, timeout: float) -> ExecutionResult:
        before = await self._snapshot()
        started = time.perf_counter()
        result = await self._run_block(block, timeout)
        duration = time.perf_counter() - started
        after = await self._snapshot()
        skip = {result.code_file} if result.code_file else set()
        changed = [
            self._work_dir / rel
            for rel in after.changed_since(before)
            if str(self._work_dir / rel) not in skip
        ]
        known = set(result.files)  # a list's lookups would be quadratic in the files
        listed = list(result.files) + [p for p in changed if p not in known]
        result = result.with_changes(files=listed, duration_s=duration)
        result = await self._with_network_log(result)
        self._after_block(block, result)
        return result

    async def _with_network_log(self, result: ExecutionResult) -> ExecutionResult:
        """The egress proxy's log of the block (``network=NetworkPolicy``) in the result, and
        its refusals said in ``output``: a model reads why its request failed."""
        backend = getattr(self, "backend", None)
        take = getattr(backend, "take_network_log", None)
        events = await take() if take is not None else []
        if not events:
            return result
        # a withheld secret is said too: the model learns its placeholder went nowhere
        refused = [event for event in events if not event.allowed or event.secrets_withheld]
        output = result.output
        if refused:
            # what the code sent (a host with a newline) must not forge a line of this note
            lines = "\n".join(f"  {_printable(event.describe())}" for event in refused[:20])
            more = f"\n  ... and {len(refused) - 20} more" if len(refused) > 20 else ""
            note = f"kernelexec: the network policy refused {len(refused)} connection(s):\n"
            if any(event.allowed for event in refused):
                note = (
                    "kernelexec: the network policy refused or withheld secrets on "
                    f"{len(refused)} connection(s):\n"
                )
            output = f"{output.rstrip(chr(10))}\n{note}{lines}{more}".lstrip("\n")
        return result.with_changes(network_log=events, output=output)


_A = TypeVar("_A", bound=AsyncExecutor)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def _is_dir(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISDIR(st.st_mode)


class SyncExecutor(SyncFront[_A]):
    """The synchronous twin of an async executor; safe to use inside a running event loop.

    A twin declares its core once (``class KernelExecutor(SyncExecutor[...],
    core=AsyncKernelExecutor)``) and takes exactly the core's constructor arguments: nothing is
    declared twice. ``SyncExecutor.wrap(core)`` gives an existing core its twin.
    """

    _core_type: ClassVar[type[AsyncExecutor]]
    _twins: ClassVar[dict[type[AsyncExecutor], type[SyncExecutor[Any]]]] = {}

    def __init_subclass__(cls, *, core: type[AsyncExecutor] | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if core is not None:
            cls._core_type = core
            SyncExecutor._twins[core] = cls
            # help() and inspect show the core's arguments, which are the twin's.
            cls.__signature__ = inspect.signature(core)  # type: ignore[attr-defined]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(self._core_type(*args, **kwargs))  # type: ignore[arg-type]

    @classmethod
    def wrap(cls, core: AsyncExecutor, *, portal: Portal | None = None) -> SyncExecutor[Any]:
        """The sync twin of an existing core; with ``portal``, driven on that shared loop."""
        twin = next((cls._twins[t] for t in type(core).__mro__ if t in cls._twins), SyncExecutor)
        front: SyncExecutor[Any] = twin.__new__(twin)
        SyncFront.__init__(front, core, portal=portal)
        return front

    @property
    def work_dir(self) -> Path:
        return self._core.work_dir

    @property
    def timeout(self) -> float:
        return self._core.timeout

    def read_file(self, path: str) -> bytes:
        """The bytes of a file in the work dir."""
        return self._call(self._core.read_file, path)

    def write_file(self, path: str, data: bytes | bytearray | memoryview | str) -> None:
        """Write ``data`` (str as UTF-8) to a file in the work dir, atomically."""
        self._call(self._core.write_file, path, data)

    def list_files(self, path: str = ".") -> list[FileEntry]:
        """The entries of a folder of the work dir."""
        return self._call(self._core.list_files, path)

    def upload(self, local_path: str | os.PathLike[str], dest: str | None = None) -> str:
        """Copy a host file into the work dir; returns its path there."""
        return self._call(self._core.upload, local_path, dest)

    def download(self, path: str, local_path: str | os.PathLike[str]) -> Path:
        """Copy a work-dir file to the host; returns where it was written."""
        return self._call(self._core.download, path, local_path)

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def notebook(self) -> NotebookNode:
        """The session so far as an nbformat v4 notebook (a copy; one cell per block run)."""
        return self._core.notebook

    def save_notebook(self, path: str | os.PathLike[str]) -> Path:
        """Write the session notebook to ``path`` atomically; returns the absolute path."""
        return self._core.save_notebook(path)

    @property
    def code_extractor(self) -> MarkdownCodeExtractor:
        return self._core.code_extractor

    @property
    def supported_languages(self) -> tuple[str, ...]:
        return self._core.supported_languages

    def execute(
        self, code: str, language: str = "python", *, timeout: float | None = None
    ) -> ExecutionResult:
        return self._call(self._core.execute, code, language, timeout=timeout)

    def execute_block(self, block: CodeBlock, *, timeout: float | None = None) -> ExecutionResult:
        return self._call(self._core.execute_block, block, timeout=timeout)

    def submit(self, code: str, language: str = "python", *, timeout: float | None = None) -> Job:
        """Start a block in the background and return its job at once (see ``AsyncExecutor``)."""
        return Job(self._call(self._core.submit, code, language, timeout=timeout), self._portal)

    @property
    def jobs(self) -> list[Job]:
        """The jobs submitted here that have not ended yet, in order."""
        return [Job(job, self._portal) for job in self._core.jobs]

    def execute_code_blocks(
        self, code_blocks: Sequence[Any], *, timeout: float | None = None
    ) -> ExecutionResult:
        return self._call(self._core.execute_code_blocks, code_blocks, timeout=timeout)

    def execute_message(self, message: Any, *, timeout: float | None = None) -> ExecutionResult:
        return self._call(self._core.execute_message, message, timeout=timeout)

    def add_functions(
        self, functions: Sequence[Any], *, module: str = DEFAULT_MODULE
    ) -> ExecutionResult:
        return self._call(self._core.add_functions, functions, module=module)

    def restart(self) -> None:
        self._call(self._core.restart)

    def run(self, func: Callable[..., Awaitable[_T]], /, *args: Any, **kwargs: Any) -> _T:
        """Run a coroutine function on this executor's event loop (where its core lives).

        For code built on the async core (the notebook runner, the agent loop) that needs the
        core's own loop rather than a new one.
        """
        return self._call(func, *args, **kwargs)
