"""Kernel round trip and kernel start: kernelexec beside raw jupyter_client, in one run.

    python benchmarks/kernel_roundtrip.py [--blocks 200] [--starts 5] [--profile]

Prints each floor, kernelexec's figure and the ratio (issue 3's targets: round trip p50 within
1.3x, start to first result within 1.2x). Round trips are interleaved block by block between the
raw client and kernelexec so that load from elsewhere on the machine hits both alike.
``--profile`` also estimates the sync front's hop (a sync round trip beside the async core's) and
prints where the rest goes: cProfile of the async core's block path, kernelexec's own functions
(the work-dir snapshots among them) first. Only the public API is used.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

import kernelexec
from kernelexec import AsyncKernelExecutor, KernelExecutor
from kernelexec.bench import Summary

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


def profile(blocks: int, work: Path, sync_p50: float) -> None:
    """Estimate the sync front's hop, then cProfile the async core's block path."""
    async_p50 = _profile_async_core(blocks, work)
    print(
        f"sync front hop (sync p50 - async core p50) {(sync_p50 - async_p50) * 1e6:8.0f} µs"
        f"  (sync {sync_p50 * 1e3:.2f} ms, async core {async_p50 * 1e3:.2f} ms)"
    )


def _profile_async_core(blocks: int, work: Path) -> float:
    """The async core's round trip p50, with no portal; prints where its time goes."""

    async def run() -> float:
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
        p50 = Summary.of(times).p50
        print(f"async core (no portal) round trip p50 {p50 * 1e3:.2f} ms")
        stats = pstats.Stats(prof)
        print(f"kernelexec's own functions, cumulative over {blocks} blocks:")
        package = re.escape(str(Path(kernelexec.__file__).parent))
        stats.sort_stats("cumulative").print_stats(package, 15)
        stats.sort_stats("tottime").print_stats(20)
        return p50

    return asyncio.run(run())


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
        sync_p50 = figure.p50
        floor, figure = starts(args.starts, work)
        show("start to first result", floor, figure, 1.2)
        if args.profile:
            profile(args.blocks, work, sync_p50)


if __name__ == "__main__":
    main()
