"""Bounded text capture: keep the head and the tail, spill the full text to a file.

A block that prints 100 MB must not take 100 MB of memory, nor put 100 MB in front of an LLM.
``TextBudget`` keeps at most ``limit`` characters (half head, half tail) and, once the limit is
passed, streams everything it is given to a spill file so the full output is still on disk.
"""

from __future__ import annotations

import codecs
import json.decoder
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

DEFAULT_OUTPUT_LIMIT = 20_000
DEFAULT_SPILL_LIMIT = 512 * 1024 * 1024  # stop writing the spill file past this
_SPILL_CHUNK = 1 << 20  # characters written to the spill file at a time


def omitted_marker(count: int, spill: Path | None) -> str:
    where = f"; full output in {spill}" if spill is not None else ""
    return f"\n[... {count} characters omitted{where} ...]\n"


#: a string of a received message longer than this (in bytes) is not decoded whole
LONG_TEXT = 1 << 20


class LongText(str):
    """A string of a received message too long to decode whole (see ``backends/_iopub``).

    Its value is its head and tail around a marker with the true count, so code that does not
    know it sees a bounded text; ``length`` is that count and ``chunks()`` yields the full text,
    decoded a piece at a time from the message's bytes (held as long as this object is).
    """

    length: int
    _body: memoryview

    def __new__(cls, body: memoryview) -> LongText:
        budget = TextBudget(DEFAULT_OUTPUT_LIMIT)
        for chunk in _json_chunks(body):
            budget.write(chunk)
        self = super().__new__(cls, budget.text())
        self.length = budget.total
        self._body = body
        return self

    def chunks(self) -> Iterator[str]:
        return _json_chunks(self._body)


def pieces(text: str) -> Iterator[str]:
    """``text`` in pieces: a ``LongText`` decoded a piece at a time, any other as it is."""
    if isinstance(text, LongText):
        yield from text.chunks()
    elif text:
        yield text


def text_length(text: str) -> int:
    return text.length if isinstance(text, LongText) else len(text)


def full_value(value: Any) -> Any:
    """``value`` (a MIME payload) with each ``LongText`` in it decoded whole, to be written."""
    if isinstance(value, LongText):
        return "".join(value.chunks())
    if isinstance(value, dict):
        return {full_value(k): full_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [full_value(v) for v in value]
    return value


def _json_chunks(body: memoryview) -> Iterator[str]:
    """The text of a JSON string's body (the bytes between its quotes), a MiB at a time; a
    cut never falls inside an escape or a UTF-8 sequence."""
    pos, end = 0, len(body)
    while pos < end:
        raw = bytes(body[pos : min(end, pos + _SPILL_CHUNK)])
        if pos + len(raw) < end:
            raw = raw[: _safe_cut(raw, body[pos + len(raw)])]
        pos += len(raw)
        yield _json_text(raw)


def _safe_cut(raw: bytes, next_byte: int) -> int:
    """Where ``raw`` (a chunk of a JSON string's body starting at a token) can be cut."""
    n = len(raw)
    last = raw.rfind(b"\\", max(0, n - 6))
    if last != -1:
        window = raw[max(0, last - 63) : last + 1]
        run = len(window) - len(window.rstrip(b"\\"))
        if run == len(window):  # a long run of backslashes: count it all
            run = last + 1 - len(raw[: last + 1].rstrip(b"\\"))
        if run % 2:  # raw[last] starts an escape: cut before it if it does not end here
            width = 6 if raw[last + 1 : last + 2] == b"u" else 2
            if last + width > n:
                n = last
    while n > 0 and ((raw[n] if n < len(raw) else next_byte) & 0xC0) == 0x80:
        n -= 1  # not inside a UTF-8 sequence
    return n if n > 0 else len(raw)


def _json_text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")  # as jupyter_client decodes a message
    if "\\" not in text:
        return text
    try:
        return _scanstring('"' + text + '"', 1, False)[0]
    except ValueError:  # not valid JSON: the text as it came
        return text


# the C scanner json.loads uses for one string (typeshed leaves it out)
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def cut_text(text: str, limit: int, spill: Path | None = None) -> str:
    """``text``, or at most ``limit`` of its characters (head and tail) around a marker that
    counts the rest. Only the two ends are copied, whatever the size of ``text``."""
    if isinstance(text, LongText):
        budget = TextBudget(limit)
        for chunk in text.chunks():
            budget.write(chunk)
        head, omitted, tail = budget.parts()
        return head + omitted_marker(omitted, spill) + tail if omitted else head + tail
    if len(text) <= limit:
        return text
    half = limit // 2
    tail = text[len(text) - (limit - half) :]
    return text[:half] + omitted_marker(len(text) - limit, spill) + tail


def cut_lines(lines: list[str], limit: int, spill: Path | None = None) -> list[str]:
    """``lines`` (a traceback) kept to about ``limit`` characters: each line cut to a quarter
    of it, then the first lines and the last ones (the last always) that fit, with a line
    between them that counts the characters left out."""
    if sum(text_length(line) for line in lines) <= limit:
        return [cut_text(line, limit, spill) for line in lines]  # a LongText made plain
    cut = [cut_text(line, limit // 4, spill) for line in lines]
    tail = _fitting(reversed(cut), limit - limit // 2, at_least_one=True)
    head = _fitting(cut[: len(cut) - len(tail)], limit // 2, at_least_one=False)
    left_out = lines[len(head) : len(lines) - len(tail)]
    if not left_out:
        return head + tail[::-1]
    count = sum(text_length(line) for line in left_out)
    return [*head, omitted_marker(count, spill).strip("\n"), *tail[::-1]]


def _fitting(lines: Iterable[str], room: int, *, at_least_one: bool) -> list[str]:
    """The first of ``lines`` whose lengths add up to at most ``room``."""
    kept: list[str] = []
    for line in lines:
        if len(line) > room and (kept or not at_least_one):
            break
        kept.append(line)
        room -= len(line)
    return kept


class TextBudget:
    """Collects text up to ``limit`` characters, keeping head and tail past it."""

    def __init__(
        self,
        limit: int = DEFAULT_OUTPUT_LIMIT,
        *,
        spill_path: Path | None = None,
        spill_limit: int = DEFAULT_SPILL_LIMIT,
        spill_open: Callable[[Path], TextIO] | None = None,
    ) -> None:
        if limit < 2:
            raise ValueError("limit must be at least 2 characters")
        self.limit = limit
        self.spill_path = spill_path
        self._spill_limit = spill_limit
        # How the spill file is made: in a work dir, through its door (``Door.create_text``)
        self._spill_open = spill_open or _open_plain
        self._spill: TextIO | None = None
        self._spilled = 0
        self._head: list[str] = []
        self._head_len = 0
        self._tail: deque[str] = deque()
        self._tail_len = 0
        self.total = 0

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    @property
    def spilled_to(self) -> Path | None:
        """The spill file, when one was written."""
        return self.spill_path if self._spilled else None

    def write(self, text: str) -> None:
        """Add ``text``. Past the limit only the head, the tail and a count stay in memory:
        no copy of a large ``text`` is made (a 50 MB line costs the caller's string, no more)."""
        if not text:
            return
        was_truncated = self.truncated
        self.total += len(text)
        if not self.truncated:
            self._head.append(text)
            self._head_len += len(text)
            return
        if not was_truncated:
            # First overflow: everything so far goes to the spill, then split head / tail.
            held = "".join(self._head)
            self._to_spill(held)
            self._to_spill(text)
            half = self.limit // 2
            if len(held) >= half:
                head, rest = held[:half], held[half:]
            else:
                head, rest = held + text[: half - len(held)], ""
            self._head, self._head_len = [head], len(head)
            self._tail.clear()
            self._tail_len = 0
            if rest:
                self._push_tail(rest)
            cut = max(0, half - len(held))  # what of ``text`` went to the head
            keep = self.limit - half
            self._push_tail(text[-keep:] if len(text) - cut >= keep else text[cut:])
            return
        self._to_spill(text)
        self._push_tail(text)

    def parts(self) -> tuple[str, int, str]:
        """(head, number of characters omitted, tail); the tail is empty when nothing was cut."""
        head = "".join(self._head)
        if not self.truncated:
            return head, 0, ""
        tail = "".join(self._tail)
        return head, self.total - len(head) - len(tail), tail

    def _push_tail(self, text: str) -> None:
        keep = self.limit - self.limit // 2
        if len(text) >= keep:
            self._tail.clear()
            self._tail.append(text[-keep:])  # the end only: no copy of a huge text
            self._tail_len = keep
            return
        self._tail.append(text)
        self._tail_len += len(text)
        while self._tail_len - len(self._tail[0]) >= keep:
            self._tail_len -= len(self._tail.popleft())
        excess = self._tail_len - keep
        if excess > 0:
            self._tail[0] = self._tail[0][excess:]
            self._tail_len -= excess

    def _to_spill(self, text: str) -> None:
        if self.spill_path is None or self._spilled >= self._spill_limit:
            return
        if self._spill is None:
            try:
                self._spill = self._spill_open(self.spill_path)
            except (OSError, ValueError):  # refused (a link planted on the way): no spill file
                self.spill_path = None
                return
        room = min(len(text), self._spill_limit - self._spilled)
        # In slices: writing a 50 MB string at once would encode a 50 MB copy of it.
        for start in range(0, room, _SPILL_CHUNK):
            self._spill.write(text[start : min(start + _SPILL_CHUNK, room)])
        self._spilled += room

    def text(self) -> str:
        head, omitted, tail = self.parts()
        if not omitted and not tail:
            return head
        return head + omitted_marker(omitted, self.spilled_to) + tail

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None


def _open_plain(path: Path) -> TextIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w", encoding="utf-8", errors="replace")


def join_parts(parts: Sequence[tuple[str, int, str]], limit: int) -> tuple[str, int, str]:
    """Join texts each already held as ``(head, omitted, tail)`` and cut the whole once.

    The result is ``(head, omitted, tail)`` of the joined text as if it had been kept whole:
    at most ``limit`` characters kept, ``omitted`` the true number of characters left out (a
    piece's own omission included, so a marker never counts only the last cut).
    """
    total = sum(len(h) + n + len(t) for h, n, t in parts)
    if total <= limit:  # then no piece was cut either
        return "".join(h + t for h, _, t in parts), 0, ""
    need = limit // 2
    head: list[str] = []
    for h, n, t in parts:
        for known in (h, t):
            take = known[:need]
            head.append(take)
            need -= len(take)
            if n:  # a gap: what follows it is not joined to the head
                break
        if need <= 0 or n:
            break
    need = limit - limit // 2
    tail: list[str] = []
    for h, n, t in reversed(parts):
        for known in (t, h):
            take = known[len(known) - need :] if need < len(known) else known
            tail.append(take)
            need -= len(take)
            if n:
                break
        if need <= 0 or n:
            break
    head_text, tail_text = "".join(head), "".join(reversed(tail))
    return head_text, total - len(head_text) - len(tail_text), tail_text


class StreamDecoder:
    """Incremental UTF-8 decoding that never raises: bad bytes become U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
