"""What a person sees of a run in a terminal: output as it happens, then a section per block.

``LiveView`` is an executor's ``on_output`` callback: stream text is written as it arrives (a block
that prints a tick every second shows the ticks then, not at the end), errors and rich outputs as
one line each. ``block_header`` / ``block_footer`` frame each block; ``not_run_line`` says why a
block was skipped. The text an LLM reads (``ExecutionResult.output``) is unaffected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from ._charts import data_summaries
from ._outputs import file_form, strip_ansi
from ._types import ExecutionResult, NbOutput


class LiveView:
    """Writes each output to ``out`` as it arrives (call it from any one thread)."""

    def __init__(self, out: TextIO, *, colour: bool = False) -> None:
        self._out = out
        self._colour = colour
        self._at_line_start = True

    def __call__(self, output: NbOutput) -> None:
        kind = output.get("output_type")
        if kind == "stream":
            self._write(_text(output.get("text", "")))
        elif kind == "error":
            lines = [str(line) for line in output.get("traceback") or []]
            text = "\n".join(lines) if lines else f"{output.get('ename')}: {output.get('evalue')}"
            self._line(text if self._colour else strip_ansi(text))
        elif kind in {"display_data", "execute_result"}:
            self._line(_display_line(output.get("data") or {}, _omitted(output)))

    def finish(self) -> None:
        """End a block's output on a line of its own."""
        if not self._at_line_start:
            self._write("\n")

    def _line(self, text: str) -> None:
        self.finish()
        self._write(text.rstrip("\n") + "\n")

    def _write(self, text: str) -> None:
        if text:
            self._out.write(text)
            self._out.flush()
            self._at_line_start = text.endswith("\n")


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _omitted(output: NbOutput) -> list[str]:
    """The MIME types left out of an output's data as too large (they live in their files)."""
    note = (output.get("metadata") or {}).get("kernelexec")
    omitted = note.get("omitted_data") if isinstance(note, dict) else None
    return [str(mime) for mime in omitted] if isinstance(omitted, dict) else []


def _display_line(data: dict[str, Any], omitted: list[str]) -> str:
    """A rich output as one line: the file-backed forms it has, else its plain text."""
    chart, table_line = data_summaries(data)
    if chart is not None:  # what the chart shows says more than "[image/png]"
        return f"[{chart}]"
    mimes = [*data, *omitted]
    forms = [mime for mime in mimes if mime != "text/plain" and file_form(mime) is not None]
    table = f"\n[{table_line}]" if table_line is not None else ""
    if forms:
        return f"[{', '.join(forms)}]{table}"
    return _text(data.get("text/plain", "")).rstrip("\n") + table


def block_header(index: int, total: int, language: str) -> str:
    return f"── block {index} of {total} · {language or 'unknown'} ──"


def block_footer(result: ExecutionResult, work_dir: Path) -> str:
    """Exit status, duration, what kernelexec did about a timeout or a dead kernel (the live
    view shows only what the code printed), and the files saved (relative to the work dir)."""
    status = "ok" if result.ok else ("timed out" if result.timed_out else "failed")
    status = "not run" if result.not_run else status
    lines = []
    if result.error is not None and (result.timed_out or result.kernel_died or result.not_run):
        what = str(result.error) if result.timed_out else result.error.evalue  # "Timeout: ..."
        lines.append(strip_ansi(what or result.error.ename))
    lines.append(f"── exit {result.exit_code} ({status}) · {result.duration_s:.2f} s")
    for path in result.files:
        lines.append(f"   saved: {_relative(Path(path), work_dir)}")
    return "\n".join(lines)


def not_run_line(index: int, total: int, failed: int, result: ExecutionResult) -> str:
    why = "timed out" if result.timed_out else "failed"
    return f"── block {index} of {total} not run: block {failed} {why}"


def _relative(path: Path, work_dir: Path) -> str:
    try:
        return str(path.relative_to(work_dir))
    except ValueError:
        return str(path)
