"""The ``kernelexec bench`` sub-command (registered by ``kernelexec.cli``).

Start-up time: importing this module loads argparse, and building the parser (``kernelexec
--help``, ``kernelexec bench --help``) reads only the names the options list (``names``): no
rich, matplotlib, jupyter_client, Docker SDK or nbformat. ``cmd_bench`` imports what the run
needs, after checking that the ``bench`` extra is installed.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from .runner import BenchConfig, BenchResults

EXIT_INTERRUPTED = 130
EXIT_USAGE = 2
#: the bench's own dependencies beyond kernelexec's: the ``bench`` extra
EXTRA_MODULES = ("rich", "matplotlib", "numpy", "pandas")
INSTALL_HINT = 'pip install "kernelexec[bench]"'


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .names import DEFAULT_IMAGE, EXECUTOR_NAMES, GROUPS, WORKLOAD_NAMES

    bench = sub.add_parser(
        "bench",
        help="benchmark stateless vs stateful executors beside their floors",
        description="Run workloads through every available executor and the raw floors "
        "(subprocess, jupyter_client, docker exec) in the same run; write JSON, Markdown "
        "and PNG charts.",
    )
    bench.add_argument("--quick", action="store_true", help="small sizes, one session per row")
    bench.add_argument(
        "--workloads",
        nargs="+",
        metavar="NAME",
        default=list(WORKLOAD_NAMES),
        help=f"any of: {', '.join(WORKLOAD_NAMES)}",
    )
    bench.add_argument(
        "--executors",
        nargs="+",
        metavar="NAME",
        help=f"any of: {', '.join((*EXECUTOR_NAMES, *GROUPS))} (default: all; "
        "the floors of the chosen rows are added)",
    )
    bench.add_argument("--out", default="bench-results", help="folder for the files written")
    bench.add_argument("--json", action="store_true", help="print the JSON instead of tables")
    bench.add_argument("--sessions", type=int, help="sessions per row (default 3, quick 1)")
    bench.add_argument("--rows", type=int, help="analysis CSV rows (default 1,000,000)")
    bench.add_argument(
        "--hold",
        type=int,
        metavar="N",
        help="fork kernels held open at once after the rows, each answering a block "
        "(default 200, quick 10; 0: skip)",
    )
    bench.add_argument("--image", default=DEFAULT_IMAGE, help="image for the Docker rows")
    bench.add_argument("--timeout", type=float, default=300.0, help="seconds per block")
    bench.add_argument("--no-floors", action="store_true", help="do not add the floor rows")
    bench.add_argument("--no-memory", action="store_true", help="do not sample memory")
    bench.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)


def missing_extra() -> list[str]:
    """The modules of the ``bench`` extra that cannot be imported here."""
    import importlib

    missing: list[str] = []
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Validate names up front, so a typo fails before anything starts."""
    from .executors import select_specs
    from .runner import BenchConfig
    from .workloads import build_workloads

    workloads = tuple(args.workloads)
    build_workloads(workloads, quick=True)  # raises ValueError listing the valid names
    executors = tuple(args.executors) if args.executors else None
    select_specs(executors)
    return BenchConfig(
        workloads=workloads,
        executors=executors,
        quick=args.quick,
        sessions=args.sessions,
        rows=args.rows,
        hold=args.hold,
        with_floors=not args.no_floors,
        memory=not args.no_memory,
        image=args.image,
        timeout=args.timeout,
    )


def cmd_bench(args: argparse.Namespace) -> int:
    missing = missing_extra()
    if missing:
        print(
            f"kernelexec bench: {' and '.join(missing)} not installed; run: {INSTALL_HINT}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import json
    import shlex
    from pathlib import Path

    from rich.console import Console

    from .output import write_outputs
    from .report import print_tables, to_json

    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"kernelexec bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "kernelexec " + shlex.join(sys.argv[1:]) if sys.argv[1:] else None
    results = _run_with_progress(config, out, show=not args.no_progress)
    written = write_outputs(results, out, command=command, charts=not args.no_charts)
    if args.json:
        print(json.dumps(to_json(results), indent=2, default=str))
    else:
        # Off a terminal (CI logs, pipes) rich assumes 80 columns and folds every cell.
        print_tables(results, Console(width=None if sys.stdout.isatty() else 160))
        print("wrote: " + ", ".join(str(p) for p in written.values()))
    if results.interrupted:
        return EXIT_INTERRUPTED
    return 1 if any(r.status == "failed" for r in results.rows) else 0


def _run_with_progress(config: BenchConfig, out: Path, *, show: bool) -> BenchResults:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .report import JSON_NAME, write_json
    from .runner import run_benchmarks

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} sessions"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not show,
        transient=True,
    )
    with progress:
        task = progress.add_task("starting", total=None)

        def on_progress(description: str, done: int, planned: int) -> None:
            progress.update(task, description=description, completed=done, total=planned)

        def on_update(partial: Any) -> None:
            # Written after every session, so even a hard kill leaves the rows measured so far.
            write_json(partial, out / JSON_NAME)

        return run_benchmarks(config, on_progress=on_progress, on_update=on_update)
