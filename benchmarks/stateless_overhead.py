"""How much a contained stateless block costs over a raw ``subprocess.run`` of the same command.

Both are measured in the same run, interleaved (ABBA, so drift in machine load hits both alike),
on the same code file run by the same interpreter:

* floor: ``subprocess.run([sys.executable, "block.py"], capture_output=True)``
* executor: ``CommandLineExecutor.execute(code)`` (write the file, start the process in a session
  and the executor's cgroup, capture and merge its output, kill whatever it left running)

Workloads: ``print(1)``, and a numpy block (import numpy, sum an array) where numpy is installed.
The target is a median ratio of at most 1.15 for each. The machine's load average is reported
with the numbers: on a loaded machine both sides slow down, the ratio is what is compared.
Run it with ``python benchmarks/stateless_overhead.py`` (``--json`` for one machine-readable
line, ``-n`` for the number of repetitions).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kernelexec import CommandLineExecutor

TARGET_RATIO = 1.15
WORKLOADS = {
    "print(1)": ("print(1)", "1\n"),
    "numpy sum": ("import numpy as np\nprint(int(np.arange(1000).sum()))", "499500\n"),
}


def _timed(func: Callable[[], object]) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def _summary(samples: list[float]) -> dict[str, float]:
    # linear interpolation between closest ranks, as `kernelexec bench` reports percentiles
    deciles = (
        statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples
    )
    return {
        "median_ms": statistics.median(samples) * 1e3,
        "p90_ms": deciles[-1] * 1e3,
        "min_ms": min(samples) * 1e3,
    }


def _workloads() -> dict[str, tuple[str, str]]:
    have_numpy = importlib.util.find_spec("numpy") is not None
    return {k: v for k, v in WORKLOADS.items() if have_numpy or "numpy" not in v[0]}


def measure_one(ex: CommandLineExecutor, code: str, expected: str, n: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="kx-floor-") as tmp:
        path = Path(tmp) / "block.py"
        path.write_text(code)

        def raw() -> None:
            done = subprocess.run([sys.executable, str(path)], capture_output=True, check=True)
            if done.stdout.decode() != expected:
                raise RuntimeError(f"unexpected output: {done.stdout!r}")

        def stateless() -> None:
            result = ex.execute(code)
            if result.exit_code != 0 or result.output != expected:
                raise RuntimeError(f"unexpected result: {result.to_reply()}")

        for _ in range(warmup):
            raw()
            stateless()
        raw_samples: list[float] = []
        exec_samples: list[float] = []
        for i in range(n):  # ABBA: neither side always goes first
            pair = ((raw_samples, raw), (exec_samples, stateless))
            for samples, func in pair if i % 2 == 0 else reversed(pair):
                samples.append(_timed(func))
    raw_s, exec_s = _summary(raw_samples), _summary(exec_samples)
    ratio = exec_s["median_ms"] / raw_s["median_ms"]
    return {
        "floor": raw_s,
        "executor": exec_s,
        "median_ratio": ratio,
        "within_target": ratio <= TARGET_RATIO,
    }


def measure(repetitions: int, warmup: int) -> dict[str, object]:
    load_before = os.getloadavg()
    with CommandLineExecutor(timeout=60) as ex:
        rows = {
            name: measure_one(ex, code, expected, repetitions, warmup)
            for name, (code, expected) in _workloads().items()
        }
        containment = getattr(ex.backend, "containment", None)
    return {
        "repetitions": repetitions,
        "warmup": warmup,
        "python": sys.version.split()[0],
        "containment": containment,
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "target_ratio": TARGET_RATIO,
        "workloads": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--repetitions", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report = measure(args.repetitions, args.warmup)
    if args.json:
        print(json.dumps(report))
        return 0
    load = report["load_average_before"]
    assert isinstance(load, tuple)
    print(
        f"repetitions: {args.repetitions} (after {args.warmup} warm-up rounds); "
        f"containment: {report['containment']}; {report['cpus']} CPUs, load average {load[0]:.2f}"
    )
    rows = report["workloads"]
    assert isinstance(rows, dict)
    for name, row in rows.items():
        print(f"{name}:")
        for label, key in (("raw subprocess.run", "floor"), ("CommandLineExecutor", "executor")):
            stats = row[key]
            print(
                f"  {label:>20}: median {stats['median_ms']:7.2f} ms  p90 {stats['p90_ms']:7.2f} ms"
            )
        print(f"  {'ratio (median)':>20}: {row['median_ratio']:.3f}  (target <= {TARGET_RATIO})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
