"""Bounded output capture: head + tail with a marker, the full text spilled to a file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelexec._budget import StreamDecoder, TextBudget, omitted_marker


def test_under_the_limit_keeps_everything() -> None:
    budget = TextBudget(10)
    budget.write("abc")
    budget.write("")
    budget.write("defghij")
    assert budget.text() == "abcdefghij"
    assert not budget.truncated
    assert budget.spilled_to is None


def test_over_the_limit_keeps_head_and_tail(tmp_path: Path) -> None:
    spill = tmp_path / "out" / "full.txt"
    budget = TextBudget(10, spill_path=spill)
    for ch in "abcdefghijklmnopqrstuvwxyz":
        budget.write(ch)
    budget.close()
    assert budget.truncated
    assert budget.total == 26
    assert budget.text() == "abcde" + omitted_marker(16, spill) + "vwxyz"
    assert "[... 16 characters omitted; full output in" in budget.text()
    assert spill.read_text() == "abcdefghijklmnopqrstuvwxyz"
    assert budget.spilled_to == spill


def test_without_spill_path_the_marker_names_no_file() -> None:
    budget = TextBudget(4)
    budget.write("0123456789")
    assert budget.text() == "01\n[... 6 characters omitted ...]\n89"
    assert budget.spilled_to is None


def test_spill_limit_caps_the_file(tmp_path: Path) -> None:
    spill = tmp_path / "full.txt"
    budget = TextBudget(4, spill_path=spill, spill_limit=7)
    budget.write("0123456789")
    budget.write("abc")
    budget.close()
    assert spill.read_text() == "0123456"
    assert budget.text().endswith("bc")


def test_surrogates_in_spill_do_not_crash(tmp_path: Path) -> None:
    spill = tmp_path / "full.txt"
    budget = TextBudget(2, spill_path=spill)
    budget.write("a\udc80bc")
    budget.close()
    assert spill.read_text(encoding="utf-8") == "a?bc"


def test_limit_must_hold_a_head_and_a_tail() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        TextBudget(1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=50), max_size=30), st.integers(2, 60))
def test_any_chunking_gives_exact_head_and_tail(chunks: list[str], limit: int) -> None:
    budget = TextBudget(limit)
    for chunk in chunks:
        budget.write(chunk)
    full = "".join(chunks)
    if len(full) <= limit:
        assert budget.text() == full and not budget.truncated
        return
    head, tail = full[: limit // 2], full[len(full) - (limit - limit // 2) :]
    omitted = len(full) - len(head) - len(tail)
    assert budget.text() == head + omitted_marker(omitted, None) + tail
    assert budget.truncated


@settings(max_examples=200, deadline=None)
@given(st.text(), st.lists(st.integers(1, 7), max_size=20))
def test_decoder_rejoins_characters_split_across_chunks(text: str, cuts: list[int]) -> None:
    data = text.encode("utf-8", errors="surrogatepass")
    decoder, pieces, pos = StreamDecoder(), [], 0
    for cut in cuts:
        pieces.append(decoder.feed(data[pos : pos + cut]))
        pos += cut
    pieces.append(decoder.feed(data[pos:]))
    pieces.append(decoder.finish())
    assert "".join(pieces) == data.decode("utf-8", errors="replace")


def test_decoder_replaces_invalid_bytes() -> None:
    decoder = StreamDecoder()
    assert decoder.feed(b"ok \xff\xfe end ") == "ok \ufffd\ufffd end "
    assert decoder.feed(b"\xe2\x82") == ""  # first two bytes of a euro sign: wait for the third
    assert decoder.finish() == "\ufffd"
