"""Bounded text capture: keep the head and the tail, spill the full text to a file.

A block that prints 100 MB must not take 100 MB of memory, nor put 100 MB in front of an LLM.
``TextBudget`` keeps at most ``limit`` characters (half head, half tail) and, once the limit is
passed, streams everything it is given to a spill file so the full output is still on disk.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TextIO

DEFAULT_OUTPUT_LIMIT = 20_000
DEFAULT_SPILL_LIMIT = 512 * 1024 * 1024  # stop writing the spill file past this
_SPILL_CHUNK = 1 << 20  # characters written to the spill file at a time


def omitted_marker(count: int, spill: Path | None) -> str:
    where = f"; full output in {spill}" if spill is not None else ""
    return f"\n[... {count} characters omitted{where} ...]\n"


def cut_text(text: str, limit: int, spill: Path | None = None) -> str:
    """``text``, or at most ``limit`` of its characters (head and tail) around a marker that
    counts the rest. Only the two ends are copied, whatever the size of ``text``."""
    if len(text) <= limit:
        return text
    half = limit // 2
    tail = text[len(text) - (limit - half) :]
    return text[:half] + omitted_marker(len(text) - limit, spill) + tail


def cut_lines(lines: list[str], limit: int, spill: Path | None = None) -> list[str]:
    """``lines`` (a traceback) kept to about ``limit`` characters: each line cut to a quarter
    of it, then the first lines and the last ones (the last always) that fit, with a line
    between them that counts the characters left out."""
    if sum(len(line) for line in lines) <= limit:
        return lines
    cut = [cut_text(line, limit // 4, spill) for line in lines]
    tail = _fitting(reversed(cut), limit - limit // 2, at_least_one=True)
    head = _fitting(cut[: len(cut) - len(tail)], limit // 2, at_least_one=False)
    left_out = lines[len(head) : len(lines) - len(tail)]
    if not left_out:
        return head + tail[::-1]
    count = sum(len(line) for line in left_out)
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
    ) -> None:
        if limit < 2:
            raise ValueError("limit must be at least 2 characters")
        self.limit = limit
        self.spill_path = spill_path
        self._spill_limit = spill_limit
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
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            self._spill = open(self.spill_path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
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
