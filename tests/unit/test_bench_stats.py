"""The benchmark's statistics, ratios, targets and reports, on fixed numbers (no processes)."""

from __future__ import annotations

import json
import math
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import kernelexec
from kernelexec.bench import executors, names, report, workloads
from kernelexec.bench.runner import (
    BenchConfig,
    BenchResults,
    RowResult,
    SessionRecord,
    StopFlag,
)
from kernelexec.bench.stats import (
    Summary,
    TargetCheck,
    format_bytes,
    format_ratio,
    format_seconds,
    percentile,
    ratio,
)

# -- statistics ---------------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 90) == 7.0
    assert percentile(values, 37.5) == pytest.approx(2.125)  # q need not be a whole percent


@pytest.mark.parametrize("q", [-1, 101])
def test_percentile_rejects_bad_q(q: float) -> None:
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile([1.0], q)


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_summary_of_fixed_sample() -> None:
    s = Summary.of([0.010, 0.020, 0.030, 0.040, 0.100])
    assert s.n == 5
    assert s.p50 == pytest.approx(0.030)
    assert s.p90 == pytest.approx(0.076)
    assert s.p10 == pytest.approx(0.014)
    assert s.max == 0.100 and s.min == 0.010
    assert s.mean == pytest.approx(0.040)
    assert s.stdev == pytest.approx(math.sqrt(0.00125))
    assert Summary.of([0.5]).stdev == 0.0


def test_ratio_handles_missing_and_zero_floors() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(3.0, None) is None
    assert ratio(3.0, 0.0) is None


def test_target_verdicts() -> None:
    met = TargetCheck.evaluate(name="a", description="", value=1.2, threshold=1.3)
    missed = TargetCheck.evaluate(name="b", description="", value=1.4, threshold=1.3)
    higher = TargetCheck.evaluate(
        name="c", description="", value=6.0, threshold=5.0, higher_is_better=True
    )
    absent = TargetCheck.evaluate(name="d", description="", value=None, threshold=1.0)
    not_here = TargetCheck.evaluate(
        name="e",
        description="",
        value=9.0,
        threshold=5.0,
        higher_is_better=True,
        applicable=False,
        note="small data",
    )
    assert (met.met, missed.met, higher.met) == (True, False, True)
    assert (met.verdict, missed.verdict) == ("met", "NOT met")
    assert absent.met is None and absent.verdict == "n/a" and "not measured" in absent.note
    assert not_here.met is None and not_here.note == "small data"
    assert met.to_dict()["verdict"] == "met"


def test_formatting() -> None:
    assert format_seconds(None) == "-"
    assert format_seconds(0.0000042) == "4 µs"
    assert format_seconds(0.0123) == "12.3 ms"
    assert format_seconds(2.5) == "2.50 s"
    assert format_bytes(64 * 1024 * 1024) == "64 MiB"
    assert format_ratio(1.234) == "1.23x"
    assert format_ratio(None) == "-"


# -- a run built by hand ------------------------------------------------------------------------


def _row(
    workload: str,
    executor: str,
    blocks: list[float],
    *,
    startup: float,
    stateful: bool,
    floor: str | None = None,
    group: str = "kernelexec",
) -> RowResult:
    total = startup + sum(blocks) + 0.01
    return RowResult(
        workload=workload,
        executor=executor,
        label=executor,
        group=group,
        stateful=stateful,
        floor=floor,
        status="ok",
        sessions=[
            SessionRecord(
                startup_s=startup,
                block_s=blocks,
                close_s=0.01,
                total_s=total,
                peak_rss=100 * 1024 * 1024,
            )
        ],
    )


@pytest.fixture
def results() -> BenchResults:
    r = BenchResults(
        config=BenchConfig(quick=False, sessions=1),
        data_rows=1_000_000,
        started_at="t0",
        finished_at="t1",
        machine={"cpus": 2},
    )
    r.rows = [
        _row(
            "trivial",
            "subprocess",
            [0.040, 0.040, 0.040],
            startup=0.05,
            stateful=False,
            group="floor",
        ),
        _row(
            "trivial",
            "jupyter-client",
            [0.002, 0.002, 0.002],
            startup=1.00,
            stateful=True,
            group="floor",
        ),
        _row(
            "trivial",
            "command",
            [0.044, 0.044, 0.044],
            startup=0.06,
            stateful=False,
            floor="subprocess",
        ),
        _row(
            "trivial",
            "kernel",
            [0.003, 0.003, 0.003],
            startup=1.10,
            stateful=True,
            floor="jupyter-client",
        ),
        _row("analysis", "command", [1.0] * 10, startup=0.06, stateful=False, floor="subprocess"),
        _row("analysis", "kernel", [0.1] * 10, startup=0.89, stateful=True, floor="jupyter-client"),
        RowResult(
            workload="trivial",
            executor="docker-kernel",
            label="d",
            group="kernelexec",
            stateful=True,
            floor="kernel",
            status="unavailable",
            reason="no engine",
        ),
    ]
    return r


def test_floor_ratios(results: BenchResults) -> None:
    by_key = {(r["workload"], r["executor"]): r for r in report.floor_ratios(results)}
    assert by_key[("trivial", "command")]["block_p50"] == pytest.approx(1.1)
    assert by_key[("trivial", "kernel")]["block_p50"] == pytest.approx(1.5)
    # start-up is pooled over workloads: kernel (1.10, 0.89) -> p50 0.995 over the floor's 1.00
    assert by_key[("trivial", "kernel")]["startup_p50"] == pytest.approx(0.995)
    # analysis has no floor rows measured here: no ratio is invented
    assert by_key[("analysis", "command")]["block_p50"] is None
    assert ("trivial", "docker-kernel") not in by_key


def test_speedups_use_session_times(results: BenchResults) -> None:
    analysis = next(
        s
        for s in report.speedups(results)
        if s["workload"] == "analysis" and s["stateful"] == "kernel"
    )
    assert analysis["session"] == pytest.approx((0.06 + 10 + 0.01) / (0.89 + 1.0 + 0.01))
    assert analysis["blocks_only"] == pytest.approx(10.0)


def test_targets(results: BenchResults) -> None:
    checks = {t.name: t for t in report.targets(results)}
    assert checks["kernel round trip"].value == pytest.approx(1.5)
    assert checks["kernel round trip"].met is False
    assert checks["stateless block"].met is True
    assert checks["kernel start"].met is True
    assert checks["analysis speed-up"].met is True  # 10.07 / 1.9 = 5.3
    assert checks["docker kernel round trip"].met is None


def test_analysis_target_needs_the_default_size(results: BenchResults) -> None:
    results.data_rows = 20_000
    check = next(t for t in report.targets(results) if t.name == "analysis speed-up")
    assert check.value is not None and check.met is None and "default data size" in check.note


def test_json_is_complete_and_serialisable(results: BenchResults, tmp_path: Path) -> None:
    path = report.write_json(results, tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["schema"] == report.SCHEMA_VERSION
    assert data["config"]["repeats"] == 1
    row = next(r for r in data["rows"] if r["executor"] == "kernel" and r["workload"] == "trivial")
    assert row["block"]["p50"] == pytest.approx(0.003)
    assert row["peak_rss_bytes"] == 100 * 1024 * 1024
    assert {t["name"] for t in data["targets"]} >= {"kernel round trip", "analysis speed-up"}
    assert not list(tmp_path.glob("*.tmp"))


def test_markdown_report(results: BenchResults) -> None:
    text = report.to_markdown(results, command="kernelexec bench")
    assert "## trivial" in text and "## analysis" in text
    assert "| kernel | stateful | ok | 1.10 s | 3.0 ms |" in text
    assert "1.50x jupyter-client" in text
    assert "docker-kernel unavailable: no engine" in text
    assert "NOT met" in text
    assert "`kernelexec bench`" in text


def test_the_containment_table_sets_each_isolation_side_by_side(results: BenchResults) -> None:
    results.rows.append(
        _row("trivial", "gvisor-kernel", [0.02] * 3, startup=3.5, stateful=True, floor="kernel")
    )
    rows = {c["containment"]: c for c in report.containment(results)}
    assert rows["none (caller's rights)"]["stateless"] == {
        "executor": "command",
        "start_p50": 0.06,
        "trivial_p50": 0.044,
    }
    assert rows["Docker, gVisor (runsc)"]["stateful"]["trivial_p50"] == 0.02
    assert rows["bubblewrap"]["stateful"]["start_p50"] is None  # did not run
    text = report.to_markdown(results)
    assert (
        "| Docker, gVisor (runsc) | gvisor-command | - | - | gvisor-kernel | 3.50 s | 20.0 ms |"
        in text
    )
    assert report.to_json(results)["containment"] == report.containment(results)


def test_charts_are_pngs(results: BenchResults, tmp_path: Path) -> None:
    from kernelexec.bench.charts import per_block_medians, write_charts

    for path in write_charts(results, tmp_path):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    two = RowResult(
        workload="w",
        executor="e",
        label="e",
        group="floor",
        stateful=False,
        floor=None,
        sessions=[SessionRecord(block_s=[1.0, 4.0]), SessionRecord(block_s=[3.0])],
    )
    assert per_block_medians(two) == [2.0, 4.0]


# -- names and workloads ------------------------------------------------------------------------


def test_selecting_rows_adds_their_floors() -> None:
    names = [s.name for s in executors.select_specs(["kernel", "command"])]
    assert names == ["subprocess", "jupyter-client", "command", "kernel"]
    assert [s.name for s in executors.select_specs(["command"], with_floors=False)] == ["command"]
    peers = {s.name for s in executors.select_specs(["peers"], with_floors=False)}
    assert peers == {"ag2-command", "ag2-jupyter", "autogen-command", "autogen-jupyter"}


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown executor\(s\): nope .*kernel"):
        executors.select_specs(["nope"])
    with pytest.raises(ValueError, match=r"unknown workload\(s\): nope .*trivial, imports"):
        workloads.build_workloads(["nope"], quick=True)


def test_stateless_analysis_rereads_the_data_and_stateful_loads_once() -> None:
    (w,) = workloads.build_workloads(["analysis"], quick=True)
    assert len(w.stateless) == len(w.stateful) == 10
    reads = lambda blocks: sum("read_csv" in b.code for b in blocks)  # noqa: E731
    assert reads(w.stateful) == 1
    assert reads(w.stateless) == 9  # every block but the first (imports only)
    assert w.data_rows == workloads.QUICK_ROWS
    code = w.stateful[1].render("data/x.csv")
    assert "pd.read_csv('data/x.csv')" in code


def test_generated_csv_is_deterministic(tmp_path: Path) -> None:
    a = workloads.generate_csv(tmp_path / "a.csv", 50)
    b = workloads.generate_csv(tmp_path / "b.csv", 50)
    assert a.read_text() == b.read_text()
    lines = a.read_text().splitlines()
    assert lines[0] == "id,date,category,value,flag" and len(lines) == 51


def test_stop_flag_first_sigint_asks_second_interrupts() -> None:
    before = signal.getsignal(signal.SIGINT)
    with StopFlag() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.requested.is_set()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workloads", "trivial", "nope"], "unknown workload(s): nope (valid: trivial, imports"),
        (["--executors", "kernal"], "unknown executor(s): kernal (valid: subprocess"),
    ],
)
def test_cli_rejects_unknown_names_before_running(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from kernelexec.cli import main

    assert main(["bench", *args, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing was started or written


def test_pool_acquire_target_reads_the_rows_own_metric(results: BenchResults) -> None:
    pool = _row("trivial", "pool", [0.003], startup=0.02, stateful=True, floor="kernel")
    pool.sessions[0].metrics = {"acquire_s": 0.012}
    results.rows.append(pool)
    check = next(t for t in report.targets(results) if t.name == "pool acquire")
    assert check.value == pytest.approx(0.012) and check.met is True
    assert check.format(check.value) == "12.0 ms" and check.threshold_text == "≤ 20.0 ms"


def test_summary_matches_percentile() -> None:
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.6]
    s = Summary.of(values)
    assert (s.p10, s.p50, s.p90) == pytest.approx(
        (percentile(values, 10), percentile(values, 50), percentile(values, 90))
    )
    single = Summary.of([0.5])
    assert (single.p10, single.p50, single.p90) == (0.5, 0.5, 0.5)


def test_the_parser_names_are_the_rows_and_workloads() -> None:
    """``names`` (read to build the parser) lists what ``executors`` and ``workloads`` run."""
    assert tuple(s.name for s in executors.SPECS) == names.EXECUTOR_NAMES
    assert set(names.GROUPS.values()) == {s.group for s in executors.SPECS}
    built = workloads.build_workloads(names.WORKLOAD_NAMES, quick=True)
    assert tuple(w.name for w in built) == names.WORKLOAD_NAMES
    assert kernelexec.DockerOptions().image == names.DEFAULT_IMAGE


class _FakeExecutor:
    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_kernelexec_rows_are_built_by_the_registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built: list[tuple[str, dict[str, Any]]] = []

    def make_executor(name: str, **options: Any) -> _FakeExecutor:
        built.append((name, options))
        return _FakeExecutor()

    monkeypatch.setattr(kernelexec, "make_executor", make_executor)
    ctx = executors.BenchContext(python="/usr/bin/python3", image="img:1", timeout=9.0)
    rows = [s for s in executors.SPECS if s.group == "kernelexec" and s.shared is None]
    for spec in rows:
        spec.open(ctx, tmp_path, None).close()
    common = {"work_dir": tmp_path, "timeout": 9.0}
    assert built == [
        ("command", {**common, "python": "/usr/bin/python3"}),
        (
            "warm-command",
            {**common, "python": "/usr/bin/python3", "warm_up": list(executors.WARM_UP)},
        ),
        ("kernel", common),
        ("sandboxed-command", common),
        ("sandboxed-kernel", common),
        ("docker-command", {**common, "image": "img:1"}),
        ("docker-kernel", {**common, "image": "img:1"}),
        ("docker-command", {**common, "image": "img:1", "runtime": "runsc"}),
        ("docker-kernel", {**common, "image": "img:1", "runtime": "runsc"}),
    ]
    assert {name for name, _ in built} <= set(kernelexec.EXECUTOR_NAMES)


@pytest.mark.parametrize("module", ["rich", "matplotlib"])
def test_bench_without_the_extra_says_how_to_install_it(
    module: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    from kernelexec.cli import main

    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    assert main(["bench", "--quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and module in err
    assert 'pip install "kernelexec[bench]"' in err
    assert not (tmp_path / "out").exists()


def test_charts_give_each_executor_one_colour_everywhere(results: BenchResults) -> None:
    """The same executor is drawn in the same colour in every panel of both charts."""
    from matplotlib.colors import to_hex

    from kernelexec.bench.charts import bars_figure, executor_colours, family, latency_figure

    colours = executor_colours(results)
    assert len(set(colours.values())) == len(colours)  # no two executors share a colour
    for panel in bars_figure(results).axes:
        labels = [t.get_text() for t in panel.get_xticklabels()]
        for label, patch in zip(labels, panel.patches, strict=False):
            assert to_hex(patch.get_facecolor()) == colours[label]
        assert panel.get_yscale() == "linear"  # issue 33: linear, each bar labelled
    for panel in latency_figure(results).axes:
        # latency.png: one colour per executor family (the same in every panel)
        for line in panel.get_lines():
            assert to_hex(line.get_color()) == family(line.get_label().split(" ")[0])[1]
        ticks = panel.xaxis.get_major_locator()()
        assert all(float(t).is_integer() for t in ticks)  # block numbers are whole
    legend_texts = [t.get_text() for t in bars_figure(results).legends[0].get_texts()]
    assert any("floor" in t for t in legend_texts)


def test_a_failed_row_is_not_drawn_as_a_measurement(results: BenchResults) -> None:
    """A row that failed on its first block has that block's time; the charts leave it out."""
    from kernelexec.bench.charts import bars_figure, latency_figure

    failed = _row("trivial", "ag2-command", [0.373], startup=0.1, stateful=False, group="peer")
    failed.status, failed.reason = "failed", "BlockFailed: no module named pandas"
    results.rows.append(failed)
    try:
        for panel in bars_figure(results).axes:
            assert "ag2-command" not in [t.get_text() for t in panel.get_xticklabels()]
        for panel in latency_figure(results).axes:
            assert not [x for x in panel.get_lines() if x.get_label().startswith("ag2-command")]
    finally:
        results.rows.remove(failed)


def test_chart_axes_read_as_plain_milliseconds(results: BenchResults) -> None:
    """Axes are labelled 20, 50, 100, not 2x10^1; bars carry their values."""
    from kernelexec.bench.charts import bars_figure, latency_figure

    for fig in (bars_figure(results), latency_figure(results)):
        fig.canvas.draw()
        for panel in fig.axes:
            labels = [t.get_text() for t in panel.get_yticklabels(which="both")]
            shown = [label for label in labels if label]
            assert shown and all(label.replace(".", "").isdigit() for label in shown), labels
    for panel in bars_figure(results).axes:  # each bar's value written on it
        assert len(panel.texts) == len(panel.patches) > 0
        assert all(t.get_text().replace(".", "").isdigit() for t in panel.texts)


def test_fork_kernel_memory_and_first_dataframe_targets(results: BenchResults) -> None:
    trivial = _row("trivial", "fork-kernel", [0.003], startup=0.05, stateful=True)
    trivial.sessions[0].metrics = {"kernel_uss_mib": 17.25}
    imports = _row("imports", "fork-kernel", [0.04, 0.3, 0.3], startup=0.05, stateful=True)
    imports.sessions[0].metrics = {"kernel_uss_mib": 80.0}  # another workload: not counted
    results.rows += [trivial, imports]
    checks = {t.name: t for t in report.targets(results)}
    memory = checks["fork kernel memory"]
    assert memory.value == pytest.approx(17.25) and memory.met is False
    assert memory.format(memory.value) == "17.2 MiB" and memory.threshold_text == "≤ 15.0 MiB"
    first = checks["fork kernel first DataFrame"]
    assert first.value == pytest.approx(0.04) and first.met is True
    below = checks["kernel round trip below the floor"]
    assert below.value == pytest.approx(1.5) and below.met is False


# -- outputs and held kernels (issue 17 parts 1 and 2) --------------------------------------------


def _outputs_row(displays: float, stdout: float, growth: float) -> RowResult:
    row = _row("outputs", "kernel", [displays, stdout], startup=0.7, stateful=True)
    row.sessions[0].metrics = {"host_growth_mib_block2": growth}
    return row


def test_output_targets_read_their_own_block_and_the_hosts_growth(results: BenchResults) -> None:
    results.rows.append(_outputs_row(2.7, 1.0, 130.0))
    checks = {t.name: t for t in report.targets(results)}
    assert checks["outputs: displays"].value == pytest.approx(2.7)
    assert checks["outputs: displays"].met is False
    assert checks["outputs: stdout"].value == pytest.approx(1.0)
    assert checks["outputs: stdout"].met is True
    assert checks["outputs: host memory"].value == pytest.approx(130.0)
    assert checks["outputs: host memory"].met is False


def test_output_targets_claim_no_verdict_at_the_quick_sizes(results: BenchResults) -> None:
    quick = BenchResults(config=BenchConfig(quick=True), rows=[_outputs_row(0.3, 0.1, 2.0)])
    checks = {t.name: t for t in report.targets(quick)}
    for name in ("outputs: displays", "outputs: stdout", "outputs: host memory"):
        assert checks[name].value is not None and checks[name].met is None
        assert "full sizes" in checks[name].note


def test_the_outputs_workload_runs_only_on_kernels() -> None:
    (quick,) = workloads.build_workloads(["outputs"], quick=True)
    (full,) = workloads.build_workloads(["outputs"], quick=False)
    assert quick.only == full.only == ("jupyter-client", "kernel", "fork-kernel")
    assert "range(10000)" in full.stateful[0].code and "range(100)" in full.stateful[1].code
    assert [b.host_memory for b in full.stateful] == [False, True]
    assert full.stateful[1].expect == "wrote 100 MB"
    from kernelexec.bench.executors import BenchContext
    from kernelexec.bench.runner import _plan

    out = BenchResults(config=BenchConfig())
    specs = executors.select_specs(["command", "kernel"], with_floors=False)
    cells = _plan(out, [quick], specs, BenchContext())
    assert [c.spec.name for c in cells] == ["kernel"]
    (skipped,) = [r for r in out.rows if r.executor == "command"]
    assert skipped.status == "skipped" and "outputs runs only on" in skipped.reason


@pytest.mark.parametrize(
    ("held", "verdict", "note"),
    [
        (
            {
                "sessions": 200,
                "answered": 200,
                "seconds_to_hold_all": 20.0,
                "total_uss_mib": 2900.0,
                "total_pss_mib": 3000.0,
                "uss_per_session_mib": 14.5,
            },
            "met",
            "total USS 2900 MiB (14.5 MiB each), PSS 3000 MiB",
        ),
        (
            {"sessions": 200, "answered": 0, "error": "after 150 kernels: OSError: too many"},
            "NOT met",
            "after 150 kernels",
        ),
        (
            {
                "sessions": 10,
                "answered": 10,
                "seconds_to_hold_all": 1.0,
                "total_uss_mib": 150.0,
                "total_pss_mib": 200.0,
                "uss_per_session_mib": 15.0,
            },
            "n/a",
            "defined for 200",
        ),
        (None, "n/a", "not measured"),
    ],
)
def test_held_kernels_target(
    results: BenchResults, held: dict[str, Any] | None, verdict: str, note: str
) -> None:
    results.held = held
    check = next(t for t in report.targets(results) if t.name == "fork kernels held at once")
    assert check.verdict == verdict and note in check.note
    assert report.to_json(results)["held"] == held


def test_hold_count_defaults() -> None:
    assert BenchConfig().hold_count == 200
    assert BenchConfig(quick=True).hold_count == 10
    assert BenchConfig(quick=True, hold=0).hold_count == 0
    assert BenchConfig(hold=-3).hold_count == 0


def test_own_peak_growth_sees_memory_the_block_allocated() -> None:
    from kernelexec.bench.memory import OwnPeakGrowth

    with OwnPeakGrowth() as growth:
        block = bytearray(64 * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # touch every page
        del block
    assert growth.grew is not None and growth.grew >= 60 * 2**20
