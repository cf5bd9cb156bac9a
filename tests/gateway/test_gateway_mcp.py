"""``kernelexec mcp --remote URL``: MCP sessions on a Kernel Gateway's kernels."""

from __future__ import annotations

import importlib.util
import json
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


def server(gateway: Gateway, *extra: str) -> StdioServerParameters:
    """``kernelexec mcp --remote`` on ``gateway``, from this checkout."""
    remote = ["--remote", gateway.url, "--remote-token", gateway.token, *extra]
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernelexec", "mcp", *remote],
        cwd=str(ROOT),
        env={"PYTHONPATH": str(ROOT)},
    )


def text(result: object) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))  # type: ignore[attr-defined]


def test_mcp_sessions_on_a_gateway(kernel_gateway: Gateway) -> None:
    params = server(kernel_gateway)

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


def test_file_tools_go_through_a_gateway_kernel(kernel_gateway: Gateway, tmp_path: Path) -> None:
    """The kernels work in a folder of the gateway's (``--remote-working-dir``), not in the
    server's session work dir: the file tools reach that folder through the kernel, as they
    must for a gateway on another machine."""
    remote = tmp_path / "gateway-side"
    remote.mkdir()
    params = server(kernel_gateway, "--remote-working-dir", str(remote))

    async def scenario() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            up = await client.call_tool("upload_file", {"path": "in/note.txt", "content": "é up"})
            assert not up.is_error, text(up)
            assert (remote / "in" / "note.txt").read_text(encoding="utf-8") == "é up"
            code = "import os; print(open('in/note.txt').read(), os.getcwd())"
            ran = await client.call_tool("execute", {"code": code})
            assert text(ran).startswith(f"é up {remote}"), text(ran)
            await client.call_tool("execute", {"code": "open('out.txt', 'w').write('made')"})
            read = await client.call_tool("read_file", {"path": "out.txt"})
            assert not read.is_error and text(read) == "made", text(read)
            listing = await client.call_tool("list_files", {})
            paths = [f["path"] for f in json.loads(text(listing))["files"]]
            assert "in/note.txt" in paths and "out.txt" in paths, paths
            sessions = json.loads(text(await client.call_tool("list_sessions", {})))
            host_dir = Path(sessions["sessions"][0]["work_dir"])
            assert not (host_dir / "out.txt").exists() and not (host_dir / "in").exists()
            missing = await client.call_tool("read_file", {"path": "nope.txt"})
            assert missing.is_error
            escape = await client.call_tool("read_file", {"path": "../outside.txt"})
            assert escape.is_error

    anyio.run(scenario)
