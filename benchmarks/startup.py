"""Start-up time: ``import kernelexec`` and ``kernelexec --help`` beside a bare interpreter.

    python benchmarks/startup.py [-n 20] [--warmup 2] [--json]

Each command runs as a fresh process, wall time from start to exit, in the same run and
interleaved round by round so drift in machine load hits every command alike:

* floor: ``python -c pass`` (the interpreter and its ``site`` start-up, nothing of kernelexec)
* ``python -c "import kernelexec"``
* ``python -m kernelexec --help``
* ``kernelexec --help`` (the console script installed beside this interpreter, when there is one)

Targets (medians, wall time): the import under 0.15 s, ``--help`` under 0.3 s. The verdict is a
reported PASS / FAIL line, not an assertion; the figure over the floor is printed beside it, as
the floor depends on the machine (``.pth`` files in site-packages run at every start).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMPORT_TARGET_S = 0.15
HELP_TARGET_S = 0.3


def console_script() -> str | None:
    """The ``kernelexec`` script of this interpreter's environment (not a shim in front of it)."""
    beside = Path(sys.executable).with_name("kernelexec")
    if beside.is_file():
        return str(beside)
    return shutil.which("kernelexec")


def commands() -> dict[str, list[str]]:
    """Name -> argv, the floor first."""
    out = {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "import kernelexec": [sys.executable, "-c", "import kernelexec"],
        "python -m kernelexec --help": [sys.executable, "-m", "kernelexec", "--help"],
    }
    script = console_script()
    if script is not None:
        out["kernelexec --help"] = [script, "--help"]
    return out


def _timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "min_s": min(samples),
        "median_s": statistics.median(samples),
        "max_s": max(samples),
    }


def measure(repetitions: int, warmup: int) -> dict[str, object]:
    argvs = commands()
    for _ in range(warmup):  # compiles .pyc files and fills the page cache
        for argv in argvs.values():
            _timed(argv)
    samples: dict[str, list[float]] = {name: [] for name in argvs}
    for _ in range(repetitions):
        for name, argv in argvs.items():
            samples[name].append(_timed(argv))
    summaries = {name: _summary(values) for name, values in samples.items()}
    floor = summaries["python -c pass (floor)"]["median_s"]
    targets = {"import kernelexec": IMPORT_TARGET_S}
    targets.update({name: HELP_TARGET_S for name in argvs if name.endswith("--help")})
    checks = [
        {
            "command": name,
            "median_s": summaries[name]["median_s"],
            "over_floor_s": summaries[name]["median_s"] - floor,
            "target_s": target,
            "passed": summaries[name]["median_s"] < target,
        }
        for name, target in targets.items()
    ]
    return {
        "repetitions": repetitions,
        "warmup": warmup,
        "python": sys.version.split()[0],
        "commands": {name: " ".join(argv) for name, argv in argvs.items()},
        "results": summaries,
        "checks": checks,
        "passed": all(c["passed"] for c in checks),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--repetitions", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report = measure(max(1, args.repetitions), args.warmup)
    if args.json:
        print(json.dumps(report))
        return 0
    results, checks = report["results"], report["checks"]
    assert isinstance(results, dict) and isinstance(checks, list)
    floor = results["python -c pass (floor)"]["median_s"]
    print(f"repetitions: {args.repetitions} per command (after {args.warmup} warm-up rounds)")
    for name, s in results.items():
        over = "" if name.endswith("(floor)") else f"   +{(s['median_s'] - floor) * 1e3:6.1f} ms"
        print(
            f"{name:>28}: min {s['min_s'] * 1e3:7.1f} ms   median {s['median_s'] * 1e3:7.1f} ms"
            f"   max {s['max_s'] * 1e3:7.1f} ms{over}"
        )
    if "kernelexec --help" not in results:
        print(f"{'kernelexec --help':>28}: no console script found beside {sys.executable}")
    for c in checks:
        verdict = "PASS" if c["passed"] else "FAIL"
        print(
            f"{verdict}: {c['command']} median {c['median_s']:.3f} s "
            f"(target < {c['target_s']} s; {c['over_floor_s']:.3f} s over the floor)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
