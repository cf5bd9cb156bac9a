"""What each way of containing code costs: start to first result and a trivial block.

For every back end with and without containment, in the same run: the local ``command`` and
``kernel`` (the caller's rights), their bubblewrap twins, the Docker back ends under runc, and the
Docker back ends under gVisor (``runtime="runsc"``). Starts are interleaved (one start of each
back end per round), so drift in machine load hits all of them alike; each start is followed by
``--blocks`` trivial blocks (``print(1)``, as ``kernelexec bench``'s trivial workload).

One more row isolates the cost of the transport gVisor needs: the Docker kernel under runc with
its channels forced through the ``docker exec`` relay (as under gVisor) instead of the shared
``ipc`` sockets.

A back end that cannot run here (no ``bwrap``, no engine, no ``runsc`` runtime) is reported as
such, not measured. Run it with ``python benchmarks/containment_cost.py`` (``--json`` for one
machine-readable line; ``--starts`` / ``--blocks`` for the sample sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelexec import DockerKernel, KernelExecError, KernelExecutor, make_executor


class _RelayedUnderRunc(DockerKernel):
    """The Docker kernel under runc, reached through the relay gVisor needs."""

    @property
    def relayed(self) -> bool:
        return True


def _registry(name: str, **options: Any) -> Callable[[Path], Any]:
    return lambda work: make_executor(name, work_dir=work, timeout=60, **options)


# (row, how to build it in a work dir)
ROWS: tuple[tuple[str, Callable[[Path], Any]], ...] = (
    ("command", _registry("command")),
    ("sandboxed-command", _registry("sandboxed-command")),
    ("docker-command (runc)", _registry("docker-command")),
    ("docker-command (gVisor)", _registry("docker-command", runtime="runsc")),
    ("kernel", _registry("kernel")),
    ("sandboxed-kernel", _registry("sandboxed-kernel")),
    ("docker-kernel (runc)", _registry("docker-kernel")),
    (
        "docker-kernel (runc, relay)",
        lambda work: KernelExecutor(backend=_RelayedUnderRunc(), work_dir=work, timeout=60),
    ),
    ("docker-kernel (gVisor)", _registry("docker-kernel", runtime="runsc")),
)


def one_start(build: Callable[[Path], Any], blocks: int) -> tuple[float, list[float]]:
    """(start to first result, each trivial block's time) for one fresh executor."""
    with tempfile.TemporaryDirectory(prefix="kx-containment-") as work:
        started = time.perf_counter()
        ex = build(Path(work))
        try:
            first = ex.execute("print(1)")
            start = time.perf_counter() - started
            assert first.output == "1\n", first.output
            times = []
            for _ in range(blocks):
                t = time.perf_counter()
                r = ex.execute("print(1)")
                times.append(time.perf_counter() - t)
                assert r.output == "1\n", r.output
        finally:
            ex.close()
    return start, times


def measure(starts: int, blocks: int, only: list[str] | None) -> dict[str, Any]:
    rows = [row for row in ROWS if not only or row[0] in only]
    samples: dict[str, dict[str, list[float]]] = {r[0]: {"start": [], "block": []} for r in rows}
    problems: dict[str, str] = {}
    for _ in range(starts):
        for label, build in rows:
            if label in problems:
                continue
            try:
                start, times = one_start(build, blocks)
            except KernelExecError as exc:
                problems[label] = f"{type(exc).__name__}: {exc}"
                continue
            samples[label]["start"].append(start)
            samples[label]["block"].extend(times)
    result: dict[str, Any] = {"load_average": os.getloadavg(), "cpus": os.cpu_count(), "rows": {}}
    for label, _ in rows:
        if label in problems:
            result["rows"][label] = {"unavailable": problems[label]}
            continue
        got = samples[label]
        result["rows"][label] = {
            "start_p50_ms": statistics.median(got["start"]) * 1e3,
            "block_p50_ms": statistics.median(got["block"]) * 1e3,
            "starts": len(got["start"]),
            "blocks": len(got["block"]),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="starts per back end")
    parser.add_argument("--blocks", type=int, default=20, help="trivial blocks per start")
    parser.add_argument("--only", action="append", help="a row to measure (repeatable)")
    parser.add_argument("--json", action="store_true", help="one machine-readable line")
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = measure(args.starts, args.blocks, args.only)
    result["load_average_before"] = load_before
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['cpus']} CPUs; load average {load_before[0]:.2f} before, "
        f"{result['load_average'][0]:.2f} after"
    )
    print(f"{'back end':<26} {'start p50':>10} {'block p50':>10}")
    for label, row in result["rows"].items():
        if "unavailable" in row:
            print(f"{label:<26} unavailable: {row['unavailable'][:80]}")
        else:
            print(f"{label:<26} {row['start_p50_ms']:>8.0f} ms {row['block_p50_ms']:>7.1f} ms")


if __name__ == "__main__":
    main()
