"""The example notebooks say what they measured the right way round, and the notebook the
docs run with parameters declares them (issue 34, item 15)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import nbformat
import pytest

import kernelexec.bench.report
from kernelexec._notebook import declared_parameters

pytestmark = pytest.mark.unit

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _speedup_lines(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]]) -> list[str]:
    """Run the notebook's speed-up cell as written, on these ratios (stateless / stateful)."""
    nb = nbformat.read(NOTEBOOKS / "stateless-vs-stateful.ipynb", as_version=4)
    [cell] = [c for c in nb.cells if c.cell_type == "code" and "speedups(results)" in c.source]
    monkeypatch.setattr(kernelexec.bench.report, "speedups", lambda results: rows)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(cell.source, {"results": object()})
    return printed.getvalue().splitlines()


def test_a_slower_stateful_session_is_called_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _speedup_lines(
        monkeypatch,
        [
            {"workload": "trivial", "blocks_only": 0.3, "session": 0.25},
            {"workload": "analysis", "blocks_only": 4.0, "session": None},
        ],
    )
    assert lines == [
        "trivial: the blocks ran 3.3x slower stateful; "
        "the whole session, kernel start-up included, ran 4.0x slower stateful",
        "analysis: the blocks ran 4.0x faster stateful; "
        "the whole session, kernel start-up included, ran (not measured)",
    ]


def test_the_data_analysis_notebook_declares_the_parameters_the_docs_pass() -> None:
    nb = nbformat.read(NOTEBOOKS / "data-analysis.ipynb", as_version=4)
    declared = declared_parameters(nb)
    assert declared is not None
    assert [(p.name, p.default) for p in declared] == [("months", "12"), ("seed", "7")]
