"""The fork-server kernel against the raw jupyter_client floor, measured in one run.

    python benchmarks/fork_kernel.py [-n 15] [--sessions 200] [--json]

* start to first result: ``KernelManager.start_kernel`` + ``wait_for_ready`` + ``1 + 1`` (the
  floor, a default ipykernel) beside ``make_executor("fork-kernel")`` + ``1 + 1``; interleaved
  round by round so load drift hits both alike. Target: fork kernel p50 <= 60 ms (about 10x
  below the floor).
* first block that builds a DataFrame, with pandas in the warm-up list. Target <= 100 ms.
* unique memory (USS, from ``/proc/PID/smaps_rollup``: Private_Clean + Private_Dirty) of an
  idle forked kernel beside the RSS of an idle cold kernel. Target USS <= 15 MiB.
* ``--sessions N`` forked kernels held at once, each answering a block; total USS reported.

Verdicts are printed lines, not assertions; the machine's load is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from jupyter_client.manager import KernelManager

from kernelexec import make_executor, stop_fork_servers
from kernelexec.bench.executors import WARM_UP, BenchContext, hold_fork_kernels
from kernelexec.bench.memory import rss_bytes, uss_bytes

START_TARGET_S = 0.060
PANDAS_TARGET_S = 0.100
USS_TARGET_MIB = 15.0
WARM = list(WARM_UP)


def uss_mib(pid: int) -> float:
    return (uss_bytes(pid) or 0) / 2**20


def rss_mib(pid: int) -> float:
    return rss_bytes(pid) / 2**20


def floor_start(work: Path) -> tuple[float, float]:
    """(seconds to the first result, idle RSS MiB) of a default kernel via jupyter_client."""
    started = time.perf_counter()
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(work), stderr=subprocess.DEVNULL)  # its TCP warning
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        kc.execute_interactive("1 + 1", timeout=60, output_hook=lambda msg: None)
        elapsed = time.perf_counter() - started  # its shutdown below is not counted
        rss = rss_mib(km.provisioner.pid)  # type: ignore[union-attr]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return elapsed, rss


def fork_start(work: Path, warm_up: list[str]) -> float:
    """Start to first result; the close after it is not counted (nor is the floor's)."""
    started = time.perf_counter()
    with make_executor("fork-kernel", work_dir=work, warm_up=warm_up) as ex:
        ex.execute("1 + 1")
        elapsed = time.perf_counter() - started
    return elapsed


def pandas_first_block(work: Path) -> float:
    with make_executor("fork-kernel", work_dir=work, warm_up=WARM) as ex:
        r = ex.execute("import pandas as pd\ndf = pd.DataFrame({'a': range(100)})\nint(df.a.sum())")
        assert r.output == "4950", r.output
        return r.duration_s


def idle_uss(work: Path) -> float:
    with make_executor("fork-kernel", work_dir=work, warm_up=WARM) as ex:
        ex.execute("x = 1")
        time.sleep(0.5)
        return uss_mib(ex.backend.pid)  # type: ignore[attr-defined]


def many_sessions(root: Path, count: int) -> dict[str, Any]:
    """The bench's own measurement (``kernelexec bench --hold``), warm-up list included."""
    return hold_fork_kernels(BenchContext(), count, root)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=15, help="rounds of the start comparison")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with TemporaryDirectory() as tmp:
        root = Path(tmp)
        fork_start(root, [])  # the server's own start is not a kernel start
        fork_start(root, WARM)
        floors, forks, rss = [], [], []
        for _ in range(args.n):
            f, r = floor_start(root)
            floors.append(f)
            rss.append(r)
            forks.append(fork_start(root, []))
        report: dict[str, Any] = {
            "load": os.getloadavg(),
            "floor_start_p50_s": statistics.median(floors),
            "fork_start_p50_s": statistics.median(forks),
            "cold_idle_rss_mib": statistics.median(rss),
            "pandas_first_block_s": statistics.median([pandas_first_block(root) for _ in range(5)]),
            "fork_idle_uss_mib": idle_uss(root),
        }
        report["fork_vs_floor"] = report["fork_start_p50_s"] / report["floor_start_p50_s"]
        if args.sessions:
            report["many"] = many_sessions(root, args.sessions)
        stop_fork_servers()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print(report)
    return 0


def _print(r: dict[str, Any]) -> None:
    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    print(f"load average {r['load'][0]:.2f}, python {sys.version.split()[0]}")
    print(f"raw KernelManager start to first result p50 {r['floor_start_p50_s'] * 1000:.0f} ms")
    fork = r["fork_start_p50_s"]
    print(
        f"fork kernel start to first result p50 {fork * 1000:.0f} ms "
        f"({r['fork_vs_floor']:.2f}x the floor)  target {START_TARGET_S * 1000:.0f} ms: "
        f"{verdict(fork <= START_TARGET_S)}"
    )
    pandas = r["pandas_first_block_s"]
    print(
        f"first DataFrame block, pandas warm {pandas * 1000:.1f} ms  target "
        f"{PANDAS_TARGET_S * 1000:.0f} ms: {verdict(pandas <= PANDAS_TARGET_S)}"
    )
    uss = r["fork_idle_uss_mib"]
    print(
        f"idle forked kernel USS {uss:.1f} MiB (cold kernel RSS {r['cold_idle_rss_mib']:.1f} MiB)"
        f"  target {USS_TARGET_MIB:.0f} MiB: {verdict(uss <= USS_TARGET_MIB)}"
    )
    if "many" in r:
        m = r["many"]
        if "error" in m:
            print(f"{m['sessions']} sessions: {m['error']}")
            return
        print(
            f"{m['sessions']} sessions held at once, {m['answered']} answered, in "
            f"{m['seconds_to_hold_all']:.1f} s; total USS {m['total_uss_mib']:.0f} MiB "
            f"({m['uss_per_session_mib']:.1f} MiB each)"
        )


if __name__ == "__main__":
    sys.exit(main())
