"""PNG charts of a benchmark run (matplotlib, headless: the Agg canvas, no pyplot state)."""

from __future__ import annotations

import statistics
from pathlib import Path

from matplotlib.figure import Figure

from .runner import BenchResults, RowResult

BARS_NAME = "bars.png"
LATENCY_NAME = "latency.png"
_GROUP_COLOURS = {"floor": "#9e9e9e", "kernelexec": "#1565c0", "peer": "#ef6c00"}


def _measured(results: BenchResults, workload: str) -> list[RowResult]:
    return [r for r in results.rows if r.workload == workload and r.blocks]


def _workloads(results: BenchResults) -> list[str]:
    return [w for w in dict.fromkeys(r.workload for r in results.rows) if _measured(results, w)]


def bars_figure(results: BenchResults) -> Figure:
    """Per workload: per-block p50 per executor, error bars from p10 to p90."""
    workloads = _workloads(results)
    fig = Figure(figsize=(4.2 * max(1, len(workloads)), 4.2), layout="constrained")
    axes = fig.subplots(1, max(1, len(workloads)), squeeze=False)[0]
    for ax, workload in zip(axes, workloads, strict=False):
        rows = _measured(results, workload)
        p50, low, high, colours = [], [], [], []
        for row in rows:
            s = row.summary("block")
            assert s is not None
            p50.append(s.p50 * 1e3)
            low.append((s.p50 - s.p10) * 1e3)
            high.append((s.p90 - s.p50) * 1e3)
            colours.append(_GROUP_COLOURS.get(row.group, "#555555"))
        x = list(range(len(rows)))
        ax.bar(x, p50, yerr=[low, high], color=colours, capsize=3)
        ax.set_xticks(x, [r.executor for r in rows], rotation=45, ha="right", fontsize=8)
        ax.set_title(workload)
        ax.set_ylabel("per-block latency, ms (p50, p10 to p90)")
    if not workloads:
        axes[0].text(0.5, 0.5, "nothing measured", ha="center", va="center")
    fig.suptitle(
        "kernelexec bench: per-block latency (grey: floors, blue: kernelexec, orange: peers)",
        fontsize=9,
    )
    return fig


def latency_figure(results: BenchResults) -> Figure:
    """Per workload: latency of block 1, 2, ... (median over sessions), one line per row."""
    workloads = _workloads(results)
    fig = Figure(figsize=(4.2 * max(1, len(workloads)), 4.2), layout="constrained")
    axes = fig.subplots(1, max(1, len(workloads)), squeeze=False)[0]
    for ax, workload in zip(axes, workloads, strict=False):
        for row in _measured(results, workload):
            series = per_block_medians(row)
            style = "--" if row.group == "floor" else "-"
            ax.plot(
                range(1, len(series) + 1),
                [v * 1e3 for v in series],
                style,
                marker=".",
                label=row.executor,
            )
        ax.set_yscale("log")
        ax.set_xlabel("block")
        ax.set_ylabel("latency, ms (log)")
        ax.set_title(workload)
        ax.legend(fontsize=7)
    if not workloads:
        axes[0].text(0.5, 0.5, "nothing measured", ha="center", va="center")
    return fig


def per_block_medians(row: RowResult) -> list[float]:
    """Median latency of each block position over the row's sessions."""
    length = max((len(s.block_s) for s in row.sessions), default=0)
    out = []
    for i in range(length):
        values = [s.block_s[i] for s in row.sessions if len(s.block_s) > i]
        out.append(statistics.median(values))
    return out


def write_charts(results: BenchResults, out_dir: Path) -> list[Path]:
    paths = []
    for name, make in ((BARS_NAME, bars_figure), (LATENCY_NAME, latency_figure)):
        path = out_dir / name
        make(results).savefig(path, dpi=110)
        paths.append(path)
    return paths
