"""PNG charts of a benchmark run (matplotlib, headless: the Agg canvas, no pyplot state).

``bars.png``: per workload, three panels on linear axes, each bar labelled with its value: the
per-block latency, the start-up cost (executor creation to the first result) and the whole
session (start-up, every block, close), so a row fast per block but slow to start reads as both.
The axis labels say what the bar and the whiskers are. ``latency.png``: the latency of each block
in the session, one colour and marker per executor family (floors, local, sandboxed, Docker,
gVisor, peers), at most eight lines and a legend of its own per panel.
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
from matplotlib.ticker import MaxNLocator

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


# (panel title, RowResult.summary field, what the bar and whiskers are)
_BAR_PANELS = (
    ("per block", "block", "per-block latency, ms\nbar: median (p50), whiskers: p10 to p90"),
    (
        "start-up",
        "startup",
        "start to first result, ms\nbar: median over sessions, whiskers: p10 to p90",
    ),
    (
        "whole session",
        "total",
        "start + blocks + close, ms\nbar: median over sessions, whiskers: p10 to p90",
    ),
)


def bars_figure(results: BenchResults) -> Figure:
    """Per workload (a column): per-block, start-up and whole-session time (a row each), on
    linear axes; error bars from p10 to p90."""
    colours = executor_colours(results)
    workloads = _workloads(results)
    fig = Figure(figsize=(4.8 * max(1, len(workloads)), 11.0), layout="constrained")
    grid = fig.subplots(len(_BAR_PANELS), max(1, len(workloads)), squeeze=False)
    if not workloads:
        grid[0][0].text(0.5, 0.5, "nothing measured", ha="center", va="center")
    for column, workload in enumerate(workloads):
        rows = _measured(results, workload)
        for line, (title, field, label) in enumerate(_BAR_PANELS):
            _bar_panel(grid[line][column], rows, field, colours)
            grid[line][column].set_title(f"{workload}: {title}", fontsize=9)
            grid[line][column].set_ylabel(label, fontsize=7)
    _title(fig, "kernelexec bench by executor (hatched: floors; linear axes)")
    _legend(fig, results, colours, "hatch")
    return fig


def _bar_panel(ax: Axes, rows: list[RowResult], field: str, colours: dict[str, str]) -> None:
    shown = [(r, s) for r in rows if (s := r.summary(field)) is not None]
    p50 = [s.p50 * 1e3 for _, s in shown]
    # never below zero: equal samples can interpolate a p10 a rounding error above the p50
    low = [max(0.0, s.p50 - s.p10) * 1e3 for _, s in shown]
    high = [max(0.0, s.p90 - s.p50) * 1e3 for _, s in shown]
    x = list(range(len(shown)))
    bars = ax.bar(
        x,
        p50,
        yerr=[low, high],
        color=[colours[r.executor] for r, _ in shown],
        hatch=["//" if r.group == "floor" else None for r, _ in shown],
        edgecolor="white",
        capsize=3,
        ecolor="#444444",
    )
    ax.bar_label(bars, labels=[_ms(v) for v in p50], fontsize=6, padding=2)
    ax.set_ylim(bottom=0)
    ax.set_xticks(x, [r.executor for r, _ in shown], rotation=45, ha="right", fontsize=7)


# One colour and marker per executor family; lines of one family in a panel differ by style.
_FAMILIES = (
    ("floor", ("subprocess", "jupyter-client", "docker-exec", "docker-run"), "#444444", "x"),
    ("local", ("command", "warm-command", "kernel", "fork-kernel", "pool"), "#1f77b4", "o"),
    ("sandboxed", ("sandboxed-",), "#2ca02c", "s"),
    ("Docker", ("docker-",), "#ff7f0e", "^"),
    ("gVisor", ("gvisor-",), "#9467bd", "D"),
    ("AG2", ("ag2-",), "#d62728", "v"),
    ("autogen-ext", ("autogen-",), "#8c564b", "P"),
)
_STYLES = ("-", "--", ":", "-.")
_PANEL_LINES = 8


def family(executor: str) -> tuple[str, str, str]:
    """(family name, colour, marker) of an executor row."""
    for name, members, colour, marker in _FAMILIES:
        if executor in members or any(m.endswith("-") and executor.startswith(m) for m in members):
            return name, colour, marker
    return "other", "#7f7f7f", "*"


def latency_panels(results: BenchResults) -> list[tuple[str, list[RowResult]]]:
    """(title, rows) per panel: per workload, stateless rows then stateful ones, at most
    ``_PANEL_LINES`` rows a panel."""
    panels = []
    for workload in _workloads(results):
        for stateful in (False, True):
            rows = [r for r in _measured(results, workload) if r.stateful is stateful]
            count = -(-len(rows) // _PANEL_LINES)  # panels needed; rows shared out evenly
            size = -(-len(rows) // count) if count else 1
            chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
            kind = "stateful" if stateful else "stateless"
            for n, chunk in enumerate(chunks):
                part = f" ({n + 1}/{len(chunks)})" if len(chunks) > 1 else ""
                panels.append((f"{workload}, {kind}{part}", chunk))
    return panels


def latency_figure(results: BenchResults) -> Figure:
    """Latency of block 1, 2, ... (median over sessions), one line per row, a legend per panel."""
    panels = latency_panels(results)
    columns = min(2, max(1, len(panels)))
    lines = max(1, -(-len(panels) // columns))
    fig = Figure(figsize=(6.4 * columns, 3.6 * lines), layout="constrained")
    axes = list(fig.subplots(lines, columns, squeeze=False).flat)
    if not panels:
        axes[0].text(0.5, 0.5, "nothing measured", ha="center", va="center")
    for ax, (title, rows) in zip(axes, panels, strict=False):
        seen: dict[str, int] = {}
        for row in rows:
            name, colour, marker = family(row.executor)
            style = _STYLES[seen.get(name, 0) % len(_STYLES)]
            seen[name] = seen.get(name, 0) + 1
            series = per_block_medians(row)
            ax.plot(
                range(1, len(series) + 1),
                [v * 1e3 for v in series],
                style,
                color=colour,
                marker=marker,
                markersize=4,
                label=f"{row.executor} ({name})",
            )
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("block number in the session", fontsize=8)
        ax.set_ylabel("latency, ms (median over sessions)", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    _title(
        fig,
        "kernelexec bench: latency of each block (linear axes; block 1 includes warm-up; "
        "colour and marker: executor family)",
    )
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
