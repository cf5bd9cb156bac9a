"""join_parts: texts each already cut join into one text cut once, with the true count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kernelexec._budget import TextBudget, join_parts


def cut(text: str, limit: int) -> tuple[str, int, str]:
    budget = TextBudget(limit)
    budget.write(text)
    return budget.parts()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=80), max_size=12), st.integers(2, 60))
def test_joining_cut_pieces_equals_cutting_the_whole(pieces: list[str], limit: int) -> None:
    joined = join_parts([cut(p, limit) for p in pieces], limit)
    assert joined == cut("".join(pieces), limit)


def test_the_count_is_the_true_count() -> None:
    pieces = [cut("a" * 5000, 1000), ("\n", 0, ""), cut("b" * 5000, 1000)]
    head, omitted, tail = join_parts(pieces, 1000)
    assert (head, tail) == ("a" * 500, "b" * 500)
    assert omitted == 10_001 - 1000  # not the count of the last cut only
