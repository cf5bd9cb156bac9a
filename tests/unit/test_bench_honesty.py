"""Benchmarks a reader can trust (issue 33.3): linear axes that say what bar and whiskers are,
start-up and whole-session panels beside the per-block one, a latency chart of at most eight
lines a panel, memory headers that say RSS, and a peer on another interpreter not compared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from kernelexec.bench.charts import bars_figure, family, latency_figure, latency_panels
from kernelexec.bench.executors import BenchContext, _ag2_python_check
from kernelexec.bench.names import EXECUTOR_NAMES
from kernelexec.bench.report import COLUMNS
from kernelexec.bench.runner import BenchConfig, BenchResults, RowResult, SessionRecord

pytestmark = pytest.mark.unit

_FLOORS = {"subprocess", "jupyter-client", "docker-exec", "docker-run"}
_STATEFUL = {"jupyter-client", "kernel", "fork-kernel", "pool", "ag2-jupyter", "autogen-jupyter"}


def _results() -> BenchResults:
    """Every executor row on two workloads, each with two sessions of five blocks."""
    rows = []
    for workload in ("trivial", "imports"):
        for i, name in enumerate(EXECUTOR_NAMES):
            stateful = name in _STATEFUL or name.endswith("-kernel")
            row = RowResult(
                workload=workload,
                executor=name,
                label=name,
                group="floor" if name in _FLOORS else "kernelexec",
                stateful=stateful,
                floor=None,
                status="ok",
            )
            row.sessions = [
                SessionRecord(
                    startup_s=0.5 + i / 100,
                    block_s=[0.01 * (i + 1) + b / 1000 for b in range(5)],
                    total_s=1.0 + i / 10 + s,
                )
                for s in range(2)
            ]
            rows.append(row)
    return BenchResults(config=BenchConfig(), rows=rows)


def test_bars_show_block_startup_and_session_on_linear_axes_saying_what_they_show() -> None:
    fig = bars_figure(_results())
    axes = fig.get_axes()
    assert len(axes) == 3 * 2  # per block, start-up, whole session; per workload
    titles = {ax.get_title() for ax in axes}
    for workload in ("trivial", "imports"):
        for panel in ("per block", "start-up", "whole session"):
            assert f"{workload}: {panel}" in titles
    for ax in axes:
        assert ax.get_yscale() == "linear"
        assert "bar: median" in ax.get_ylabel() and "whiskers: p10 to p90" in ax.get_ylabel()


def test_latency_panels_hold_at_most_eight_lines_each_with_its_own_legend() -> None:
    results = _results()
    panels = latency_panels(results)
    assert all(1 <= len(rows) <= 8 for _, rows in panels)
    drawn = sorted((r.workload, r.executor) for _, rows in panels for r in rows)
    assert drawn == sorted((r.workload, r.executor) for r in results.rows)  # each exactly once
    fig = latency_figure(results)
    shown = [ax for ax in fig.get_axes() if ax.get_visible()]
    assert len(shown) == len(panels)
    for ax, (_, rows) in zip(shown, panels, strict=True):
        assert ax.get_yscale() == "linear"
        legend = ax.get_legend()
        assert legend is not None and len(legend.get_texts()) == len(rows) == len(ax.get_lines())


def test_each_executor_family_has_one_colour_and_marker() -> None:
    styles = {name: family(name) for name in EXECUTOR_NAMES}
    assert styles["command"] == styles["kernel"] == styles["fork-kernel"]
    assert styles["docker-command"] == styles["docker-kernel"]
    assert styles["subprocess"] == styles["jupyter-client"]
    by_family = {fam: (colour, marker) for fam, colour, marker in styles.values()}
    assert len(set(by_family.values())) == len(by_family)  # families tell apart
    assert "other" not in by_family


def test_memory_header_says_which_memory() -> None:
    assert any("RSS" in column for column in COLUMNS)
    assert "peak mem" not in COLUMNS


def test_ag2_on_another_interpreter_is_not_comparable(tmp_path: Path) -> None:
    """AG2 runs ``python`` from PATH: a run on an interpreter with no ``python`` beside it
    (``python3`` only) would measure another one; the row says so instead of drawing a bar."""
    assert _ag2_python_check(BenchContext()) is None  # the bench's own: AG2 is pointed at it
    other = tmp_path / "bin" / "python3"
    other.parent.mkdir()
    other.symlink_to(os.path.realpath(BenchContext().python))
    reason = _ag2_python_check(BenchContext(python=str(other)))
    assert reason is not None and reason.startswith("not comparable"), reason


def test_the_displays_block_times_itself_and_the_target_divides_by_that() -> None:
    """The 10,000 display() target: the host's time for the block over what the code itself
    spent making them, timed inside the same block."""
    import subprocess
    import sys

    from kernelexec.bench import report
    from kernelexec.bench.runner import _self_time
    from kernelexec.bench.workloads import outputs

    show = outputs(quick=True).stateful[0]
    assert show.self_time
    ran = subprocess.run(
        [sys.executable, "-c", show.code], capture_output=True, text=True, check=True, timeout=60
    )
    inside = _self_time(ran.stdout)
    assert inside is not None and 0 < inside < 60, ran.stdout[-200:]
    results = _results()
    row = RowResult(
        workload="outputs",
        executor="kernel",
        label="kernel",
        group="kernelexec",
        stateful=True,
        floor=None,
        status="ok",
    )
    row.sessions = [
        SessionRecord(block_s=[1.2, 0.5], metrics={"over_self_block1": v}) for v in (1.1, 1.2, 1.6)
    ]
    results.rows.append(row)
    check = {t.name: t for t in report.targets(results)}[
        "outputs: displays vs the kernel's own cost"
    ]
    assert check.value == pytest.approx(1.2) and check.met is True
