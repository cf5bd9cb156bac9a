"""``kernelexec mcp --remote URL``: MCP sessions on a Kernel Gateway's kernels."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import anyio
import pytest
from gateway_servers import Gateway

if importlib.util.find_spec("mcp") is None:
    pytest.skip("the mcp extra is installed in CI", allow_module_level=True)

from mcp import Client, StdioServerParameters
from mcp_types import TextContent

ROOT = Path(__file__).resolve().parents[2]


def test_mcp_sessions_on_a_gateway(kernel_gateway: Gateway) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "kernelexec",
            "mcp",
            "--remote",
            kernel_gateway.url,
            "--remote-token",
            kernel_gateway.token,
        ],
        cwd=str(ROOT),
        env={"PYTHONPATH": str(ROOT)},
    )

    def text(result: object) -> str:
        return "\n".join(b.text for b in result.content if isinstance(b, TextContent))  # type: ignore[attr-defined]

    async def scenario() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            await client.call_tool("execute", {"code": "g = 'gateway kernel'"})
            got = await client.call_tool("execute", {"code": "print(g)"})
            assert not got.is_error and text(got).startswith("gateway kernel")
            # the gateway runs on this machine: the kernel works in the session's work dir
            await client.call_tool("upload_file", {"path": "note.txt", "content": "shared"})
            read = await client.call_tool("execute", {"code": "print(open('note.txt').read())"})
            assert text(read).startswith("shared")
            sessions = await client.call_tool("list_sessions", {})
            assert '"executor": "gateway"' in text(sessions)

    anyio.run(scenario)
