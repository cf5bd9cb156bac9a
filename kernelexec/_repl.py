"""``kernelexec repl``: type code, keep state.

In a terminal, ``run_interactive`` gives line editing and a persistent history (prompt_toolkit,
which IPython already depends on): Enter runs a block once it is complete, as IPython decides.
From a pipe, ``run_repl`` reads plain lines: they are collected into a buffer, and a blank line
or a line that is just ``;;`` runs it (``;;`` lets a block hold blank lines of its own); end of
input runs what is left. Either way Ctrl-C interrupts the running block and keeps the session
(a kernel's state too); at the prompt it drops the block being typed.
"""

from __future__ import annotations

import codeop
import contextlib
import os
import re
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from ._executor import SyncExecutor
from ._extract import normalize_language
from ._types import ExecutionResult
from ._view import LiveView, block_footer

_RUN_MARK = ";;"
_EXIT_INTERRUPTED = 130  # as a shell reports a command ended by Ctrl-C


def split_blocks(lines: Iterable[str], *, separator_only: bool = False) -> Iterable[str]:
    """Yield each buffer of code as it is completed by a blank line, ``;;`` or the end."""
    buffer: list[str] = []
    for raw in lines:
        line = raw.rstrip("\n")
        ends = line.strip() == _RUN_MARK or (not separator_only and not line.strip())
        if not ends:
            buffer.append(line)
            continue
        if any(b.strip() for b in buffer):
            yield "\n".join(buffer) + "\n"
        buffer = []
    if any(b.strip() for b in buffer):
        yield "\n".join(buffer) + "\n"


def render(result: ExecutionResult) -> str:
    """What the REPL prints for one result."""
    parts = [result.output.rstrip("\n")] if result.output.strip() else []
    if result.files:
        parts.append("Files: " + ", ".join(result.output_files))
    if not result.ok:
        parts.append(f"[exit code {result.exit_code}]")
    return "\n".join(parts)


def run_repl(
    executor: SyncExecutor[Any],
    stdin: TextIO,
    stdout: TextIO,
    *,
    language: str = "python",
    prompt: bool = False,
    separator_only: bool = False,
) -> int:
    """Run the blocks read from ``stdin``; returns the session's status: 1 if any block
    failed (not only the last: input piped in is a script), else 0.

    Ctrl-C while a block runs interrupts that block: a kernel gets an interrupt (its state is
    kept), a stateless block is stopped with all its processes. Ctrl-C while typing drops the
    block being typed. End of input (Ctrl-D) runs what is left and quits.
    """
    failed = False
    if prompt:
        stdout.write(
            "kernelexec repl: a blank line (or ;;) runs the code; "
            "Ctrl-C interrupts; Ctrl-D quits.\n"
        )
    buffer: list[str] = []
    while True:
        try:
            line = _read_line(stdin, stdout, prompt, continued=bool(buffer))
        except KeyboardInterrupt:
            stdout.write("\nKeyboardInterrupt\n")
            stdout.flush()
            buffer = []
            continue
        ends = (
            line is None or line.strip() == _RUN_MARK or (not separator_only and not line.strip())
        )
        if line is not None and not ends:
            buffer.append(line)
            continue
        code = "\n".join(buffer) + "\n" if any(b.strip() for b in buffer) else None
        buffer = []
        switched = None if code is None else switch_language(code, language, executor, stdout)
        if switched is not None:
            language, code = switched, None
        if code is not None and _run_one(executor, code, language, stdout) != 0:
            failed = True
        if line is None:
            return 1 if failed else 0


_LANG = re.compile(r"\s*%lang(?:\s+(\S+))?\s*")


def switch_language(
    code: str, current: str, executor: SyncExecutor[Any], out: TextIO
) -> str | None:
    """For a ``%lang r`` line, the language of the blocks after it (None: not such a line).
    ``%lang`` alone says which language is on and what the session runs."""
    match = _LANG.fullmatch(code)
    if match is None:
        return None
    supported = ", ".join(executor.supported_languages)
    language = current if match[1] is None else normalize_language(match[1])
    if language not in executor.supported_languages:
        out.write(f"unsupported language: {match[1]} (this session runs: {supported})\n")
        language = current
    elif match[1] is None:
        out.write(f"language: {current} (this session runs: {supported}; %lang NAME switches)\n")
    else:
        out.write(f"language: {language}\n")
    out.flush()
    return language


def _run_one(executor: SyncExecutor[Any], code: str, language: str, stdout: TextIO) -> int:
    try:
        with _ctrl_c_interrupts(executor):
            result = executor.execute(code, language)
    except KeyboardInterrupt:
        # A stateless block (no interrupt to send): the call was cancelled and its processes
        # killed. Nothing else was lost; the session goes on.
        stdout.write("\nKeyboardInterrupt\n")
        stdout.flush()
        return _EXIT_INTERRUPTED
    text = render(result)
    if text:
        stdout.write(text + "\n")
    stdout.flush()
    return result.exit_code


@contextlib.contextmanager
def _ctrl_c_interrupts(executor: SyncExecutor[Any]) -> Iterator[None]:
    """While a block runs, SIGINT interrupts the kernel instead of raising here.

    Raising ``KeyboardInterrupt`` in the waiting thread would abandon the execute request in
    mid-protocol. An executor without ``interrupt()`` (stateless) gets Python's default handler
    (``KeyboardInterrupt``, which cancels the call) set, not merely kept: a REPL started where
    SIGINT is ignored (a background job of a script: the ignoring is inherited) would otherwise
    let Ctrl-C do nothing until the block ended.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupt: Callable[[], object] | None = getattr(executor, "interrupt", None)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if interrupt is not None:
            interrupt()

    handler = signal.default_int_handler if interrupt is None else on_sigint
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _read_line(stdin: TextIO, stdout: TextIO, prompt: bool, *, continued: bool) -> str | None:
    """One line without its newline, or None at end of input."""
    if prompt:
        stdout.write("... " if continued else ">>> ")
        stdout.flush()
    line = stdin.readline()
    if not line:
        if prompt:
            stdout.write("\n")
        return None
    return line.rstrip("\n")


# -- the interactive terminal (prompt_toolkit) -------------------------------------------------
_HISTORY_ENV = "KERNELEXEC_HISTORY"


def history_path() -> Path:
    """Where the REPL keeps its history: ``$KERNELEXEC_HISTORY``, else the XDG state folder."""
    if os.environ.get(_HISTORY_ENV):
        return Path(os.environ[_HISTORY_ENV])
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "kernelexec" / "repl_history"


def is_complete(text: str, language: str) -> bool:
    """Whether Enter should run ``text`` (else it starts a new line, as in IPython).

    Python: the code compiles as it is and its last line is not indented (a blank line ends an
    indented block); ``%`` magics and ``!`` shell lines are complete. Shell: a line not ending
    in a backslash.
    """
    if not text.strip():
        return True
    last = text.split("\n")[-1]
    if language != "python":
        return not text.rstrip("\n").endswith("\\")
    if text.lstrip().startswith(("%", "!")) and "\n" not in text.strip():
        return True
    if "\n" in text and last.strip() == "":
        return True  # a blank line after a block ends it, even an unfinished one
    if last.startswith((" ", "\t")):
        return False
    try:
        return codeop.compile_command(text, "<repl>", "exec") is not None
    except (SyntaxError, ValueError, OverflowError):
        return True  # let the kernel report the error


def run_interactive(executor: SyncExecutor[Any], out: TextIO, *, language: str = "python") -> int:
    """The terminal REPL: line editing, a persistent history, multi-line blocks with a
    continuation prompt, output as it happens and each block's files and status after it."""
    session = _prompt_session(language, _completer(executor, language))
    view = LiveView(out, colour=out.isatty())
    executor.aio.on_output = view
    if hasattr(executor.aio, "input_callback"):  # a kernel: input() in a block asks here
        executor.aio.input_callback = _terminal_input(view, out)
    out.write(
        "kernelexec repl: Enter runs a complete block (a blank line ends an indented one); "
        "Ctrl-C interrupts; Ctrl-D quits.\n"
    )
    while True:
        try:
            code = session.prompt(">>> ")
        except KeyboardInterrupt:
            out.write("KeyboardInterrupt\n")  # the block being typed is dropped
            continue
        except EOFError:
            return 0  # the session ended as asked, whatever its blocks did
        if code.strip():
            _run_live(executor, code.rstrip("\n") + "\n", language, view, out)


def _completer(executor: SyncExecutor[Any], language: str) -> Any:
    """Tab completes from the kernel (its ``complete_request``: a few ms at an idle prompt);
    None where the executor has no kernel to ask. Not prompt_toolkit's ThreadedCompleter: its
    generator never resumed after a call into the executor's loop thread (measured)."""
    if language != "python" or not hasattr(executor, "completion_start"):
        return None
    complete: Callable[[str, int], list[str]] = getattr(executor, "complete")  # noqa: B009
    start_of: Callable[[str, int], int] = executor.completion_start
    from prompt_toolkit.completion import Completer, Completion

    class KernelCompleter(Completer):
        def get_completions(self, document: Any, event: Any) -> Iterator[Any]:
            text, cursor = document.text, document.cursor_position
            try:
                start = start_of(text, cursor)
                matches = complete(text, cursor)
            except Exception:  # a gone kernel: no completions, never an error
                return
            for match in matches:
                yield Completion(match, start_position=start - cursor)

    return KernelCompleter()


def _terminal_input(view: LiveView, out: TextIO) -> Callable[[str], str]:
    """``input()`` in a block: the prompt and the answer at this terminal (the REPL waits for
    the block meanwhile, so the terminal is free)."""

    def ask(prompt: str) -> str:
        view.finish()
        out.flush()
        try:
            return input(prompt)
        except EOFError:
            return ""

    return ask


def _prompt_session(language: str, completer: Any = None) -> Any:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    path = history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = KeyBindings()

    @keys.add("enter")
    def _(event: Any) -> None:
        buffer = event.current_buffer
        if is_complete(buffer.text, language):
            buffer.validate_and_handle()
        else:
            indent = len(buffer.document.current_line) - len(buffer.document.current_line.lstrip())
            extra = 4 if buffer.document.current_line.rstrip().endswith(":") else 0
            buffer.insert_text("\n" + " " * (indent + extra))

    return PromptSession(
        history=FileHistory(str(path)),
        multiline=True,
        key_bindings=keys,
        prompt_continuation=lambda width, line, soft: "... ".rjust(width),
        completer=completer,
        complete_while_typing=False,  # Tab asks the kernel; typing does not
    )


def _run_live(
    executor: SyncExecutor[Any], code: str, language: str, view: LiveView, out: TextIO
) -> int:
    try:
        with _ctrl_c_interrupts(executor):
            result = executor.execute(code, language)
    except KeyboardInterrupt:
        view.finish()
        out.write("KeyboardInterrupt\n")
        out.flush()
        return _EXIT_INTERRUPTED
    view.finish()
    if result.files or not result.ok:
        out.write(block_footer(result, executor.work_dir) + "\n")
    out.flush()
    return result.exit_code
