"""Writing a run's files: JSON, Markdown report and PNG charts, into one folder."""

from __future__ import annotations

import os
from pathlib import Path

from .report import JSON_NAME, MARKDOWN_NAME, write_json, write_markdown
from .runner import BenchResults


def write_outputs(
    results: BenchResults,
    out_dir: str | os.PathLike[str],
    *,
    command: str | None = None,
    charts: bool = True,
) -> dict[str, Path]:
    """Write ``results.json``, ``report.md`` and (unless ``charts=False``) the PNG charts."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    written = {
        "json": write_json(results, folder / JSON_NAME),
        "markdown": write_markdown(results, folder / MARKDOWN_NAME, command=command),
    }
    if charts:
        from .charts import write_charts  # matplotlib is imported only when charts are drawn

        bars, latency = write_charts(results, folder)
        written["bars"] = bars
        written["latency"] = latency
    return written
