"""How much a stateless ``print(1)`` block costs over a bare interpreter start.

Both are measured in the same run, interleaved so drift in machine load hits both alike:

* raw: ``subprocess.run([sys.executable, "-c", "print(1)"])``
* executor: ``CommandLineExecutor.execute("print(1)")`` (write the file, start the process in a
  group of its own, capture its output, snapshot the work dir for artifacts)

The target is a median ratio of at most 1.15. Run it with
``python benchmarks/stateless_overhead.py`` (``--json`` for one machine-readable line, ``-n`` for
the number of repetitions).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from kernelexec import CommandLineExecutor

TARGET_RATIO = 1.15


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


def measure(repetitions: int, warmup: int) -> dict[str, object]:
    def raw() -> None:
        subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, check=True)

    with CommandLineExecutor(timeout=30) as ex:

        def stateless() -> None:
            result = ex.execute("print(1)")
            if result.exit_code != 0 or result.output != "1\n":
                raise RuntimeError(f"unexpected result: {result.to_reply()}")

        for _ in range(warmup):
            raw()
            stateless()
        raw_samples: list[float] = []
        exec_samples: list[float] = []
        for _ in range(repetitions):
            raw_samples.append(_timed(raw))
            exec_samples.append(_timed(stateless))
    raw_s, exec_s = _summary(raw_samples), _summary(exec_samples)
    ratio = exec_s["median_ms"] / raw_s["median_ms"]
    return {
        "repetitions": repetitions,
        "warmup": warmup,
        "python": sys.version.split()[0],
        "raw": raw_s,
        "executor": exec_s,
        "median_ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
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
    raw, executor = report["raw"], report["executor"]
    assert isinstance(raw, dict) and isinstance(executor, dict)
    print(f"repetitions: {args.repetitions} (after {args.warmup} warm-up rounds)")
    for name, stats in (("raw subprocess.run", raw), ("CommandLineExecutor", executor)):
        print(f"{name:>20}: median {stats['median_ms']:7.2f} ms   p90 {stats['p90_ms']:7.2f} ms")
    print(f"{'ratio (median)':>20}: {report['median_ratio']:.3f}  (target <= {TARGET_RATIO})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
