"""What the MCP server adds to a block: ``execute`` of ``x = 1`` over stdio beside the Python API.

    python benchmarks/mcp_overhead.py [--blocks 100] [--new-sessions 5]

One run, interleaved call by call so load from elsewhere hits both alike:

- **per call**: ``execute`` through ``kernelexec mcp`` (a child process, the SDK's stdio client)
  beside ``AsyncKernelExecutor.execute`` on a kernel of this process (issue 15's target: within
  2 ms at the median);
- **first call of a new session**: ``execute`` naming a session that does not exist yet, so the
  server takes a kernel from its warm pool (target: under 50 ms). Between two new sessions the
  script waits for the pool to refill (``--refill`` seconds), as a client's pauses would.

Needs the ``mcp`` extra. Prints medians, means and p90s in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from kernelexec import AsyncKernelExecutor

CODE = "x = 1"
ROOT = Path(__file__).resolve().parents[1]


def summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    return (
        f"{name:<38} n={len(ms):<4} median {statistics.median(ms):7.2f} ms   "
        f"mean {statistics.fmean(ms):7.2f} ms   p90 {p90:7.2f} ms"
    )


async def main(blocks: int, new_sessions: int, refill: float) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernelexec", "mcp", "--warm", "2", "--max-sessions", str(new_sessions + 4)],
        cwd=str(ROOT),
        env={"PYTHONPATH": str(ROOT)},
    )
    mcp_times: list[float] = []
    api_times: list[float] = []
    first_times: list[float] = []
    async with Client(params, read_timeout_seconds=120) as client, AsyncKernelExecutor() as api:
        for _ in range(5):  # warm both paths (the default session's kernel, imports)
            await client.call_tool("execute", {"code": CODE})
            await api.execute(CODE)
        for _ in range(blocks):
            t = time.perf_counter()
            result = await client.call_tool("execute", {"code": CODE})
            mcp_times.append(time.perf_counter() - t)
            assert not result.is_error
            t = time.perf_counter()
            await api.execute(CODE)
            api_times.append(time.perf_counter() - t)
        for i in range(new_sessions):
            await anyio.sleep(refill)  # the pool starts a kernel for each one taken
            t = time.perf_counter()
            result = await client.call_tool("execute", {"code": CODE, "session": f"new-{i}"})
            first_times.append(time.perf_counter() - t)
            assert not result.is_error
    print(summary("execute x = 1, Python API", api_times))
    print(summary("execute x = 1, MCP over stdio", mcp_times))
    gap = statistics.median(mcp_times) - statistics.median(api_times)
    print(f"{'MCP overhead at the median':<38} {gap * 1000:+.2f} ms (target: within 2 ms)")
    print(summary("first call of a new session (MCP)", first_times))
    print(f"{'target for a new session':<38} under 50 ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--new-sessions", type=int, default=5)
    parser.add_argument("--refill", type=float, default=4.0, help="seconds between new sessions")
    args = parser.parse_args()
    anyio.run(main, args.blocks, args.new_sessions, args.refill)
