"""Bounded text capture: keep the head and the tail, spill the full text to a file.

A block that prints 100 MB must not take 100 MB of memory, nor put 100 MB in front of an LLM.
``TextBudget`` keeps at most ``limit`` characters (half head, half tail) and, once the limit is
passed, streams everything it is given to a spill file so the full output is still on disk.
"""

from __future__ import annotations

import codecs
from collections import deque
from pathlib import Path
from typing import TextIO

DEFAULT_OUTPUT_LIMIT = 20_000
DEFAULT_SPILL_LIMIT = 512 * 1024 * 1024  # stop writing the spill file past this


def omitted_marker(count: int, spill: Path | None) -> str:
    where = f"; full output in {spill}" if spill is not None else ""
    return f"\n[... {count} characters omitted{where} ...]\n"


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
            everything = "".join(self._head) + text
            self._to_spill(everything)
            half = self.limit // 2
            self._head, self._head_len = [everything[:half]], half
            self._tail.clear()
            self._tail_len = 0
            self._push_tail(everything[half:])
            return
        self._to_spill(text)
        self._push_tail(text)

    def _push_tail(self, text: str) -> None:
        keep = self.limit - self.limit // 2
        if len(text) >= keep:
            self._tail.clear()
            self._tail.append(text[-keep:])
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
        chunk = text[: self._spill_limit - self._spilled]
        self._spill.write(chunk)
        self._spilled += len(chunk)

    def text(self) -> str:
        head = "".join(self._head)
        if not self.truncated:
            return head
        omitted = self.total - self._head_len - self._tail_len
        return head + omitted_marker(omitted, self.spilled_to) + "".join(self._tail)

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None


class StreamDecoder:
    """Incremental UTF-8 decoding that never raises: bad bytes become U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
