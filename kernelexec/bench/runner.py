"""The benchmark loop: every workload through every selected executor row, floors included.

Sessions of different rows are interleaved (workload, then repeat, then row) so that a burst of
load from elsewhere on the machine is spread over the rows instead of landing on one. Ctrl-C
(SIGINT) asks the loop to stop after the running block: the open session is closed, and the
results gathered so far are returned with ``interrupted`` set. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from .. import __version__
from .executors import (
    BenchContext,
    ExecutorSpec,
    hold_fork_kernels,
    missing_modules,
    select_specs,
)
from .memory import OwnPeakGrowth, PeakSampler, descendants
from .names import DEFAULT_IMAGE, WORKLOAD_NAMES
from .sessions import Session
from .stats import Summary, summarize
from .workloads import (
    SELF_TIME_TAG,
    Block,
    Workload,
    build_workloads,
    generate_csv,
    place_data,
)

PROBE = "print(1)"  # the first block of every session: start to first result
HOLD_DEFAULT = 200  # idle fork kernels held at once (issue 17's target)
HOLD_QUICK = 10


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    workloads: tuple[str, ...] = WORKLOAD_NAMES
    executors: tuple[str, ...] | None = None  # None: every row
    quick: bool = False
    sessions: int | None = None  # repeats per row and workload; None: 1 quick, 3 otherwise
    rows: int | None = None  # analysis CSV rows; None: the workload's default for the mode
    with_floors: bool = True
    memory: bool = True
    image: str = DEFAULT_IMAGE
    timeout: float = 300.0
    python: str | None = None
    hold: int | None = None  # fork kernels held at once at the end; None: 10 quick, 200 else

    @property
    def repeats(self) -> int:
        if self.sessions is not None:
            return max(1, self.sessions)
        return 1 if self.quick else 3

    @property
    def hold_count(self) -> int:
        if self.hold is not None:
            return max(0, self.hold)
        return HOLD_QUICK if self.quick else HOLD_DEFAULT


@dataclass(kw_only=True)
class SessionRecord:
    startup_s: float | None = None
    block_s: list[float] = field(default_factory=list)
    close_s: float | None = None
    total_s: float | None = None
    peak_rss: int | None = None
    error: str | None = None
    interrupted: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    peak_processes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class RowResult:
    """One (workload, executor) cell of the table."""

    workload: str
    executor: str
    label: str
    group: str
    stateful: bool
    floor: str | None
    status: str = "pending"  # ok | failed | unavailable | interrupted | pending
    reason: str = ""
    sessions: list[SessionRecord] = field(default_factory=list)

    @property
    def blocks(self) -> list[float]:
        return [b for s in self.sessions for b in s.block_s]

    def summary(self, what: str) -> Summary | None:
        """``what``: block, startup, total or close."""
        if what == "block":
            return summarize(self.blocks)
        values = [getattr(s, f"{what}_s") for s in self.sessions]
        return summarize([v for v in values if v is not None])

    @property
    def peak_rss(self) -> int | None:
        peaks = [s.peak_rss for s in self.sessions if s.peak_rss]
        return max(peaks) if peaks else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: getattr(self, k)
            for k in ("workload", "executor", "label", "group", "stateful", "floor", "status")
        }
        out["reason"] = self.reason
        for what in ("block", "startup", "total", "close"):
            s = self.summary(what)
            out[what] = None if s is None else s.to_dict()
        out["peak_rss_bytes"] = self.peak_rss
        out["sessions"] = [s.to_dict() for s in self.sessions]
        return out


@dataclass(kw_only=True)
class BenchResults:
    config: BenchConfig
    rows: list[RowResult] = field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""
    interrupted: bool = False
    data_rows: int | None = None
    machine: dict[str, Any] = field(default_factory=dict)
    held: dict[str, Any] | None = None  # the fork kernels held at once (hold_fork_kernels)

    def row(self, workload: str, executor: str) -> RowResult | None:
        for r in self.rows:
            if r.workload == workload and r.executor == executor:
                return r
        return None


class StopFlag:
    """Turns the first SIGINT into a polite request to stop (main thread only)."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._previous: Any = None
        self._installed = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.requested.is_set():
            raise KeyboardInterrupt
        self.requested.set()

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)


def machine_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "kernelexec": __version__,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


ProgressHook = Callable[[str, int, int], None]
"""Called before each session with (description, sessions done, sessions planned)."""


def run_benchmarks(
    config: BenchConfig,
    *,
    on_progress: ProgressHook | None = None,
    on_update: Callable[[BenchResults], None] | None = None,
) -> BenchResults:
    """Run the configured benchmark and return what was measured (also when interrupted)."""
    workloads = build_workloads(config.workloads, quick=config.quick, rows=config.rows)
    specs = select_specs(config.executors, with_floors=config.with_floors)
    ctx = BenchContext(
        timeout=config.timeout,
        image=config.image,
        **({"python": config.python} if config.python else {}),
    )
    results = BenchResults(config=config, started_at=_now(), machine=machine_info())
    scratch = Path(tempfile.mkdtemp(prefix="kernelexec-bench-"))
    try:
        with StopFlag() as stop:
            plan = _plan(results, workloads, specs, ctx)
            _run_plan(plan, results, ctx, config, scratch, stop, on_progress, on_update)
    finally:
        _remove(scratch)
        results.finished_at = _now()
        results.machine["load_average_end"] = (
            list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        )
    return results


@dataclass
class _Cell:
    workload: Workload
    spec: ExecutorSpec
    row: RowResult


def _plan(
    results: BenchResults,
    workloads: list[Workload],
    specs: list[ExecutorSpec],
    ctx: BenchContext,
) -> list[_Cell]:
    reasons = {s.name: s.check(ctx) for s in specs}
    pythons = {ctx.python} | {
        p for s in specs if s.interpreter and reasons[s.name] is None and (p := s.interpreter(ctx))
    }
    missing = {(py, w.name): missing_modules(py, w.needs) for py in pythons for w in workloads}
    cells: list[_Cell] = []
    for w in workloads:
        for s in specs:
            row = RowResult(
                workload=w.name,
                executor=s.name,
                label=s.label,
                group=s.group,
                stateful=s.stateful,
                floor=s.floor,
            )
            results.rows.append(row)
            if (skip := _not_paired(w, s)) is not None:
                row.status, row.reason = "skipped", skip
            elif reasons[s.name] is not None:
                row.status, row.reason = "unavailable", str(reasons[s.name])
            elif not s.docker and missing[(python := _python(s, ctx)), w.name]:
                lacks = ", ".join(missing[python, w.name])
                row.status, row.reason = "unavailable", f"{python} lacks {lacks}"
            else:
                cells.append(_Cell(w, s, row))
    return cells


def _not_paired(w: Workload, s: ExecutorSpec) -> str | None:
    """Why a row does not run a workload: the row runs only some workloads (a floor that can do
    one thing), or the workload runs only on some rows (outputs: kernels)."""
    if s.workloads is not None and w.name not in s.workloads:
        return f"{s.name} runs only {', '.join(s.workloads)}"
    if w.only is not None and s.name not in w.only:
        return f"{w.name} runs only on {', '.join(w.only)}"
    return None


def _python(spec: ExecutorSpec, ctx: BenchContext) -> str:
    return (spec.interpreter(ctx) if spec.interpreter else None) or ctx.python


def _run_plan(
    cells: list[_Cell],
    results: BenchResults,
    ctx: BenchContext,
    config: BenchConfig,
    scratch: Path,
    stop: StopFlag,
    on_progress: ProgressHook | None,
    on_update: Callable[[BenchResults], None] | None,
) -> None:
    try:
        with contextlib.ExitStack() as shared:
            run = _Run(ctx=ctx, config=config, scratch=scratch, stop=stop, shared=shared)
            _run_cells(cells, results, run, on_progress, on_update)
            _hold(cells, results, run, on_progress)
    except KeyboardInterrupt:  # a second Ctrl-C: the open session was closed on the way out
        results.interrupted = True


@dataclass
class _Run:
    """What every session of one run shares."""

    ctx: BenchContext
    config: BenchConfig
    scratch: Path
    stop: StopFlag
    shared: contextlib.ExitStack
    resources: dict[str, Any] = field(default_factory=dict)
    data: dict[int, Path] = field(default_factory=dict)

    def resource(self, spec: ExecutorSpec) -> Any:
        """The row's shared resource (a pool), made at its first session, closed at the end."""
        if spec.shared is None:
            return None
        if spec.name not in self.resources:
            self.resources[spec.name] = self.shared.enter_context(spec.shared(self.ctx))
        return self.resources[spec.name]


def _run_cells(
    cells: list[_Cell],
    results: BenchResults,
    run: _Run,
    on_progress: ProgressHook | None,
    on_update: Callable[[BenchResults], None] | None,
) -> None:
    planned = len(cells) * run.config.repeats
    done = 0
    for workload in dict.fromkeys(c.workload for c in cells):
        mine = [c for c in cells if c.workload is workload]
        if workload.data_rows and workload.data_rows not in run.data:
            if on_progress:
                on_progress(f"generating {workload.data_rows:,} CSV rows", done, planned)
            run.data[workload.data_rows] = generate_csv(
                run.scratch / f"data-{workload.data_rows}.csv", workload.data_rows
            )
            results.data_rows = workload.data_rows
        for _ in range(run.config.repeats):
            for cell in mine:
                if run.stop.requested.is_set():
                    results.interrupted = True
                    return
                if cell.row.status == "failed":
                    done += 1
                    continue
                if on_progress:
                    on_progress(f"{workload.name} · {cell.spec.name}", done, planned)
                record = _run_session(cell, run)
                cell.row.sessions.append(record)
                if record.error is not None:
                    cell.row.status, cell.row.reason = "failed", record.error
                elif record.interrupted:
                    cell.row.status = "interrupted"
                elif cell.row.status == "pending":
                    cell.row.status = "ok"
                done += 1
                if on_update:
                    on_update(results)
    if on_progress:
        on_progress("done", done, planned)


def _hold(
    cells: list[_Cell], results: BenchResults, run: _Run, on_progress: ProgressHook | None
) -> None:
    """The fork kernels held at once, on the row's own server, when the fork row ran."""
    count = run.config.hold_count
    fork = next((c.spec for c in cells if c.spec.name == "fork-kernel"), None)
    if fork is None or count == 0 or results.interrupted or run.stop.requested.is_set():
        return
    if on_progress:
        on_progress(f"holding {count} fork kernels at once", 0, 0)
    try:
        run.resource(fork)
    except Exception as exc:
        results.held = {"sessions": count, "answered": 0, "error": f"{type(exc).__name__}: {exc}"}
        return
    root = Path(tempfile.mkdtemp(prefix="held-", dir=run.scratch))
    results.held = hold_fork_kernels(run.ctx, count, root)


def _run_session(cell: _Cell, run: _Run) -> SessionRecord:
    ctx, spec = run.ctx, cell.spec
    work = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=run.scratch))
    if cell.workload.data_rows:
        place_data(run.data[cell.workload.data_rows], work)
    blocks = cell.workload.blocks(spec.stateful)[: spec.max_blocks]
    record = SessionRecord()
    containers: list[str] = []
    sampler = None
    if run.config.memory:
        # Processes alive before the session (a pool's idle kernels) are not this row's,
        # except for the pool row itself, whose kernel was started before it was acquired.
        before = set() if spec.shared is not None else set(descendants(os.getpid()))
        sampler = PeakSampler(containers=lambda: containers, exclude=before)
    session: Session | None = None
    try:
        shared = run.resource(spec)  # a pool fills before its sessions are timed
    except Exception as exc:
        record.error = f"could not set up {spec.name}: {type(exc).__name__}: {exc}"[:500]
        return record
    with sampler or contextlib.nullcontext():
        started = time.perf_counter()
        try:
            with _session(spec, ctx, work, record, shared) as session:
                containers.extend(session.container_ids())
                _check(session.run(PROBE, ctx.timeout), "1", "probe")
                record.startup_s = time.perf_counter() - started
                _run_blocks(session, blocks, work, record, run)
        except Exception as exc:  # a failing row is reported, and the other rows still run
            record.error = f"{type(exc).__name__}: {exc}".strip()[:500]
        record.total_s = time.perf_counter() - started
    if sampler is not None and sampler.samples:
        record.peak_rss = sampler.peak
        record.peak_processes = sampler.peak_detail
    if session is not None:
        record.metrics.update(session.metrics())
        session.settle()
    _remove(work)
    return record


def _run_blocks(
    session: Session, blocks: Sequence[Block], work: Path, record: SessionRecord, run: _Run
) -> None:
    for i, block in enumerate(blocks):
        if run.stop.requested.is_set():
            record.interrupted = True
            return
        code = block.render(session.data_path(work))
        with OwnPeakGrowth() if block.host_memory else contextlib.nullcontext() as growth:
            t = time.perf_counter()
            outcome = session.run(code, run.ctx.timeout)
            record.block_s.append(time.perf_counter() - t)
        if growth is not None and growth.grew is not None:
            record.metrics[f"host_growth_mib_block{i + 1}"] = growth.grew / 2**20
        _check(outcome, block.expect, f"block {i + 1}")
        if block.self_time and (inside := _self_time(outcome.text)):
            record.metrics[f"self_s_block{i + 1}"] = inside
            record.metrics[f"over_self_block{i + 1}"] = record.block_s[-1] / inside


def _self_time(text: str) -> float | None:
    """The seconds a block timed itself spending (``SELF_TIME_TAG``), if it said."""
    found = re.search(re.escape(SELF_TIME_TAG) + r"([0-9.]+)", text)
    return float(found[1]) if found and float(found[1]) > 0 else None


class BlockFailed(Exception):
    """A block did not succeed, or did not print what it should have."""


def _check(outcome: Any, expect: str | None, where: str) -> None:
    if not outcome.ok or (expect is not None and expect not in outcome.text):
        tail = outcome.text.strip()[-300:]
        raise BlockFailed(f"{where} failed (expected {expect!r}): {tail}")


@contextlib.contextmanager
def _session(
    spec: ExecutorSpec, ctx: BenchContext, work: Path, record: SessionRecord, shared: Any
) -> Iterator[Session]:
    """Open a session and always close it, timing the close."""
    session = spec.open(ctx, work, shared)
    try:
        yield session
    finally:
        t = time.perf_counter()
        session.close()
        record.close_s = time.perf_counter() - t


def _remove(path: Path) -> None:
    """Remove a scratch folder; once more after a moment if something (a container's bind
    mount being torn down) still held or recreated part of it."""
    for attempt in range(3):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
        time.sleep(0.2 * (attempt + 1))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
