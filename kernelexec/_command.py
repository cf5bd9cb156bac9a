"""The stateless executor: each block is written to a file and run in a fresh process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import re
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ._budget import StreamDecoder, TextBudget, omitted_marker
from ._charts import CHART_MIME, chart_summary
from ._door import Door
from ._errors import InvalidBlock, KernelExecError
from ._executor import AsyncExecutor, PreparedBlock, SyncExecutor, error_result, make_work_dir
from ._outputs import TerminalText, visible_text
from ._types import EXIT_ERROR, EXIT_OK, EXIT_TIMEOUT, ErrorInfo, ExecutionResult, NbOutput
from ._workdir import INTERNAL_DIR, folder_option
from .backends.base import CommandBackend, CommandOutcome
from .backends.local_command import LocalCommand

_EXTENSIONS = {
    "python": ".py",
    "shell": ".sh",
    "powershell": ".ps1",
    "r": ".R",
    "javascript": ".js",
    "typescript": ".ts",
}
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")

# Set for every stateless run so output streams as it is made and plots never try a display.
_BASE_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8", "MPLBACKEND": "Agg"}


#: where unnamed blocks' code files go by default (inside kernelexec's own ``.kernelexec``)
CODE_DIR = f"{INTERNAL_DIR}/code"


# A stateless block has no inline backend: this matplotlib backend (a file of its own, run by
# the block's interpreter, which may not have kernelexec) makes plt.show() save each figure.
_FIGURE_BACKEND = Path(__file__).with_name("_resources") / "kernelexec_show.py"
# ... and with charts on, it makes each figure's chart document with the kernels' extractor
_CHART_EXTRACTOR = _FIGURE_BACKEND.with_name("kernelexec_charts.py")
_FIGURE_DIR = f"{INTERNAL_DIR}/mpl"  # relative: the block runs in the work dir, here or in Docker


def _figure_env(host: Mapping[str, str], outputs_dir: str | None) -> dict[str, str]:
    if outputs_dir is None:
        return {}
    path = os.pathsep.join(p for p in (_FIGURE_DIR, host.get("PYTHONPATH")) if p)
    return {"MPLBACKEND": "module://kernelexec_show", "PYTHONPATH": path}


def _install_figure_backend(door: Door) -> None:
    """Put the backend in the work dir (a block may have deleted it, or the whole folder)."""
    for source in (_FIGURE_BACKEND, _CHART_EXTRACTOR):
        target = f"{_FIGURE_DIR}/{source.name}"
        if not door.is_file(target):
            door.write_bytes(target, source.read_bytes())


class AsyncCommandLineExecutor(AsyncExecutor):
    """Runs each block in a new process (stateless): nothing survives from block to block."""

    kind = "command"

    def __init__(
        self,
        backend: CommandBackend | None = None,
        *,
        python: str | os.PathLike[str] | None = None,
        code_dir: str | None = None,
        **options: Any,
    ) -> None:
        if backend is not None and python is not None:
            raise ValueError("give either backend= or python=, not both")
        #: where unnamed blocks' code files go, relative to the work dir: kernelexec's own
        #: folder by default (not left among the user's files); "." for the work dir itself,
        #: as AG2's and autogen-ext's executors do
        self.code_dir = folder_option(code_dir, "code_dir", allow_root=True)
        self.backend = backend or LocalCommand(python=python)
        super().__init__(**options)
        # The environment is read now, when the executor is built, never at import.
        host = os.environ if self.backend.inherits_host_env else {}
        self._env = {**host, **_BASE_ENV, **_figure_env(host, self.options.outputs_dir)}
        self._env.update(self.options.env)
        self._running: asyncio.Future[CommandOutcome] | None = None  # the block's back-end run
        self._stopped_by = _CLOSED  # what cancelled ``_running``: close() or restart()

    @property
    def supported_languages(self) -> tuple[str, ...]:
        return tuple(self.backend.supported_languages())

    async def close(self) -> None:
        """Stop the back end; a block running meanwhile (another task or thread) is stopped
        rather than waited for: its processes are killed and its result says so."""
        self._stop_running_block(_CLOSED)
        await super().close()

    async def restart(self) -> None:
        """Start afresh (a Docker back end: a new container); a block running meanwhile is
        stopped first, as by ``close()``."""
        self._stop_running_block(_RESTARTED)
        await super().restart()

    def _functions_added(self) -> None:
        # A code file runs from its own folder (kernelexec's code dir, or a named file's), so
        # the work dir goes first on the path: relative, it is the block's working dir whether
        # that is on this host, in a sandbox or in a container.
        path = self._env.get("PYTHONPATH")
        if path is None or path.split(os.pathsep)[0] != ".":
            self._env["PYTHONPATH"] = os.pathsep.join(p for p in (".", path) if p)

    def _stop_running_block(self, why: str) -> None:
        if not self.closed and os.getpid() == self._owner and self._running is not None:
            self._stopped_by = why
            self._running.cancel()  # the back end kills what the block started

    async def _start(self) -> None:
        await self.backend.start(self.work_dir)

    async def _restart(self) -> None:
        await self.backend.restart()

    async def _close(self) -> None:
        await self.backend.close()

    async def _run_block(self, block: PreparedBlock, timeout: float) -> ExecutionResult:
        try:
            code_path = self._write_code(block)
        except (OSError, KernelExecError) as exc:  # "# filename: data", a folder; a link
            name = block.target.relative_to(self.work_dir) if block.target else "the code file"
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            return error_result(
                f"Block refused: cannot write {name}: {why}",
                language=block.language,
            )
        rel = code_path.relative_to(self.work_dir).as_posix()
        argv = self.backend.argv_for(block.language, rel)
        if argv is None:  # supported_languages said yes, the back end says no
            raise InvalidBlock(f"unsupported language: {block.language}")
        capture = _Capture(self, block)
        try:
            outcome = await self._run_until_closed(
                functools.partial(
                    self.backend.run,
                    argv,
                    work_dir=self.work_dir,
                    env=self._block_env(block),
                    timeout=timeout,
                    on_stdout=capture.stdout,
                    on_stderr=capture.stderr,
                )
            )
        finally:
            capture.close()
            if self.options.cleanup_code_files and block.target is None:
                self._door.unlink(code_path)
        return capture.result(block, outcome, timeout, code_path)

    async def _run_until_closed(
        self, run: Callable[[], Awaitable[CommandOutcome]]
    ) -> CommandOutcome:
        """The back end's run of a block, which ``close()`` may cancel: the back end kills the
        block's processes, and the outcome says it was stopped by close."""
        if self.closed:  # close() came while the block waited for the back end to start
            return CommandOutcome(exit_code=None, killed_reason=_NOT_RUN)
        task = self._running = asyncio.ensure_future(run())
        self._stopped_by = _CLOSED
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # our caller gave up: the block must not run on
            task.cancel()
            await asyncio.wait({task})
            raise
        finally:
            self._running = None
        if task.cancelled():
            return CommandOutcome(exit_code=None, killed_reason=self._stopped_by)
        return task.result()

    def _block_env(self, block: PreparedBlock) -> dict[str, str]:
        if self.options.outputs_dir is None or block.language != "python":
            return self._env
        try:
            _install_figure_backend(self._door)
        except (OSError, KernelExecError):
            return self._env  # its folder is a link the code planted: plots are not saved
        # plt.show() in this block saves figures as the stateful executor names them
        prefix = f"{self.options.outputs_dir}/cell{block.index}-"
        env = {**self._env, "KERNELEXEC_FIGURE_PREFIX": prefix}
        if self.options.charts:  # ... and each one's chart document beside it, for _Charts
            env["KERNELEXEC_CHARTS"] = "1"
        return env

    def _write_code(self, block: PreparedBlock) -> Path:
        if block.target is not None:
            path = block.target
        else:
            # surrogatepass: code from JSON may hold lone surrogates; it still gets a stable name
            digest = hashlib.sha256(block.code.encode("utf-8", "surrogatepass")).hexdigest()[:16]
            folder = self.work_dir / (self.code_dir or CODE_DIR)
            path = folder / f"tmp_code_{digest}{_EXTENSIONS[block.language]}"
        make_work_dir(self.work_dir)  # a block may have removed it
        self._save_code(path, block.code)  # through the door: a planted link is not followed
        return path


# A partial line held back from ``output`` longer than this is let through as it is: what is
# held stays small whatever one line's length.
_HOLD_LIMIT = 1 << 16


class _Capture:
    """Bounded capture of one block's stdout and stderr.

    ``stdout`` and ``stderr`` keep each stream's text as it came. ``output`` merges the two at
    line boundaries: a partial line of one stream is held until its newline (or the block's
    end), so that a line the other stream wrote meanwhile goes before it instead of inside it.
    Without that, an unbuffered ``write('hi'); stderr.write('err\\n'); write('\\n')`` read
    ``hierr``, in whichever order the two pipes happened to be read.
    """

    def __init__(self, executor: AsyncCommandLineExecutor, block: PreparedBlock) -> None:
        limit = executor.options.output_limit
        spill = executor._internal_path("output", f"block-{block.index}.txt")
        self._executor = executor
        # as written, spilled in full (through the work dir's door: the code may plant links)
        self.combined = TextBudget(limit, spill_path=spill, spill_open=executor._door.create_text)
        # ``output`` shows what a terminal would: ``\r`` and ``\b`` resolved, as kernels do
        self.view = TextBudget(limit)
        self.charts = _Charts.of(executor, block)
        sink = self.view.write if self.charts is None else self._view_lines
        self._terminal = TerminalText(sink, max_line=limit)
        self.out = TextBudget(limit)
        self.err = TextBudget(limit)
        self._decoders = {"stdout": StreamDecoder(), "stderr": StreamDecoder()}
        # Each stream's partial line not yet in ``combined`` (oldest stream first), and its length.
        self._held: dict[str, list[str]] = {}
        self._held_len = {"stdout": 0, "stderr": 0}

    def stdout(self, data: bytes) -> None:
        self._feed("stdout", self._decoders["stdout"].feed(data))

    def stderr(self, data: bytes) -> None:
        self._feed("stderr", self._decoders["stderr"].feed(data))

    def _feed(self, name: str, text: str) -> None:
        if not text:
            return
        (self.out if name == "stdout" else self.err).write(text)
        self._merge(name, text)
        if name == "stdout" and self.charts is not None:  # a figure's line: its chart, live
            for output in self.charts.emitted(text):
                self._executor._emit(output)
            return
        self._executor._emit({"output_type": "stream", "name": name, "text": text})

    def _merge(self, name: str, text: str) -> None:
        end = text.rfind("\n") + 1
        if end:  # a line ends here: the stream's held start of it goes first
            self._release(name)
            self._put(text if end == len(text) else text[:end])
            text = text[end:]
        if text:
            self._held.setdefault(name, []).append(text)
            self._held_len[name] += len(text)
            if self._held_len[name] > _HOLD_LIMIT:
                self._release(name)

    def _release(self, name: str) -> None:
        self._held_len[name] = 0
        for text in self._held.pop(name, ()):
            self._put(text)

    def _view_lines(self, text: str) -> None:
        """Finished terminal lines into the view, each figure's line said as its chart's."""
        assert self.charts is not None
        self.view.write(self.charts.said(text))

    def _put(self, text: str) -> None:
        """Merged text, whole lines of one stream at a time: as written and as a terminal."""
        self.combined.write(text)
        self._terminal.write(text)

    def close(self) -> None:
        for name, decoder in self._decoders.items():
            self._feed(name, decoder.finish())
        for name in list(self._held):  # the partial lines left, the oldest first
            self._release(name)
        self._terminal.flush()
        self.combined.close()

    def _output(self) -> str:
        """The terminal view, no raw control bytes in it (it is put before a model)."""
        head, omitted, tail = self.view.parts()
        spill = self.combined.spilled_to
        if omitted:
            return visible_text(head) + omitted_marker(omitted, spill) + visible_text(tail)
        output = visible_text(head)
        if spill is not None:  # the view fits, what was written did not (a progress bar)
            output += ("" if output.endswith("\n") else "\n") + f"[full output in {spill}]"
        return output

    def result(
        self, block: PreparedBlock, outcome: CommandOutcome, timeout: float, code_path: Path
    ) -> ExecutionResult:
        output = self._output()
        stdout, stderr = self.out.text(), self.err.text()
        exit_code, timed_out = outcome.exit_code, outcome.timed_out
        error: ErrorInfo | None = None
        if outcome.killed_reason in _STOPPED:
            error = ErrorInfo(ename="Stopped", evalue=_STOPPED[outcome.killed_reason])
            output = f"{output.rstrip()}\n{error}" if output.strip() else str(error)
            exit_code = EXIT_ERROR if outcome.killed_reason == _NOT_RUN else _EXIT_KILLED
        elif timed_out:
            # The ename says "Timeout"; the value does not repeat it ("Timeout: Timeout: ...").
            error = ErrorInfo(
                ename="Timeout", evalue=f"the block ran longer than {timeout:g} s and was killed."
            )
            output = f"{output.rstrip()}\n{error}" if output.strip() else str(error)
            exit_code = EXIT_TIMEOUT
        elif exit_code is not None and exit_code < 0:
            name = signal.Signals(-exit_code).name if -exit_code in _SIGNALS else str(-exit_code)
            note = f"The process was killed by signal {name}."
            output = f"{output.rstrip()}\n{note}" if output.strip() else note
            exit_code = 128 - exit_code
            error = ErrorInfo(ename="Killed", evalue=note)
        elif exit_code:
            error = _error_from_stderr(stderr, block.language, exit_code)
        outputs: list[NbOutput] = []
        for name, text in (("stdout", stdout), ("stderr", stderr)):
            if text:
                outputs.append({"output_type": "stream", "name": name, "text": text})
        outputs.extend(self.charts.outputs if self.charts is not None else ())
        if error is not None:
            outputs.append(
                {
                    "output_type": "error",
                    "ename": error.ename,
                    "evalue": error.evalue,
                    "traceback": list(error.traceback),
                }
            )
        return ExecutionResult(
            exit_code=EXIT_OK if exit_code is None else exit_code,
            output=output,
            stdout=stdout,
            stderr=stderr,
            error=error,
            outputs=outputs,
            code_file=str(code_path),
            timed_out=timed_out,
            truncated=self.combined.truncated,
            language=block.language,
            full_output_file=self.combined.spilled_to,
        )


# A chart document the block wrote is read (as untrusted JSON) only within these bounds: an
# honest one is at most a few hundred KB (kernelexec_charts.py samples every series).
_CHART_BYTES = 1 << 20
_CHARTS_PER_BLOCK = 64
_CHART_BYTES_PER_BLOCK = 8 << 20


class _Charts:
    """The chart documents of a block's figures (the figure backend writes one per figure,
    then prints the figure's line; kernelexec_show.py). Seen in the line, a document is read
    as enemy data: a regular file within the bounds above, JSON, a dict; the line is then said
    as the kernels say it (``[chart: ...; saved to ...]``). Anything else keeps the line as
    printed."""

    def __init__(self, door: Door, figure_prefix: str) -> None:
        self._door = door
        self._prefix = figure_prefix
        self._line = re.compile(
            rf"^\[image/png saved to ({re.escape(figure_prefix)}([1-9][0-9]{{0,8}})\.png)\]$",
            re.MULTILINE,
        )
        self.outputs: list[NbOutput] = []
        self._found: dict[str, NbOutput] = {}  # figure number -> its chart's output (read once)
        self._bytes = 0
        self._newline_due = False  # a chart was shown for a line whose newline has not come

    @classmethod
    def of(cls, executor: AsyncCommandLineExecutor, block: PreparedBlock) -> _Charts | None:
        outputs_dir = executor.options.outputs_dir
        if not executor.options.charts or outputs_dir is None or block.language != "python":
            return None
        return cls(executor._door, f"{outputs_dir}/cell{block.index}-")

    def said(self, text: str) -> str:
        """Finished lines for ``output``: a figure's line with a chart said as the chart."""
        if _FIGURE_LINE not in text:
            return text
        return self._line.sub(self._chart_line, text)

    def _chart_line(self, match: re.Match[str]) -> str:
        output = self._chart(match[2], match[1])
        if output is None:
            return match[0]
        return f"[{output['data']['text/plain']}; saved to {match[1]}]"

    def emitted(self, text: str) -> list[NbOutput]:
        """A stdout chunk as the outputs shown live: a figure's line (whole in the chunk) that
        has a chart becomes its display, as a kernel's figure is; the rest stays stream text."""
        outputs: list[NbOutput] = []
        start = int(self._newline_due and text.startswith("\n"))  # the line's end, split off
        self._newline_due = False
        for match in self._line.finditer(text) if _FIGURE_LINE in text else ():
            output = self._chart(match[2], match[1])
            if output is None:
                continue
            if match.start() > start:
                outputs.append(_stream(text[start : match.start()]))
            outputs.append(output)
            start = match.end() + (text[match.end() : match.end() + 1] == "\n")
            self._newline_due = match.end() == len(text)
        if start < len(text):
            outputs.append(_stream(text[start:]))
        return outputs

    def _chart(self, number: str, figure: str) -> NbOutput | None:
        if number in self._found:
            return self._found[number]
        doc = self._read(number)
        if doc is None:
            return None
        line = chart_summary(doc)
        output: NbOutput = {
            "output_type": "display_data",
            "data": {CHART_MIME: doc, "text/plain": line},
            "metadata": {"kernelexec": {"file": figure}},
        }
        self.outputs.append(output)
        self._found[number] = output
        return output

    def _read(self, number: str) -> dict[str, Any] | None:
        path = f"{self._prefix}{number}.chart.json"
        try:
            if len(self.outputs) >= _CHARTS_PER_BLOCK or self._bytes >= _CHART_BYTES_PER_BLOCK:
                return None
            raw = self._door.read_bytes(path, limit=_CHART_BYTES)
        except (OSError, KernelExecError):  # none (charts failed), a link, too large
            return None
        finally:  # read or not, it goes: the figure's file is what stays
            with contextlib.suppress(OSError, KernelExecError):
                self._door.unlink(path)
        self._bytes += len(raw)
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        return doc if isinstance(doc, dict) else None


_FIGURE_LINE = "[image/png saved to "


def _stream(text: str) -> NbOutput:
    return {"output_type": "stream", "name": "stdout", "text": text}


_SIGNALS = {s.value for s in signal.Signals}
# CommandOutcome.killed_reason of a block stopped by close() or restart(), and of one close()
# came before
_CLOSED, _RESTARTED, _NOT_RUN = "close", "restart", "closed before the start"
_STOPPED = {
    _CLOSED: "the executor was closed while the block ran; its processes were killed.",
    _RESTARTED: "the executor was restarted while the block ran; its processes were killed.",
    _NOT_RUN: "the executor was closed before the block started; nothing of it ran.",
}
_EXIT_KILLED = 128 + signal.SIGKILL  # as a shell reports a process killed by SIGKILL


def _error_from_stderr(stderr: str, language: str, exit_code: int) -> ErrorInfo:
    """Best effort: a Python traceback's last line names the exception."""
    lines = stderr.rstrip().splitlines()
    if language == "python" and lines and _python_error(lines):
        match = _EXCEPTION_LINE.match(lines[-1])
        if match:
            return ErrorInfo(ename=match[1], evalue=match[2] or "", traceback=lines)
    return ErrorInfo(ename="NonZeroExit", evalue=f"exit status {exit_code}", traceback=lines[-20:])


def _python_error(lines: list[str]) -> bool:
    """A traceback, or the interpreter's report of a file it could not compile (no header)."""
    if lines[0].startswith("Traceback"):
        return True
    return lines[0].startswith('  File "') and lines[-1].startswith(_COMPILE_ERRORS)


_COMPILE_ERRORS = ("SyntaxError", "IndentationError", "TabError")


class CommandLineExecutor(SyncExecutor[AsyncCommandLineExecutor], core=AsyncCommandLineExecutor):
    """Synchronous stateless executor: each block runs in a fresh process.

    >>> with CommandLineExecutor(timeout=10) as ex:
    ...     ex.execute("print(1)").output
    '1\\n'
    """

    @property
    def backend(self) -> CommandBackend:
        return self.aio.backend
