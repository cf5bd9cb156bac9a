"""Every notebook in notebooks/ runs top to bottom in a real kernel, so none can go stale."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_the_examples_are_there() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"quickstart.ipynb", "data-analysis.ipynb"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_example_notebook_runs(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    started = time.monotonic()
    # Run from a scratch folder so the examples' files never land in the checkout.
    NotebookClient(nb, timeout=180, resources={"metadata": {"path": str(tmp_path)}}).execute()
    elapsed = time.monotonic() - started
    nbformat.validate(nb)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]  # fmt: skip
    assert errors == []
    assert elapsed < 120, f"{path.name} took {elapsed:.0f} s; keep the examples quick"
