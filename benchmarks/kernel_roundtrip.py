"""Kernel round trip and kernel start: kernelexec beside raw jupyter_client, in one run.

    python benchmarks/kernel_roundtrip.py [--blocks 200] [--starts 5] [--profile]

Prints each floor, kernelexec's figure and the ratio (issue 3's targets: round trip p50 within
1.3x, start to first result within 1.2x). Round trips are interleaved block by block between the
raw client and kernelexec so that load from elsewhere on the machine hits both alike.
``--profile`` also times the pieces kernelexec adds to a block (the sync portal hop, the work-dir
snapshots) and prints where the remaining time goes (cProfile of kernelexec's block path).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

from kernelexec._kernel import KernelExecutor
from kernelexec._sync import Portal
from kernelexec._workdir import Snapshot
from kernelexec.bench.stats import Summary

CODE = "x = 1"


def raw_start(work: Path) -> tuple[KernelManager, Any, float]:
    t = time.perf_counter()
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(work))
    kc = km.blocking_client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    kc.execute_interactive(CODE, timeout=60, output_hook=lambda msg: None)
    return km, kc, time.perf_counter() - t


def raw_stop(km: KernelManager, kc: Any) -> None:
    kc.stop_channels()
    km.shutdown_kernel()


def kx_start(work: Path) -> tuple[KernelExecutor, float]:
    t = time.perf_counter()
    ex = KernelExecutor(work_dir=work, timeout=60)
    ex.start()
    assert ex.execute(CODE).ok
    return ex, time.perf_counter() - t


def show(name: str, floor: Summary, figure: Summary, target: float) -> None:
    ratio = figure.p50 / floor.p50
    verdict = "met" if ratio <= target else "NOT met"
    print(
        f"{name:<22} floor p50 {floor.p50 * 1e3:8.2f} ms  kernelexec p50 {figure.p50 * 1e3:8.2f} ms"
        f"  ratio {ratio:5.2f}x  (target <= {target}x: {verdict})"
    )


def roundtrips(blocks: int, work: Path) -> tuple[Summary, Summary]:
    km, kc, _ = raw_start(work)
    ex, _ = kx_start(work)
    raw, kx, raw_cpu, kx_cpu = [], [], [], []
    try:
        for _ in range(blocks):
            t, c = time.perf_counter(), time.process_time()
            kc.execute_interactive(CODE, timeout=60, output_hook=lambda msg: None)
            raw.append(time.perf_counter() - t)
            raw_cpu.append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            ex.execute(CODE)
            kx.append(time.perf_counter() - t)
            kx_cpu.append(time.process_time() - c)
    finally:
        ex.close()
        raw_stop(km, kc)
    # CPU time of this process per block (all threads): what the client side itself costs,
    # much less sensitive to other load on the machine than wall time.
    show("client CPU per block", Summary.of(raw_cpu), Summary.of(kx_cpu), 1.3)
    return Summary.of(raw), Summary.of(kx)


def starts(count: int, work: Path) -> tuple[Summary, Summary]:
    raw, kx = [], []
    for _ in range(count):
        km, kc, took = raw_start(work)
        raw.append(took)
        raw_stop(km, kc)
        ex, took = kx_start(work)
        kx.append(took)
        ex.close()
    return Summary.of(raw), Summary.of(kx)


def profile(blocks: int, work: Path) -> None:
    """Time the pieces kernelexec adds to a block, then cProfile its block path."""
    portal = Portal(name="bench-portal")

    async def nothing() -> None:
        return None

    hops = []
    for _ in range(blocks):
        t = time.perf_counter()
        portal.call(nothing)
        hops.append(time.perf_counter() - t)
    portal.stop()
    snaps = []
    for _ in range(blocks):
        t = time.perf_counter()
        Snapshot.take(work)
        snaps.append(time.perf_counter() - t)
    print(f"sync portal hop (no-op coroutine) p50 {Summary.of(hops).p50 * 1e6:8.0f} µs")
    print(f"work-dir snapshot (x2 per block)  p50 {Summary.of(snaps).p50 * 1e6:8.0f} µs")

    _profile_async_core(blocks, work)


def _profile_async_core(blocks: int, work: Path) -> None:
    from kernelexec._kernel import AsyncKernelExecutor

    async def run() -> None:
        async with AsyncKernelExecutor(work_dir=work, timeout=60) as ex:
            await ex.execute(CODE)
            times = []
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(blocks):
                t = time.perf_counter()
                await ex.execute(CODE)
                times.append(time.perf_counter() - t)
            prof.disable()
            print(f"async core (no portal) round trip p50 {Summary.of(times).p50 * 1e3:.2f} ms")
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kx-roundtrip-") as tmp:
        work = Path(tmp)
        floor, figure = roundtrips(args.blocks, work)
        show("round trip (x = 1)", floor, figure, 1.3)
        floor, figure = starts(args.starts, work)
        show("start to first result", floor, figure, 1.2)
        if args.profile:
            profile(args.blocks, work)


if __name__ == "__main__":
    main()
