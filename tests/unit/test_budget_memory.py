"""A budget holds the head and the tail of a huge text, never a copy of the text."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from kernelexec._budget import TextBudget


def test_a_huge_write_makes_no_copy_of_the_text(tmp_path: Path) -> None:
    huge = "x" * 20_000_000
    budget = TextBudget(20_000, spill_path=tmp_path / "spill.txt")
    budget.write("start\n")
    tracemalloc.start()
    try:
        budget.write(huge)
        budget.write(huge)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        budget.close()
    assert peak < 8_000_000, f"{peak} bytes allocated for a 20 MB write"  # measured: ~1 MB
    assert budget.parts()[1] == 40_000_006 - 20_000
    assert (tmp_path / "spill.txt").stat().st_size == 40_000_006
