"""PNG charts of a benchmark run (matplotlib, headless: the Agg canvas, no pyplot state).

Every chart gives an executor the same colour (floors are drawn hatched or dashed), uses a log
scale so a 10 ms bar is not flattened under a 1 s one, labels the values, and keeps the legend
outside the data.
"""

from __future__ import annotations

import statistics
import textwrap
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from .runner import BenchResults, RowResult

BARS_NAME = "bars.png"
LATENCY_NAME = "latency.png"
# Twenty distinct colours (matplotlib's tab20, dark shades first, then the light ones).
_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip
_GROUP_LABELS = {"floor": "floor (raw client)", "kernelexec": "kernelexec", "peer": "peer"}


def _measured(results: BenchResults, workload: str) -> list[RowResult]:
    # A failed row's blocks end at the failure: drawn, they would read as a measurement (the
    # report says why it failed).
    return [r for r in results.rows if r.workload == workload and r.blocks and r.status != "failed"]


def _workloads(results: BenchResults) -> list[str]:
    return [w for w in dict.fromkeys(r.workload for r in results.rows) if _measured(results, w)]


def executor_colours(results: BenchResults) -> dict[str, str]:
    """One colour per executor, the same in every panel and chart of the run."""
    names = dict.fromkeys(r.executor for r in results.rows if r.blocks)
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(names)}


def _panels(results: BenchResults) -> tuple[Figure, list[str], list[Any]]:
    workloads = _workloads(results)
    fig = Figure(figsize=(4.6 * max(1, len(workloads)), 5.0), layout="constrained")
    axes = list(fig.subplots(1, max(1, len(workloads)), squeeze=False)[0])
    if not workloads:
        axes[0].text(0.5, 0.5, "nothing measured", ha="center", va="center")
    return fig, workloads, axes


def _legend(fig: Figure, results: BenchResults, colours: dict[str, str], floor_style: str) -> None:
    groups = {r.executor: r.group for r in results.rows}
    handles: list[object] = []
    for name, colour in colours.items():
        floor = groups.get(name) == "floor"
        label = f"{name} ({_GROUP_LABELS.get(groups.get(name, ''), 'other')})"
        if floor_style == "hatch":
            handles.append(
                Patch(
                    facecolor=colour, hatch="//" if floor else None, edgecolor="white", label=label
                )
            )
        else:
            handles.append(Line2D([], [], color=colour, ls="--" if floor else "-", label=label))
    # As many columns as fit the figure's width (an entry is about two inches at this size),
    # so a narrow one-workload chart wraps its legend instead of cutting it off.
    fits = max(1, int(fig.get_figwidth() // 2.1))
    fig.legend(
        handles=handles, loc="outside lower center", ncols=min(6, fits, len(handles)), fontsize=7
    )


def _title(fig: Figure, text: str) -> None:
    """The figure's title, wrapped to its width (a one-workload chart is narrow)."""
    per_line = max(30, int(fig.get_figwidth() * 11))  # characters per line at this size
    fig.suptitle(textwrap.fill(text, per_line), fontsize=10)


def bars_figure(results: BenchResults) -> Figure:
    """Per workload: per-block p50 per executor (log scale), error bars from p10 to p90."""
    colours = executor_colours(results)
    fig, workloads, axes = _panels(results)
    for ax, workload in zip(axes, workloads, strict=False):
        rows = _measured(results, workload)
        p50, low, high = [], [], []
        for row in rows:
            s = row.summary("block")
            assert s is not None
            p50.append(s.p50 * 1e3)
            low.append((s.p50 - s.p10) * 1e3)
            high.append((s.p90 - s.p50) * 1e3)
        x = list(range(len(rows)))
        bars = ax.bar(
            x,
            p50,
            yerr=[low, high],
            color=[colours[r.executor] for r in rows],
            hatch=["//" if r.group == "floor" else None for r in rows],
            edgecolor="white",
            capsize=3,
            ecolor="#444444",
        )
        ax.bar_label(bars, labels=[_ms(v) for v in p50], fontsize=6, padding=2)
        _log_ms_axis(ax)
        ax.set_xticks(x, [r.executor for r in rows], rotation=45, ha="right", fontsize=7)
        ax.set_title(workload)
        ax.set_ylabel("per-block latency, ms (log; p50, bars p10 to p90)", fontsize=8)
    _title(fig, "kernelexec bench: per-block latency by executor (hatched: floors)")
    _legend(fig, results, colours, "hatch")
    return fig


def _log_ms_axis(ax: Axes) -> None:
    """A log scale whose ticks read as plain milliseconds (60, 1000), not 6x10^1."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    # Between decades only 2x and 5x are named: enough to read a bar, not a wall of numbers.
    ax.yaxis.set_minor_formatter(
        FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else "")
    )
    ax.tick_params(axis="y", which="minor", labelsize=6)


def latency_figure(results: BenchResults) -> Figure:
    """Per workload: latency of block 1, 2, ... (median over sessions), one line per row."""
    colours = executor_colours(results)
    fig, workloads, axes = _panels(results)
    for ax, workload in zip(axes, workloads, strict=False):
        for row in _measured(results, workload):
            series = per_block_medians(row)
            ax.plot(
                range(1, len(series) + 1),
                [v * 1e3 for v in series],
                "--" if row.group == "floor" else "-",
                color=colours[row.executor],
                marker=".",
            )
        _log_ms_axis(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("block number in the session")
        ax.set_ylabel("latency, ms (log; median over sessions)", fontsize=8)
        ax.set_title(workload)
    _title(
        fig, "kernelexec bench: latency of each block (dashed: floors; block 1 includes warm-up)"
    )
    _legend(fig, results, colours, "line")
    return fig


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


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
