"""Detached blocks: ``submit`` starts a block in the background and returns a job at once.

A job is one block in its executor's line: it waits behind the block running (and those sent
before it), runs, and ends ``done`` or ``cancelled``. Its outputs are kept as they come, bounded
(the latest ``limit`` characters of text, the latest rich outputs), for ``peek()`` and for the
MCP server's ``job_output``; the executor also shows them in the session notebook while the job
runs. ``AsyncJob`` lives on the executor's event loop; ``Job`` is its synchronous twin, driven
through the executor's portal like every other sync call.

The executor (``_executor.py``) runs the job; this module holds what a job knows of itself.
"""

from __future__ import annotations

import asyncio
import enum
import math
import numbers
import secrets
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable

from ._errors import InvalidTimeout, JobNotFinished
from ._outputs import strip_ansi
from ._sync import Portal
from ._types import EXIT_ERROR, CodeBlock, ErrorInfo, ExecutionResult, NbOutput

#: rich outputs (displays, errors) a job keeps for ``peek``: the latest ones
_KEPT_RICH = 20


class JobStatus(str, enum.Enum):
    """Where a job is: waiting its turn, running, or over (one of two ways)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"  # the block ended by itself (its result may still be a failure)
    CANCELLED = "cancelled"  # cancel(), or the executor closed: stopped or never started


def output_text(output: NbOutput) -> str:
    """The text an LLM reads for one output (streams as sent, a display by its plain text)."""
    kind = output.get("output_type")
    if kind == "stream":
        text = output.get("text", "")
        return "".join(text) if isinstance(text, list) else str(text)
    if kind == "error":
        trace = output.get("traceback") or []
        if trace:
            return strip_ansi("\n".join(str(line) for line in trace)) + "\n"
        return f"{output.get('ename', 'Error')}: {output.get('evalue', '')}\n"
    data = output.get("data") or {}
    if "text/plain" in data:
        plain = data["text/plain"]
        return ("".join(plain) if isinstance(plain, list) else str(plain)) + "\n"
    return f"[{next(iter(data), 'display')}]\n" if data else ""


class _Tail:
    """The latest ``limit`` characters of a text that keeps growing, in amortized linear time
    (a flood of small chunks must not copy the whole kept text per chunk)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[str] = []
        self._size = 0  # characters in _parts
        self.end = 0  # characters ever added

    def add(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        self.end += len(text)
        if self._size > 2 * self._limit:  # compact now and then, not per chunk
            self._parts = ["".join(self._parts)[-self._limit :]]
            self._size = self._limit

    def kept(self) -> tuple[str, int]:
        """The kept text and the offset it starts at."""
        text = "".join(self._parts)[-self._limit :]
        return text, self.end - len(text)


class OutputLog:
    """A job's outputs so far, bounded: the text's latest ``limit`` characters (offsets count
    from the job's first character, so a reader can ask "since offset N" however much was let
    go), the streams merged per name (each its latest ``limit`` characters), and the latest
    rich outputs."""

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._text = _Tail(self._limit)
        self._streams: dict[str, _Tail] = {}
        self._rich: deque[NbOutput] = deque(maxlen=_KEPT_RICH)
        self._order: list[str] = []  # the order streams and rich outputs first came in
        self._guard = threading.Lock()  # fed on the loop's thread, read from the caller's

    def add(self, output: NbOutput) -> None:
        text = output_text(output)
        with self._guard:
            self._text.add(text)
            if output.get("output_type") == "stream":
                name = str(output.get("name", "stdout"))
                if name not in self._streams:
                    self._order.append(name)
                    self._streams[name] = _Tail(self._limit)
                self._streams[name].add(text)
            else:
                if "rich" not in self._order:
                    self._order.append("rich")
                self._rich.append(dict(output))

    @property
    def end(self) -> int:
        """The offset just past the last character received."""
        return self._text.end

    def since(self, offset: int) -> tuple[str, int]:
        """The text from ``offset`` on (from the oldest kept when that was let go) and the
        offset it really starts at."""
        with self._guard:
            text, first = self._text.kept()
        start = min(max(offset, first), first + len(text))
        return text[start - first :], start

    def text(self) -> str:
        with self._guard:
            text, first = self._text.kept()
        if first:
            return f"[... {first} earlier characters not kept ...]\n{text}"
        return text

    def outputs(self) -> list[NbOutput]:
        """nbformat outputs: each stream merged (its kept tail), then the rich outputs."""
        with self._guard:
            out: list[NbOutput] = []
            for key in self._order:
                if key == "rich":
                    out.extend(dict(o) for o in self._rich)
                else:
                    text, _ = self._streams[key].kept()
                    out.append({"output_type": "stream", "name": key, "text": text})
            return out


def _check_wait(timeout: object) -> float | None:
    if timeout is None:
        return None
    value = math.nan
    if isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        value = float(timeout)
    if not 0 <= value < math.inf:
        raise InvalidTimeout(f"timeout must be a number of seconds >= 0, not {timeout!r}")
    return value


class AsyncJob:
    """A block running (or waiting to run) in the background on its executor.

    Made by ``await executor.submit(code)``. ``cancel()`` interrupts it (a kernel keeps its
    state) and returns its final result; cancelling again, or cancelling a job that ended,
    changes nothing and returns that same result.
    """

    def __init__(
        self, block: CodeBlock, *, limit: int, position: Callable[[AsyncJob], int | None]
    ) -> None:
        self.id = f"job-{secrets.token_hex(6)}"
        self.block = block
        self.log = OutputLog(limit)
        self.submitted_at = time.time()
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._position = position
        self._status = JobStatus.QUEUED
        self._cancel_asked = False
        self._task: asyncio.Task[ExecutionResult] | None = None
        #: ``submit(..., on_fork=True)``: the fork of the session the job runs on (an
        #: ``AsyncKernelExecutor``); its state is the fork's, not the session's. None otherwise.
        self.fork: object | None = None
        #: whether ``fork`` stays open once the job ends (``keep_fork=True``)
        self.fork_kept = False
        self._at_end: list[Callable[[], Awaitable[None]]] = []

    def __repr__(self) -> str:
        return f"<AsyncJob {self.id} {self._status.value}>"

    # -- what the executor calls ---------------------------------------------------------------
    def start(self, run: Callable[[AsyncJob], Awaitable[ExecutionResult]]) -> None:
        async def runner() -> ExecutionResult:
            try:
                return await run(self)
            finally:
                self.ended_at = time.time()
                for fn in self._at_end:  # before wait() returns: nothing of it left running
                    await fn()

        self._task = asyncio.ensure_future(runner())
        self._task.add_done_callback(self._ended)

    def at_end(self, fn: Callable[[], Awaitable[None]]) -> None:
        """``fn()`` awaited once the job has ended, before its result is handed out (a job on
        a fork: the fork is closed). Given before the job can end (``submit`` does)."""
        assert not self.done(), "at_end() of a job that has ended"
        self._at_end.append(fn)

    def mark_running(self) -> None:
        self._status = JobStatus.RUNNING
        self.started_at = time.time()

    def _ended(self, task: asyncio.Task[ExecutionResult]) -> None:
        if self._status is not JobStatus.CANCELLED:  # the executor marks a cancel it honoured
            self._status = JobStatus.CANCELLED if task.cancelled() else JobStatus.DONE
        if not task.cancelled():
            task.exception()  # seen: wait() raises it

    def mark_cancelled(self) -> None:
        self._status = JobStatus.CANCELLED

    def cancelled_result(self, why: str, *, ran: bool, state_lost: bool = False) -> ExecutionResult:
        """The result of a job stopped by a cancel: what it printed, then why it stopped."""
        error = ErrorInfo(ename="JobCancelled", evalue=why)
        text = self.log.text()
        note = why if not text or text.endswith("\n") else f"\n{why}"
        return ExecutionResult(
            exit_code=EXIT_ERROR,
            output=f"{text}{note}",
            stderr=why,
            error=error,
            outputs=[
                *self.log.outputs(),
                {"output_type": "error", "ename": "JobCancelled", "evalue": why, "traceback": []},
            ],
            language=self.block.language,
            duration_s=0.0 if self.started_at is None else time.time() - self.started_at,
            not_run=not ran,
            state_lost=state_lost,
        )

    # -- public ------------------------------------------------------------------------------
    @property
    def status(self) -> JobStatus:
        return self._status

    @property
    def position(self) -> int | None:
        """While queued: how many blocks run before it (1: it is next). None once started."""
        return self._position(self) if self._status is JobStatus.QUEUED else None

    def done(self) -> bool:
        return self._task is not None and self._task.done()

    @property
    def result(self) -> ExecutionResult | None:
        """The final result once the job ended (None before)."""
        if self._task is None or not self._task.done() or self._task.cancelled():
            return None
        return None if self._task.exception() else self._task.result()

    def peek(self) -> ExecutionResult:
        """The outputs so far as a partial result (the final result once it ended)."""
        final = self.result
        if final is not None:
            return final
        return ExecutionResult(
            exit_code=0,
            output=self.log.text(),
            outputs=self.log.outputs(),
            language=self.block.language,
            duration_s=0.0 if self.started_at is None else time.time() - self.started_at,
        )

    async def wait(self, timeout: float | None = None) -> ExecutionResult:
        """The job's result once it ends; ``JobNotFinished`` (a ``TimeoutError``) if it has not
        ended within ``timeout`` seconds: the job itself runs on."""
        limit = _check_wait(timeout)
        task = self._task
        assert task is not None, "a job is started when it is made"
        done, _ = await asyncio.wait({task}, timeout=limit)
        if not done:
            raise JobNotFinished(
                f"{self.id} is still {self._status.value} after {limit:g} s; it keeps running:"
                " wait() again, peek() at its outputs, or cancel() it"
            )
        return self.final()

    def final(self) -> ExecutionResult:
        """The result of a job that has ended (its failure raised, if kernelexec failed)."""
        task = self._task
        assert task is not None and task.done(), "final() of a job that has not ended"
        if task.cancelled():  # only when its loop was torn down under it
            ran = self.started_at is not None
            return self.cancelled_result(f"{self.id} was cancelled", ran=ran)
        return task.result()

    async def cancel(self) -> ExecutionResult:
        """Stop the job (a kernel is interrupted; its variables are kept) and return its final
        result. A job still queued never runs. Again, or once ended: nothing changes."""
        task = self._task
        assert task is not None, "a job is started when it is made"
        if not task.done() and not self._cancel_asked:
            self._cancel_asked = True
            task.cancel()
        # Shielded: the caller giving up on this wait must not cancel the job's clean-up.
        await asyncio.wait({task})
        return await self.wait()


class Job:
    """The synchronous twin of an ``AsyncJob`` (what ``KernelExecutor.submit`` returns)."""

    def __init__(self, job: AsyncJob, portal: Portal, *, fork: object | None = None) -> None:
        self._job = job
        self._portal = portal
        self._fork = fork  # the sync twin of job.fork, when there is one

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.status.value}>"

    @property
    def aio(self) -> AsyncJob:
        return self._job

    @property
    def id(self) -> str:
        return self._job.id

    @property
    def fork(self) -> object | None:
        """``submit(..., on_fork=True)``: the fork the job runs on (a ``KernelExecutor`` on the
        session's event loop); None otherwise."""
        return self._fork if self._fork is not None else self._job.fork

    @property
    def fork_kept(self) -> bool:
        return self._job.fork_kept

    @property
    def status(self) -> JobStatus:
        return self._job.status

    @property
    def position(self) -> int | None:
        return self._job.position

    @property
    def result(self) -> ExecutionResult | None:
        return self._job.result

    def done(self) -> bool:
        return self._job.done()

    def peek(self) -> ExecutionResult:
        return self._job.peek()

    def wait(self, timeout: float | None = None) -> ExecutionResult:
        """The job's result once it ends; ``JobNotFinished`` after ``timeout`` seconds."""
        _check_wait(timeout)
        if self._job.done():  # also once the executor (and its event loop) closed
            return self._job.final()
        return self._portal.call(self._job.wait, timeout)

    def cancel(self) -> ExecutionResult:
        """Stop the job and return its final result; again, or once ended: no change."""
        if self._job.done():
            return self._job.final()
        return self._portal.call(self._job.cancel)
