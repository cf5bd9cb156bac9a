"""What a ``warm-command`` block costs beside a raw ``subprocess.run`` and beside its own floor.

Measured in one run, interleaved (ABBA: drift in the machine's load hits every side alike):

* raw: ``subprocess.run([python, "-c", "print(1)"], capture_output=True)``
* warm-command: ``execute("print(1)")`` on the warm stateless executor (default warm-up list)
* floor: a fork and exit of an interpreter warmed as the spawner is (same modules imported,
  ``gc.freeze()``), timed inside it: what no fork-per-block design can go below

The target is a median ratio warm-command / raw of at most 0.5. The load average is printed with
the numbers: on a loaded 2-core machine every side slows down, the ratio is what is compared.
Run it with ``python benchmarks/warm_overhead.py`` (``-n`` repetitions, ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from kernelexec import make_executor
from kernelexec.backends.warm_command import DEFAULT_WARM_UP

TARGET_RATIO = 0.5

# Run in its own interpreter: import the warm-up list, freeze, then fork-and-exit N times.
_FLOOR = """
import gc, importlib, json, os, sys, time
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception:
        pass
gc.freeze()
samples = []
for _ in range(int(sys.argv[1])):
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    samples.append(time.perf_counter() - started)
print(json.dumps(samples))
"""


def _ms(samples: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(samples) * 1e3, "min_ms": min(samples) * 1e3}


def _floor(n: int) -> list[float]:
    done = subprocess.run(
        [sys.executable, "-c", _FLOOR, str(n), *DEFAULT_WARM_UP],
        capture_output=True,
        check=True,
        text=True,
    )
    return [float(x) for x in json.loads(done.stdout)]


def measure(n: int) -> dict[str, object]:
    load = os.getloadavg()
    raw: list[float] = []
    warm: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="kx-warm-bench-") as work,
        make_executor("warm-command", work_dir=work, timeout=60) as ex,
    ):
        for _ in range(3):
            ex.execute("print(1)")
        for i in range(n):
            pair = [(raw, _raw_once), (warm, lambda: _warm_once(ex))]
            for samples, func in pair if i % 2 == 0 else reversed(pair):
                started = time.perf_counter()
                func()
                samples.append(time.perf_counter() - started)
    floor = _floor(n)
    ratio = statistics.median(warm) / statistics.median(raw)
    return {
        "repetitions": n,
        "cpus": os.cpu_count(),
        "load_average_before": load,
        "load_average_after": os.getloadavg(),
        "raw_subprocess_run": _ms(raw),
        "warm_command": _ms(warm),
        "floor_fork_exit_of_warm_interpreter": _ms(floor),
        "median_ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
    }


def _raw_once() -> None:
    done = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, check=True)
    if done.stdout != b"1\n":
        raise RuntimeError(f"unexpected output: {done.stdout!r}")


def _warm_once(ex: object) -> None:
    result = ex.execute("print(1)")  # type: ignore[attr-defined]
    if result.output != "1\n":
        raise RuntimeError(f"unexpected result: {result.output!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--repetitions", type=int, default=60)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report = measure(args.repetitions)
    if args.json:
        print(json.dumps(report))
        return 0
    load = report["load_average_before"]
    print(f"{report['cpus']} CPUs, load average {load[0]:.2f} (1 min) before the run")  # type: ignore[index]
    for key in ("raw_subprocess_run", "warm_command", "floor_fork_exit_of_warm_interpreter"):
        row = report[key]
        print(f"  {key:>38}: median {row['median_ms']:7.2f} ms  min {row['min_ms']:7.2f} ms")  # type: ignore[index]
    print(f"  {'ratio warm / raw (median)':>38}: {report['median_ratio']:.3f} (target <= 0.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
