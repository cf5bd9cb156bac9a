"""Kernel pool figures (issue 6): acquire vs cold start, concurrent throughput, idle memory.

    python benchmarks/pool_scale.py [--acquires 5] [--blocks 50] [--sessions 1 2 4 8]

* acquire p50 from a filled ``KernelPool`` beside a cold ``KernelExecutor`` start (both to the
  first result of ``x = 1``); target: acquire under 20 ms against about a second;
* trivial-block throughput with N sessions at once, one thread per session;
* memory per idle pooled kernel (RSS of the kernel processes, read from /proc).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kernelexec import KernelExecutor, KernelPool, PoolOptions
from kernelexec.bench import Summary
from kernelexec.bench.memory import descendants, rss_bytes
from kernelexec.bench.sessions import wait_for_idle

CODE = "x = 1"


def acquire_vs_cold(count: int) -> None:
    cold, acquire = [], []
    with tempfile.TemporaryDirectory(prefix="kx-pool-") as tmp:
        for _ in range(count):
            t = time.perf_counter()
            with KernelExecutor(work_dir=Path(tmp), timeout=60) as ex:
                ex.execute(CODE)
                cold.append(time.perf_counter() - t)
    with KernelPool(options=PoolOptions(min_size=1, max_size=2), timeout=60) as pool:
        for _ in range(count):
            wait_for_idle(pool, 120)  # the refill is not what is measured
            t = time.perf_counter()
            with pool.acquire() as ex:
                ex.execute(CODE)
                acquire.append(time.perf_counter() - t)
    a, c = Summary.of(acquire), Summary.of(cold)
    verdict = "met" if a.p50 < 0.020 else "NOT met"
    print(
        f"acquire + first result p50 {a.p50 * 1e3:7.1f} ms   cold start + first result p50 "
        f"{c.p50 * 1e3:7.1f} ms   (target acquire < 20 ms: {verdict})"
    )


def throughput(sessions: int, blocks: int) -> float:
    with KernelPool(options=PoolOptions(min_size=sessions, max_size=sessions), timeout=60) as pool:
        wait_for_idle(pool, 300)
        executors = [pool.acquire() for _ in range(sessions)]
        try:
            barrier = threading.Barrier(sessions + 1)

            def work(ex: Any) -> None:
                barrier.wait()
                for _ in range(blocks):
                    assert ex.execute(CODE).ok

            threads = [threading.Thread(target=work, args=(ex,)) for ex in executors]
            for th in threads:
                th.start()
            barrier.wait()
            t = time.perf_counter()
            for th in threads:
                th.join()
            return sessions * blocks / (time.perf_counter() - t)
        finally:
            for ex in executors:
                ex.close()


def idle_memory(size: int) -> None:
    before = set(descendants(os.getpid()))
    with KernelPool(options=PoolOptions(min_size=size, max_size=size), timeout=60) as pool:
        wait_for_idle(pool, 300)
        time.sleep(1)  # let the kernels finish their start-up allocations
        kernels = [p for p in descendants(os.getpid()) if p not in before]
        total = sum(rss_bytes(p) for p in kernels)
    print(f"idle pooled kernels: {size}, RSS {total / 2**20:.0f} MiB, {total / size / 2**20:.0f} "
          "MiB per kernel")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--acquires", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=50)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    acquire_vs_cold(args.acquires)
    for n in args.sessions:
        rate = throughput(n, args.blocks)
        print(f"{n} concurrent session(s): {rate:7.1f} trivial blocks/s")
    idle_memory(4)


if __name__ == "__main__":
    main()
