"""Fork to the child's first block for a Docker kernel session: a live fork (a process of the
same container, ``fork()``) beside the snapshot route (a new container loaded from a durable
snapshot, ``fork(via="snapshot")``), measured in the same run.

    python benchmarks/fork_docker.py --runtime runc --runtime runsc --mib 0 --mib 256 -n 3

Each session holds a numpy array of ``--mib`` MiB (0: a few small names). Prints one line per
case: p50 and all rounds, in seconds, and the machine's load average at the start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from kernelexec import DockerKernel, KernelExecutor


def _round(ex: KernelExecutor, via: str | None) -> float:
    started = time.perf_counter()
    child = ex.fork(via=via)
    try:
        assert child.execute("print(len(state))").ok
        return time.perf_counter() - started
    finally:
        child.close()


def _case(runtime: str, mib: int, rounds: int, snapshot_rounds: int) -> None:
    pids = 1024 if runtime == "runsc" else None
    with KernelExecutor(DockerKernel(runtime=runtime, pids_limit=pids), timeout=600) as ex:
        setup = "import numpy as np\nstate = {'a': 1, 'b': list(range(100))}\n"
        if mib:
            setup += f"state['big'] = np.ones({mib} * 1024 * 1024 // 8)\n"
        assert ex.execute(setup).ok
        for via, count in ((None, rounds), ("snapshot", snapshot_rounds)):
            times = [_round(ex, via) for _ in range(count)]
            what = "live fork" if via is None else "via snapshot"
            shown = ", ".join(f"{t:.2f}" for t in times)
            print(f"{runtime} {mib} MiB {what}: p50 {statistics.median(times):.2f} s ({shown})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", action="append", default=None)
    parser.add_argument("--mib", action="append", type=int, default=None)
    parser.add_argument("-n", type=int, default=3, help="rounds of the live fork")
    parser.add_argument("--snapshot-rounds", type=int, default=1)
    args = parser.parse_args()
    print("load average:", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    for runtime in args.runtime or ["runc"]:
        for mib in args.mib or [0]:
            _case(runtime, mib, args.n, args.snapshot_rounds)


if __name__ == "__main__":
    main()
