"""Kernel messages -> nbformat v4 outputs, and the text views of them.

``OutputCollector`` is fed the iopub messages of one block. It keeps the nbformat outputs (the one
output model), saves every MIME type that has a file form into the work dir, and keeps memory
bounded however much a block prints: stream text is held head + tail (``TextBudget``) and the full
text is spilled to a file; so are an error's text and a display's ``text/plain`` (cut with the true
count), and any other payload larger than ``inline_limit`` lives only in its file.

Stream text is kept as written in ``stdout`` / ``stderr``, the outputs and the spill file; only
``output`` (the text a model reads) resolves it the way a terminal would (``\\r`` returns to the
start of the line, ``\\b`` steps back, so progress bars collapse to their last state).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ._budget import (
    LongText,
    TextBudget,
    cut_lines,
    cut_text,
    full_value,
    join_parts,
    omitted_marker,
    pieces,
    text_length,
)
from ._charts import DATA_MIMES, data_summaries, is_chart_form
from ._door import Door
from ._errors import KernelExecError
from ._types import ErrorInfo, NbOutput

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL_RE = re.compile(r"([\r\b])")

#: MIME type -> (file extension, how the payload is stored in the message)
MIME_FILES: dict[str, tuple[str, str]] = {
    "image/png": ("png", "base64"),
    "image/jpeg": ("jpg", "base64"),
    "image/gif": ("gif", "base64"),
    "application/pdf": ("pdf", "base64"),
    "image/svg+xml": ("svg", "text"),
    "text/html": ("html", "text"),
    "text/markdown": ("md", "text"),
    "text/latex": ("tex", "text"),
    "application/json": ("json", "json"),
    "application/vnd.plotly.v1+json": ("plotly.json", "json"),
}
#: a payload (image, HTML, JSON...) larger than this many characters is kept only in its file
INLINE_LIMIT = 1 << 20
#: payload characters one block keeps inline in all; past it, payloads are kept only in files
INLINE_BLOCK_LIMIT = 8 << 20
# Vega and Vega-Lite carry their major version in the MIME type.
_VEGA_RE = re.compile(r"^application/vnd\.(vega|vegalite)\.v\d+\+json$")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor moves)."""
    return _ANSI_RE.sub("", text)


def file_form(mime: str) -> tuple[str, str] | None:
    """(extension, encoding) when ``mime`` is saved as a file, else None."""
    if mime in MIME_FILES:
        return MIME_FILES[mime]
    match = _VEGA_RE.match(mime)
    if match:
        return ("vl.json" if match[1] == "vegalite" else "vg.json", "json")
    return None


class TerminalText:
    """Stream text resolved like a terminal, committed line by line into a budget.

    Only the line being written is held; finished lines go to ``sink``. A line that grows past
    ``max_line`` without a newline is committed as it is (memory stays bounded).
    """

    def __init__(self, sink: Callable[[str], None], max_line: int) -> None:
        self._sink = sink
        self._max_line = max_line
        self._line = ""
        self._cursor = 0

    def write(self, text: str) -> None:
        if "\r" not in text and "\b" not in text and (last := text.rfind("\n")) != -1:
            # Plain lines: the finished ones go to the sink in one piece, not line by line.
            start = 0
            if self._line:
                first = text.find("\n")
                self._apply(text[:first])
                self._sink(self._line + "\n")
                self._line, self._cursor = "", 0
                start = first + 1
            if start <= last:
                self._sink(text[start : last + 1])
            text = text[last + 1 :]
        start = 0
        # find() rather than split(): a 50 MB message must not become a 50 MB list of lines.
        while (end := text.find("\n", start)) != -1:
            self._apply(text[start:end])
            self._sink(self._line + "\n")
            self._line, self._cursor = "", 0
            start = end + 1
        self._apply(text[start:])
        if len(self._line) > self._max_line:
            self._sink(self._line)
            self._line, self._cursor = "", 0

    def _apply(self, segment: str) -> None:
        if "\r" not in segment and "\b" not in segment:
            self._overwrite(segment)
            return
        for token in _CONTROL_RE.split(segment):
            if token == "\r":
                self._cursor = 0
            elif token == "\b":
                self._cursor = max(0, self._cursor - 1)
            elif token:
                self._overwrite(token)

    def _overwrite(self, text: str) -> None:
        if self._cursor == len(self._line):
            self._line += text
        else:
            end = self._cursor + len(text)
            self._line = self._line[: self._cursor] + text + self._line[end:]
        self._cursor += len(text)

    @property
    def pending(self) -> str:
        return self._line

    def flush(self) -> None:
        if self._line:
            self._sink(self._line)
            self._line, self._cursor = "", 0


class _Stream:
    """One nbformat ``stream`` output under construction (consecutive same-name messages).

    Two bounded copies: the text as written (the output's, like Jupyter's, and ``stdout``'s) and
    its terminal view (``\\r`` and ``\\b`` resolved), which only ``output`` shows."""

    def __init__(self, name: str, limit: int, also: Callable[[str], None]) -> None:
        self.name = name
        self.raw = TextBudget(limit)
        self.view = TextBudget(limit)
        self._also = also
        self.terminal = TerminalText(self.view.write, max_line=limit)

    def write(self, text: str) -> None:
        self.raw.write(text)
        self._also(text)
        self.terminal.write(text)

    def text(self) -> str:
        """The text so far, as written."""
        return self.raw.text()

    def size(self) -> int:
        """Characters written so far (kept or not)."""
        return self.raw.total

    def parts(self) -> tuple[str, int, str]:
        """The terminal view, including the line still being written (not yet committed)."""
        head, omitted, tail = self.view.parts()
        pending = self.terminal.pending
        return (head, omitted, tail + pending) if omitted else (head + pending, 0, "")


class _Display:
    """A ``display_data`` / ``execute_result`` output and its place in the display budget."""

    __slots__ = ("dropped", "forms", "k", "omitted", "out", "plain", "refused", "written")

    def __init__(self, out: NbOutput, k: int | None) -> None:
        self.out = out
        self.k = k  # n in the file names cell{N}-{n}.*; numbered by arrival
        self.dropped = False  # past the budget: counted, its data let go
        self.written = False  # its files are on disk
        #: the forms saved to files (of every MIME type it came with, kept inline or not)
        self.forms: dict[str, tuple[str, str]] = {}
        #: MIME type -> size (characters) of each payload too large to keep: only in its file
        self.omitted: dict[str, int | None] = {}
        #: a ``text/plain`` cut to the budget: (head, characters left out, tail)
        self.plain: tuple[str, int, str] | None = None
        #: MIME type -> why its file was not written (the door refused its place, say)
        self.refused: dict[str, str] = {}


class _Error:
    """An ``error`` output, its fields bounded, and its text's view (cut with the true count)."""

    __slots__ = ("out", "view")

    def __init__(self, out: NbOutput, view: tuple[str, int, str]) -> None:
        self.out = out
        self.view = view


_Item = _Stream | _Display | _Error


@dataclass
class Collected:
    """What one block produced, ready to become an ``ExecutionResult``."""

    outputs: list[NbOutput]
    output: str
    stdout: str
    stderr: str
    error: ErrorInfo | None
    files: list[Path]
    truncated: bool
    full_output_file: Path | None
    execution_count: int | None = None


@dataclass
class _Gap:
    """Where displays past the budget were left out, with the stream text between them."""

    displays: int = 0
    stream_chars: int = 0

    def text(self) -> str:
        also = f" and {self.stream_chars} characters of stream output" if self.stream_chars else ""
        return f"[... {self.displays} display outputs{also} omitted ...]"

    def output(self) -> NbOutput:
        """The output that stands for what was left out."""
        counts = {"omitted_outputs": self.displays}
        if self.stream_chars:
            counts["omitted_stream_characters"] = self.stream_chars
        return {
            "output_type": "display_data",
            "data": {"text/plain": self.text()},
            "metadata": {"kernelexec": counts},
        }


class OutputCollector:
    """Turns one block's iopub messages into nbformat v4 outputs and bounded text views.

    The output budget (``limit`` characters of text) covers display outputs too: the first
    displays are kept while their text fits half of it, then the latest ones that fit the other
    half; those in between are counted in a visible marker output (``[... N display outputs
    omitted ...]``) and their data let go. Files are written only for the displays kept, and
    for payloads too large to keep inline (``inline_limit`` characters each, ``inline_block_limit``
    in all for the block): those are written at once and left out of the output's ``data`` (its
    metadata says which, under ``kernelexec.omitted_data``), so memory holds none of them.
    A ``text/plain`` (an ``execute_result``'s repr) and an error's text are cut to ``limit`` with
    the true count, the full text going to the spill file.
    """

    def __init__(
        self,
        *,
        work_dir: Path,
        cell: int,
        limit: int,
        spill_path: Path | None,
        on_output: Callable[[NbOutput], None] | None = None,
        outputs_dir: str | None = "outputs",
        door: Door | None = None,
        inline_limit: int = INLINE_LIMIT,
        inline_block_limit: int = INLINE_BLOCK_LIMIT,
    ) -> None:
        self._work_dir = work_dir
        # Display files and the spill file are written through the work dir's door: the code
        # may have planted links where they go (``outputs/`` as a link to a host folder).
        self._door = door or Door(work_dir)
        self._inline_limit = inline_limit
        self._inline_block_limit = inline_block_limit
        #: where rich outputs are saved, relative to the work dir (None: not saved as files)
        self._outputs_dir = outputs_dir
        self._cell = cell
        self._limit = limit
        self._on_output = on_output
        self._items: list[_Item] = []
        self._log = TextBudget(limit, spill_path=spill_path, spill_open=self._door.create_text)
        self._std = {"stdout": TextBudget(limit), "stderr": TextBudget(limit)}
        self._display_ids: dict[str, list[_Display]] = {}
        self._saved: dict[Path, None] = {}  # in order; a set's lookups (10,000 displays)
        self._rich_count = 0
        self._clear_pending = False
        self._reset_display_budget()
        self.error: ErrorInfo | None = None
        self.execution_count: int | None = None

    def _reset_display_budget(self) -> None:
        # Display text the head may still take; room is left for the omission marker so the
        # joined text does not cut it off.
        self._head_room = self._limit // 2 - _MARKER_ROOM
        self._head_kept = 0
        self._stream_since_display = 0
        self._tail: deque[tuple[_Display, int]] = deque()  # the latest displays, with their cost
        self._tail_cost = 0
        self._dropped = 0
        self._inline_left = self._inline_block_limit  # payload characters still kept inline

    # -- feeding ---------------------------------------------------------------------------
    def feed(self, msg: dict[str, Any]) -> None:
        """Handle one iopub message (of this block; the caller filters by parent)."""
        kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
        content = msg.get("content", {})
        handler = self._HANDLERS.get(kind or "")
        if handler is not None:
            handler(self, content)

    def _stream(self, content: dict[str, Any]) -> None:
        name = "stderr" if content.get("name") == "stderr" else "stdout"
        text = _string(content.get("text", ""))
        self._maybe_clear()
        last = self._items[-1] if self._items else None
        if not isinstance(last, _Stream) or last.name != name:
            self._end_stream_lines()  # the other stream's output is closed, as in a notebook
            last = _Stream(name, self._limit, self._std_sink(name))
            self._items.append(last)
        for piece in pieces(text):  # a LongText: its full text, a piece at a time
            last.write(piece)
        size = text_length(text)
        self._stream_since_display = min(self._limit, self._stream_since_display + size)
        self._emit({"output_type": "stream", "name": name, "text": str(text)})

    def _std_sink(self, name: str) -> Callable[[str], None]:
        def sink(text: str) -> None:
            self._std[name].write(text)
            self._log.write(text)

        return sink

    def _display(self, content: dict[str, Any], output_type: str) -> None:
        self._maybe_clear()
        self._end_stream_lines()
        out: NbOutput = {
            "output_type": output_type,
            "data": {},
            "metadata": self._bounded_metadata(content.get("metadata")),
        }
        if output_type == "execute_result":
            out["execution_count"] = content.get("execution_count")
        raw = _mapping(content.get("data"))
        k = None
        if any(file_form(mime) for mime in raw):
            self._rich_count += 1
            k = self._rich_count
        display = _Display(out, k)
        self._take_data(display, raw)
        self._items.append(display)
        display_id = content.get("transient", {}).get("display_id")
        if display_id:
            self._display_ids.setdefault(str(display_id), []).append(display)
        # Its text and the stream text printed since the display before: the head and the tail
        # then share the budget with what the loop prints around its displays.
        cost = len(self._display_text(display)) + 1 + self._stream_since_display
        self._stream_since_display = 0
        if cost <= self._head_room or not self._head_kept:
            # The head (the first display at least): always kept, so its files are written now.
            self._head_room = max(0, self._head_room - cost)
            self._head_kept += 1
            self._save_files(display)
            self._log_display(display, raw, saved=True)
        else:
            self._keep_latest(display, cost)
            self._log_display(display, raw, saved=False)
        self._emit(out)

    def _take_data(self, display: _Display, raw: dict[str, Any]) -> None:
        """Put ``raw`` in the display, bounded: ``text/plain`` cut to the budget (its full text
        goes to the spill file when the display is logged); any other payload kept inline if
        it fits the inline limits, else written to its file now (when it has one) and left
        out of ``data``, its size noted in the metadata."""
        display.forms = dict(self._file_forms(raw)) if display.k is not None else {}
        display.omitted = {}
        display.plain = None
        data: dict[str, Any] = {}
        for mime, value in raw.items():
            if mime == "text/plain":
                data[mime] = self._bounded_plain(display, _string(value))
                continue
            size = _payload_size(value, self._inline_limit)
            fits = size <= min(self._inline_limit, self._inline_left)
            if fits and not isinstance(value, LongText):
                self._inline_left -= size
                data[mime] = value
                continue
            display.omitted[mime] = size if isinstance(value, str) else None
            form = display.forms.get(mime)
            if form is not None:
                self._save_one(display, mime, form, value)  # streamed: LongTexts stay whole
        display.out["data"] = data
        meta = display.out["metadata"]  # fresh from the message: no note of an earlier update
        if display.omitted:
            note = meta.get("kernelexec")
            meta["kernelexec"] = {**(note if isinstance(note, dict) else {})}
            meta["kernelexec"]["omitted_data"] = dict(display.omitted)

    def _bounded_plain(self, display: _Display, text: str) -> str:
        if len(text) <= self._limit and not isinstance(text, LongText):
            return text
        budget = TextBudget(self._limit)
        for piece in pieces(text):
            budget.write(piece)
        head, omitted, tail = budget.parts()
        if not omitted:
            return head
        display.plain = (head, omitted, tail)
        return head + omitted_marker(omitted, self._log.spill_path) + tail

    def _bounded_metadata(self, metadata: Any) -> dict[str, Any]:
        if not isinstance(metadata, dict):
            return {}
        size = _payload_size(metadata, self._inline_limit)
        if size <= self._inline_limit:
            return dict(metadata)
        return {"kernelexec": {"omitted_metadata": size}}

    def _log_display(self, display: _Display, raw: dict[str, Any], *, saved: bool) -> None:
        """The display's text in the spill file, a cut ``text/plain`` in full."""
        if display.plain is None:
            self._log.write(self._display_text(display, saved=saved) + "\n")
            return
        for piece in pieces(_string(raw.get("text/plain", ""))):
            self._log.write(piece)
        for line in self._display_lines(display, saved=saved)[1]:
            self._log.write("\n" + line)
        self._log.write("\n")

    def _keep_latest(self, display: _Display, cost: int) -> None:
        """The tail: the latest displays that fit; the oldest of them is dropped to make room."""
        self._head_room = 0  # once a display went to the tail, the head is closed
        self._tail.append((display, cost))
        self._tail_cost += cost
        room = self._limit - self._limit // 2 - _MARKER_ROOM
        while self._tail_cost > room and len(self._tail) > 1:
            old, old_cost = self._tail.popleft()
            self._tail_cost -= old_cost
            old.dropped = True
            old.out = {}
            self._dropped += 1

    def _display_data(self, content: dict[str, Any]) -> None:
        self._display(content, "display_data")

    def _execute_result(self, content: dict[str, Any]) -> None:
        self._display(content, "execute_result")

    def _update_display(self, content: dict[str, Any]) -> None:
        display_id = str(content.get("transient", {}).get("display_id", ""))
        for display in self._display_ids.get(display_id, []):
            if display.dropped:
                continue
            raw = _mapping(content.get("data"))
            display.out["metadata"] = self._bounded_metadata(content.get("metadata"))
            if display.k is None and any(file_form(mime) for mime in raw):
                self._rich_count += 1
                display.k = self._rich_count
            self._take_data(display, raw)
            if display.written:
                self._save_files(display)
            self._emit(display.out)

    def _clear(self, content: dict[str, Any]) -> None:
        if content.get("wait"):
            self._clear_pending = True
        else:
            self._clear_now()

    def _maybe_clear(self) -> None:
        if self._clear_pending:
            self._clear_pending = False
            self._clear_now()

    def _clear_now(self) -> None:
        self._end_stream_lines()
        self._items.clear()
        self._display_ids.clear()
        self._reset_display_budget()  # cleared outputs are not lost: nothing to count

    def _error(self, content: dict[str, Any]) -> None:
        self._maybe_clear()
        self._end_stream_lines()
        ename = _string(content.get("ename", "Error"))
        evalue = _string(content.get("evalue", ""))
        raw_tb = content.get("traceback") or []
        traceback = [_string(line) for line in (raw_tb if isinstance(raw_tb, list) else [raw_tb])]
        # The full text goes to the spill file; what is kept is bounded: an exception with a
        # 100 MB message must not be held for the session, nor be put in front of a model.
        view = TextBudget(self._limit)
        for text in _error_pieces(ename, evalue, traceback):
            for piece in pieces(text):
                view.write(piece)
                self._log.write(piece)
        self._log.write("\n")
        spill = self._log.spilled_to
        out: NbOutput = {
            "output_type": "error",
            "ename": cut_text(ename, self._limit, spill),
            "evalue": cut_text(evalue, self._limit, spill),
            "traceback": cut_lines(traceback, self._limit, spill),  # the notebook keeps colours
        }
        self.error = ErrorInfo(
            ename=out["ename"],
            evalue=out["evalue"],
            traceback=[strip_ansi(line) for line in out["traceback"]],
        )
        self._items.append(_Error(out, view.parts()))
        self._emit(out)

    def _execute_input(self, content: dict[str, Any]) -> None:
        count = content.get("execution_count")
        self.execution_count = count if isinstance(count, int) else self.execution_count

    _HANDLERS: ClassVar[dict[str, Callable[[OutputCollector, dict[str, Any]], None]]] = {
        "stream": _stream,
        "display_data": _display_data,
        "execute_result": _execute_result,
        "update_display_data": _update_display,
        "clear_output": _clear,
        "error": _error,
        "execute_input": _execute_input,
    }

    def _emit(self, output: NbOutput) -> None:
        if self._on_output is not None:
            self._on_output(output)

    def _end_stream_lines(self) -> None:
        """A non-stream output ends the stream before it (as in a notebook)."""
        if self._items and isinstance(self._items[-1], _Stream):
            self._items[-1].terminal.flush()

    # -- rich outputs ------------------------------------------------------------------------
    def _save_files(self, display: _Display) -> None:
        display.written = True
        data = display.out["data"]
        for mime, form in display.forms.items():
            if mime in data:  # the others were written when they came
                self._save_one(display, mime, form, data[mime])

    def _save_one(self, display: _Display, mime: str, form: tuple[str, str], payload: Any) -> None:
        if display.k is None or self._outputs_dir is None:
            return
        ext, encoding = form
        path = self._work_dir / self._outputs_dir / f"cell{self._cell}-{display.k}.{ext}"
        refused = _write_payload(self._door, path, payload, encoding)
        if refused is not None:
            display.refused[mime] = refused
            self._note(display, "not_saved", {mime: refused})
            return
        display.refused.pop(mime, None)
        self._saved[path] = None

    @staticmethod
    def _note(display: _Display, key: str, value: dict[str, Any]) -> None:
        """Add ``value`` to the display's ``kernelexec.<key>`` metadata."""
        meta = display.out.setdefault("metadata", {})
        note = meta.get("kernelexec")
        meta["kernelexec"] = {**(note if isinstance(note, dict) else {})}
        meta["kernelexec"][key] = {**meta["kernelexec"].get(key, {}), **value}

    @staticmethod
    def _file_forms(data: dict[str, Any]) -> list[tuple[str, tuple[str, str]]]:
        """The forms saved to files: one image (the best form), every other kind with a file
        form. All forms stay in the outputs."""
        forms = [(mime, form) for mime in data if (form := file_form(mime))]
        images = [f for f in forms if f[0] in _IMAGE_PREFERENCE]
        if len(images) > 1:
            best = min(images, key=lambda f: _IMAGE_PREFERENCE.index(f[0]))
            forms = [f for f in forms if f[0] not in _IMAGE_PREFERENCE or f is best]
        return forms

    def _display_text(self, display: _Display, *, saved: bool = True) -> str:
        plain, others = self._display_lines(display, saved=saved)
        return "\n".join(others if plain is None else [plain, *others])

    def _display_lines(self, display: _Display, *, saved: bool) -> tuple[str | None, list[str]]:
        """The display's ``text/plain`` (None: not shown) and the lines naming its other forms."""
        data = display.out["data"]
        saved = saved and self._outputs_dir is not None and display.k is not None
        files = display.forms if saved else {}
        plain = _as_text(data["text/plain"]) if "text/plain" in data else None
        if plain is not None and _is_bare_repr(plain) and _has_image(files):
            plain = None  # "<Figure size 640x480 with 1 Axes>" says nothing the file does not
        lines: list[str] = []
        # A chart or table document is said as one line (the chart's on its image's line).
        chart, table = data_summaries(data)
        for mime in [*data, *display.omitted]:
            if mime in DATA_MIMES and mime in data:
                continue
            form = files.get(mime)
            if form is not None:
                rel = f"{self._outputs_dir}/cell{self._cell}-{display.k}.{form[0]}"
                refused = display.refused.get(mime)
                if refused is None and chart is not None and is_chart_form(mime):
                    lines.append(f"[{chart}; saved to {rel}]")
                    chart = None
                elif refused is None:
                    lines.append(f"[{mime} saved to {rel}]")
                else:
                    lines.append(f"[{mime} not saved to {rel}: {refused}]")
            elif mime in display.omitted and not (_has_image(files) and mime in _IMAGE_PREFERENCE):
                size = display.omitted[mime]
                what = "" if size is None else f" of {size} characters"
                lines.append(f"[{mime} output{what} left out: too large to keep]")
            elif mime != "text/plain" and plain is None and not lines:
                lines.append(f"[{mime} output]")
        lines.extend(f"[{line}]" for line in (chart, table) if line is not None)
        return plain, lines

    def pop_error(self, ename: str) -> ErrorInfo | None:
        """Remove the error outputs named ``ename`` (e.g. the ``KeyboardInterrupt`` our own
        interrupt caused) and return the last of them."""
        found = [i for i in self._items if isinstance(i, _Error) and i.out.get("ename") == ename]
        if not found:
            return None
        self._items = [i for i in self._items if not any(i is f for f in found)]
        last = found[-1].out
        if self.error is not None and self.error.ename == ename:
            self.error = None
        return ErrorInfo(
            ename=ename,
            evalue=str(last.get("evalue", "")),
            traceback=[strip_ansi(str(line)) for line in last["traceback"]],
        )

    # -- results -------------------------------------------------------------------------------
    def finish(self) -> Collected:
        """Close the block: flush pending lines, build the outputs and the text views."""
        self._end_stream_lines()
        self._log.close()
        for display, _ in self._tail:
            if not display.written:
                self._save_files(display)  # the latest displays, kept: now their files
        views = self._views()
        parts: list[tuple[str, int, str]] = []
        last_char, previous_stream = "\n", True
        for is_stream, piece in views:
            head, omitted, tail = piece
            if not (head or omitted or tail):
                continue
            # Streams run on as printed; anything else starts on a line of its own.
            if parts and last_char != "\n" and not (previous_stream and is_stream):
                parts.append(("\n", 0, ""))
            parts.append(piece)
            last_char, previous_stream = (tail or head)[-1:], is_stream
        head, omitted, tail = join_parts(parts, self._limit)
        output = visible_text(strip_ansi(head))
        if omitted:
            output += omitted_marker(omitted, None) + visible_text(strip_ansi(tail))
        truncated = bool(omitted) or self._log.truncated or self._dropped > 0
        if self._log.spilled_to is not None and truncated:
            output += f"\n[full output in {self._log.spilled_to}]"
        return Collected(
            outputs=self._outputs(),
            output=output,
            stdout=strip_ansi(self._std["stdout"].text()),
            stderr=strip_ansi(self._std["stderr"].text()),
            error=self.error,
            files=[p for p in self._saved if self._door.is_file(p)],
            truncated=truncated,
            full_output_file=self._log.spilled_to if truncated else None,
            execution_count=self.execution_count,
        )

    def _runs(self) -> list[_Item | _Gap]:
        """The items, each run of dropped displays replaced by a gap that counts them; stream
        output printed between two dropped displays is folded into the gap (counted too), so
        a loop that prints and displays stays a bounded list of outputs."""
        runs: list[_Item | _Gap] = []
        held: list[_Stream] = []  # streams after a gap: folded in if the gap goes on
        for item in self._items:
            gap = runs[-1] if runs and isinstance(runs[-1], _Gap) else None
            if isinstance(item, _Display) and item.dropped:
                if gap is None:
                    gap = _Gap()
                    runs.append(gap)
                gap.stream_chars += sum(stream.size() for stream in held)
                gap.displays += 1
                held = []
            elif isinstance(item, _Stream) and gap is not None:
                held.append(item)
            else:
                runs.extend(held)
                held = []
                runs.append(item)
        runs.extend(held)
        return runs

    def _outputs(self) -> list[NbOutput]:
        outputs: list[NbOutput] = []
        for item in self._runs():
            if isinstance(item, _Gap):
                outputs.append(item.output())
            elif isinstance(item, _Stream):
                outputs.append({"output_type": "stream", "name": item.name, "text": item.text()})
            else:
                outputs.append(item.out)
        return outputs

    def _views(self) -> list[tuple[bool, tuple[str, int, str]]]:
        """(is a stream, (head, omitted, tail)) of each output's text, in order."""
        views: list[tuple[bool, tuple[str, int, str]]] = []
        for item in self._runs():
            if isinstance(item, _Gap):
                views.append((False, (item.text(), 0, "")))
            elif isinstance(item, _Stream):
                views.append((True, item.parts()))
            elif isinstance(item, _Display):
                views.append((False, self._display_view(item)))
            else:
                views.append((False, item.view))
        return views

    def _display_view(self, display: _Display) -> tuple[str, int, str]:
        if display.plain is None:
            return self._display_text(display), 0, ""
        head, omitted, tail = display.plain
        others = self._display_lines(display, saved=True)[1]
        return head, omitted, tail + "".join("\n" + line for line in others)


# Best first: the one image form saved to a file when an output carries several.
_IMAGE_PREFERENCE = ("image/png", "image/jpeg", "image/gif", "image/svg+xml", "application/pdf")
_MARKER_ROOM = 80  # characters of each half kept for the "[... N display outputs omitted ...]" line
_CONTROL_CHARS_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def visible_text(text: str) -> str:
    """``text`` with control characters (NUL, bell, escape...) written as ``\\xNN``.

    For ``output``, the text a model reads: binary output must not put raw control bytes in
    it. Newlines and tabs stay as they are; ``stdout`` / ``stderr`` keep the raw text.
    """
    text = text.replace("\r\n", "\n")  # a Windows line end is a line end
    return _CONTROL_CHARS_RE.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def _as_text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _error_pieces(ename: str, evalue: str, traceback: list[str]) -> Iterator[str]:
    """An error's text in pieces (no joined copy of a huge one)."""
    if not traceback:
        yield from (ename, ": ", evalue)
        return
    # As Jupyter shows it: the lines joined, each kept as it is (a frame's trailing newline
    # is the blank line between frames).
    for i, line in enumerate(traceback):
        if i:
            yield "\n"
        yield line


def _string(value: Any) -> str:
    """``value`` as text; a ``LongText`` stays one (``str()`` would keep only its bounded form)."""
    if isinstance(value, str):
        return value
    return "".join(str(v) for v in value) if isinstance(value, list) else str(value)


def _mapping(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _payload_size(value: Any, cap: int) -> int:
    """A MIME payload's size in characters (as JSON for a structure), counted no further than
    just past ``cap``: a huge payload costs O(cap) to size."""
    if isinstance(value, str):
        return text_length(value)
    size = 0
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack and size <= cap:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, LongText):
            return cap + 1 + item.length  # never kept inline
        elif isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, dict):
            size += 2
            stack.append(itertools.chain.from_iterable(item.items()))
        elif isinstance(item, list | tuple):
            size += 2
            stack.append(iter(item))
        else:
            size += 8  # a number, true, false, null: a few characters
    return size


_END = object()


def _write_payload(door: Door, path: Path, payload: Any, encoding: str) -> str | None:
    """Write one MIME payload; None when written, else why not (it cannot be decoded, or the
    door refuses its place: a link planted on the way), said in the result."""
    if encoding == "json":
        chunks: Iterator[bytes] = iter([json.dumps(full_value(payload), indent=1).encode()])
    elif encoding == "base64":
        chunks = _b64_chunks(_payload_pieces(payload))
    else:
        chunks = (p.encode("utf-8", errors="replace") for p in _payload_pieces(payload))
    try:
        with door.replacing(path) as handle:  # a piece at a time: no whole copy of a payload
            for chunk in chunks:
                handle.write(chunk)
    except KernelExecError as exc:  # first: the tree's errors are built-ins too (ValueError)
        return _one_line(str(exc))
    except (binascii.Error, ValueError, TypeError) as exc:
        return f"its {encoding} payload cannot be decoded ({type(exc).__name__})"
    except OSError as exc:
        return _one_line(_os_reason(exc))
    return None


_PIECE = 1 << 20
_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/=]")


def _payload_pieces(payload: Any) -> Iterator[str]:
    """A MIME payload's text (a string, a ``LongText``, a list of lines) a MiB at a time."""
    for item in payload if isinstance(payload, list) else [payload]:
        text = item if isinstance(item, str) else str(item)
        if isinstance(text, LongText):
            yield from text.chunks()
            continue
        for start in range(0, len(text), _PIECE):
            yield text[start : start + _PIECE]


def _b64_chunks(pieces: Iterator[str]) -> Iterator[bytes]:
    """Base64 text decoded a piece at a time, as ``b64decode(validate=False)`` decodes it
    whole: characters outside the alphabet skipped, quads never cut."""
    rest = ""
    for piece in pieces:
        rest += _NOT_BASE64.sub("", piece)
        whole = len(rest) - len(rest) % 4
        if whole:
            yield base64.b64decode(rest[:whole])
            rest = rest[whole:]
    if rest:
        yield base64.b64decode(rest)  # a bad tail: binascii.Error, as a whole decode says


def _os_reason(exc: OSError) -> str:
    return f"{exc.strerror or type(exc).__name__}" + (f" ({exc.filename})" if exc.filename else "")


def _one_line(text: str) -> str:
    """A reason for one line of the result (whatever a message held)."""
    return " ".join(text.split())[:300]


_BARE_REPR = re.compile(r"^<[^<>\n]*>$")


def _is_bare_repr(text: str) -> bool:
    """An object's default repr (``<Figure size 640x480 with 1 Axes>``, ``<... at 0x7f...>``)."""
    return bool(_BARE_REPR.match(text.strip()))


def _has_image(files: dict[str, tuple[str, str]]) -> bool:
    return any(mime.startswith("image/") for mime in files)
