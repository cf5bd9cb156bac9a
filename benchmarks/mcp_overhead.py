"""What the MCP server adds to a block: ``execute`` of ``x = 1`` over stdio beside the Python API.

    python benchmarks/mcp_overhead.py [--blocks 100] [--new-sessions 5]

One run, interleaved call by call so load from elsewhere hits both alike:

- **per call**: ``execute`` through ``kernelexec mcp`` (a child process, the SDK's stdio client)
  beside ``AsyncKernelExecutor.execute`` on a kernel of this process (issue 15's target: within
  2 ms at the median);
- **the SDK's own floor**: a one-tool MCP server on the same SDK (its tool returns the text it
  was given) called the same way over stdio: what any MCP server costs per call here, before
  kernelexec does anything;
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
#: the floor: the same SDK, one tool that does nothing but answer
ECHO_SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("echo")
@server.tool()
async def execute(code: str) -> str:
    return code
server.run()
"""


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
    echo = StdioServerParameters(command=sys.executable, args=["-c", ECHO_SERVER])
    mcp_times: list[float] = []
    api_times: list[float] = []
    echo_times: list[float] = []
    first_times: list[float] = []
    async with (
        Client(params, read_timeout_seconds=120) as client,
        Client(echo, read_timeout_seconds=120) as floor,
        AsyncKernelExecutor() as api,
    ):
        for _ in range(5):  # warm every path (the default session's kernel, imports)
            await client.call_tool("execute", {"code": CODE})
            await floor.call_tool("execute", {"code": CODE})
            await api.execute(CODE)
        for _ in range(blocks):
            t = time.perf_counter()
            result = await client.call_tool("execute", {"code": CODE})
            mcp_times.append(time.perf_counter() - t)
            assert not result.is_error
            t = time.perf_counter()
            await api.execute(CODE)
            api_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            await floor.call_tool("execute", {"code": CODE})
            echo_times.append(time.perf_counter() - t)
        for i in range(new_sessions):
            await anyio.sleep(refill)  # the pool starts a kernel for each one taken
            t = time.perf_counter()
            result = await client.call_tool("execute", {"code": CODE, "session": f"new-{i}"})
            first_times.append(time.perf_counter() - t)
            assert not result.is_error
    print(summary("execute x = 1, Python API", api_times))
    print(summary("execute x = 1, MCP over stdio", mcp_times))
    print(summary("the SDK's floor: a one-tool echo server", echo_times))
    gap = statistics.median(mcp_times) - statistics.median(api_times)
    print(f"{'MCP overhead at the median':<38} {gap * 1000:+.2f} ms (target: within 2 ms)")
    ours = gap - statistics.median(echo_times)
    print(f"{'  of which beyond the SDK floor':<38} {ours * 1000:+.2f} ms")
    print(summary("first call of a new session (MCP)", first_times))
    print(f"{'target for a new session':<38} under 50 ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--new-sessions", type=int, default=5)
    parser.add_argument("--refill", type=float, default=4.0, help="seconds between new sessions")
    args = parser.parse_args()
    anyio.run(main, args.blocks, args.new_sessions, args.refill)
