"""What charts and tables as data cost: a plot's (and a frame's) round trip with and without it.

    python benchmarks/chart_extraction.py [--rounds 20]

Two local kernels, one with ``charts=True`` (the default) and one with ``charts=False``; each
workload's blocks are interleaved between them so that load from elsewhere hits both alike.
Prints one Markdown row per workload (p50 of each, the difference) and the kernel start of each.
Then the stateless executors' rows (``command``, ``warm-command``): a whole block (imports, plot,
PNG, exit) with and without the figure's chart document, made in the block's process.
Only the public API is used.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kernelexec import KernelExecutor, make_executor

SETUP = "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
WORKLOADS = {
    "line plot, 1,000 points": "plt.plot(np.arange(1000), np.sqrt(np.arange(1000))); plt.show()",
    "2x2 subplots (line, bar, hist, scatter)": (
        "fig, a = plt.subplots(2, 2); a[0, 0].plot(range(50))\n"
        "a[0, 1].bar(list('abcd'), [1, 3, 2, 4])\n"
        "a[1, 0].hist(np.random.default_rng(0).normal(size=5000), bins=40)\n"
        "a[1, 1].scatter(np.arange(200), np.arange(200) % 7); plt.show()"
    ),
    "line plot, 1,000,000 points": (
        "plt.plot(np.arange(10**6), np.sin(np.arange(10**6) / 1e4)); plt.show()"
    ),
    "DataFrame 10,000 x 5": "pd.DataFrame(np.random.default_rng(0).normal(size=(10_000, 5)))",
}


# the stateless rows: each block imports what it uses (nothing survives a block)
STATELESS = {
    "line plot, 1,000 points": WORKLOADS["line plot, 1,000 points"],
    "2x2 subplots (line, bar, hist, scatter)": WORKLOADS["2x2 subplots (line, bar, hist, scatter)"],
}


def stateless_rows(work: Path, rounds: int) -> None:
    for kind in ("command", "warm-command"):
        on = make_executor(kind, work_dir=work / f"{kind}-on", timeout=120)
        off = make_executor(kind, work_dir=work / f"{kind}-off", timeout=120, charts=False)
        try:
            for name, code in STATELESS.items():
                block = SETUP + code
                timed(on, block), timed(off, block)  # warm: the spawner, the pyc files
                with_, without = [], []
                for _ in range(rounds):
                    with_.append(timed(on, block))
                    without.append(timed(off, block))
                row(f"{kind}: {name}", with_, without)
        finally:
            on.close()
            off.close()


def row(name: str, with_: list[float], without: list[float]) -> None:
    a, b = statistics.median(with_) * 1e3, statistics.median(without) * 1e3
    print(f"| {name} | {a:.1f} | {b:.1f} | {a - b:+.1f} ms ({(a / b - 1) * 100:+.0f} %) |")


def start(work: Path, charts: bool) -> tuple[KernelExecutor, float]:
    t = time.perf_counter()
    ex = KernelExecutor(work_dir=work, timeout=120, charts=charts)
    ex.start()
    assert ex.execute("1").ok
    return ex, time.perf_counter() - t


def timed(ex: Any, code: str) -> float:
    t = time.perf_counter()
    result = ex.execute(code)
    assert result.ok, result.output
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        on, on_start = start(Path(tmp) / "on", True)
        off, off_start = start(Path(tmp) / "off", False)
        try:
            for ex in (on, off):
                assert ex.execute(SETUP).ok
            print("| workload | with charts (p50 ms) | without (p50 ms) | difference |")
            print("|---|---:|---:|---:|")
            for name, code in WORKLOADS.items():
                rounds = args.rounds if "1,000,000" not in name else max(3, args.rounds // 5)
                timed(on, code), timed(off, code)  # warm: first imports, the extractor's compile
                with_, without = [], []
                for _ in range(rounds):
                    with_.append(timed(on, code))
                    without.append(timed(off, code))
                row(name, with_, without)
            print(
                f"| kernel start to first result | {on_start * 1e3:.0f} | {off_start * 1e3:.0f} "
                f"| {(on_start - off_start) * 1e3:+.0f} ms (one sample) |"
            )
        finally:
            on.close()
            off.close()
        stateless_rows(Path(tmp), max(3, args.rounds // 2))


if __name__ == "__main__":
    main()
