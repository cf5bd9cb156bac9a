"""Results shown in a host notebook as a cell's own outputs are shown.

A result holds nbformat outputs: each goes back out through IPython's own display machinery, so
a plot is an ``image/png`` output, a DataFrame its HTML table, JSON the JSON renderer's, a stream
a stream, an error its (coloured) traceback; the notebook front end renders them natively, with
no file paths in the way. ``LiveDisplay`` does the same while a block runs (``on_output=``).

Only called where IPython is there to call it (``_ipython_display_``), so IPython is imported
lazily and never needed otherwise.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

NbOutput = dict[str, Any]


def show(outputs: Iterable[NbOutput], footer: str | None = None) -> None:
    """Display each output in the current cell, in order, then ``footer`` (a status line)."""
    for output in outputs:
        show_one(output)
    if footer:
        sys.stderr.write(footer.rstrip("\n") + "\n")
        sys.stderr.flush()


def show_one(output: NbOutput) -> None:
    """One nbformat output into the current cell."""
    kind = output.get("output_type")
    if kind == "stream":
        stream = sys.stderr if output.get("name") == "stderr" else sys.stdout
        stream.write(_text(output.get("text", "")))
        stream.flush()
    elif kind in ("display_data", "execute_result"):
        _display(output)
    elif kind == "error":
        sys.stderr.write("\n".join(output.get("traceback") or [_error_line(output)]) + "\n")
        sys.stderr.flush()


def _display(output: NbOutput) -> None:
    from IPython.display import display

    data = dict(output.get("data") or {})
    metadata = dict(output.get("metadata") or {})
    omitted = _omitted(metadata)
    if omitted and "text/plain" not in data:
        data["text/plain"] = f"[{', '.join(omitted)}: too large to show inline; in result.files]"
    if data:
        display(data, metadata=metadata, raw=True)  # type: ignore[no-untyped-call]


def _omitted(metadata: Mapping[str, Any]) -> list[str]:
    note = metadata.get("kernelexec")
    omitted = note.get("omitted_data") if isinstance(note, dict) else None
    return [str(mime) for mime in omitted] if isinstance(omitted, dict) else []


def _error_line(output: NbOutput) -> str:
    return f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


class LiveDisplay:
    """An ``on_output`` callback that shows each output in the host cell as it arrives.

    A sync executor runs its event loop in a thread of its own, and a notebook kernel sends what
    another thread displays to whichever cell it thinks current (or none): so outputs made
    there are queued, and the cell's own thread, waiting in ``execute``, shows them every
    ``PUMP_INTERVAL`` seconds while the block runs (see ``pumps``). Called from the cell's
    thread (an async executor awaited in the cell), it shows each output at once.
    """

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._pending: list[NbOutput] = []
        self._lock = threading.Lock()
        _PUMPS.setdefault(self._thread, weakref.WeakSet()).add(self)

    def __call__(self, output: NbOutput) -> None:
        if threading.get_ident() == self._thread:
            self.flush()
            show_one(output)
            return
        with self._lock:
            self._pending.append(output)

    def flush(self) -> None:
        """Show what arrived from other threads (called by the cell's thread)."""
        if threading.get_ident() != self._thread:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        for output in pending:
            show_one(output)


PUMP_INTERVAL = 0.05
_PUMPS: dict[int, weakref.WeakSet[LiveDisplay]] = {}


def pumps() -> list[LiveDisplay]:
    """The live displays made in this thread: a sync call waiting here flushes them."""
    found = _PUMPS.get(threading.get_ident())
    return list(found) if found else []
