"""``kernelexec repl``: type code, keep state.

Lines are collected into a buffer; a blank line or a line that is just ``;;`` runs it (``;;``
lets a block hold blank lines of its own). End of input runs what is left. Works the same
when stdin is a pipe, which is how it is tested.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TextIO

from ._executor import SyncExecutor
from ._types import ExecutionResult

_RUN_MARK = ";;"


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
    """Run the blocks read from ``stdin``; returns the last block's exit code (0 if none)."""
    status = 0
    if prompt:
        stdout.write("kernelexec repl: a blank line (or ;;) runs the code; Ctrl-D quits.\n")
    for code in split_blocks(_lines(stdin, stdout, prompt), separator_only=separator_only):
        result = executor.execute(code, language)
        text = render(result)
        if text:
            stdout.write(text + "\n")
        stdout.flush()
        status = result.exit_code
    return status


def _lines(stdin: TextIO, stdout: TextIO, prompt: bool) -> Iterable[str]:
    while True:
        if prompt:
            stdout.write(">>> ")
            stdout.flush()
        line = stdin.readline()
        if not line:
            return
        yield line
