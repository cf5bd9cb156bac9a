"""``kernelexec repl``: type code, keep state.

Lines are collected into a buffer; a blank line or a line that is just ``;;`` runs it (``;;``
lets a block hold blank lines of its own). End of input runs what is left. Works the same
when stdin is a pipe. Ctrl-C interrupts the running block and keeps the session (a kernel's
state too); at the prompt it drops the block being typed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any, TextIO

from ._executor import SyncExecutor
from ._types import ExecutionResult

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
    """Run the blocks read from ``stdin``; returns the last block's exit code (0 if none).

    Ctrl-C while a block runs interrupts that block: a kernel gets an interrupt (its state is
    kept), a stateless block is stopped with all its processes. Ctrl-C while typing drops the
    block being typed. End of input (Ctrl-D) runs what is left and quits.
    """
    status = 0
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
        if code is not None:
            status = _run_one(executor, code, language, stdout, status)
        if line is None:
            return status


def _run_one(
    executor: SyncExecutor[Any], code: str, language: str, stdout: TextIO, status: int
) -> int:
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
    mid-protocol. An executor without ``interrupt()`` (stateless) keeps the default handler.
    """
    interrupt = getattr(executor, "interrupt", None)
    if interrupt is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        interrupt()

    previous = signal.signal(signal.SIGINT, on_sigint)
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
