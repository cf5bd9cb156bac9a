"""The MCP server's fork_session, snapshot and restore tools, over stdio, on local kernels."""

from __future__ import annotations

import re

import anyio
import pytest
from _mcp_client import stdio_client, text

pytestmark = pytest.mark.kernel


def test_fork_snapshot_and_restore_tools() -> None:
    async def scenario() -> None:
        async with stdio_client() as client:
            await client.call_tool("execute", {"code": "x = 41"})
            forked = await client.call_tool("fork_session", {"new_session": "b"})
            assert not forked.is_error, text(forked)
            child = await client.call_tool("execute", {"code": "x += 1\nprint(x)", "session": "b"})
            assert text(child).startswith("42")
            parent = await client.call_tool("execute", {"code": "print(x)"})
            assert text(parent).startswith("41")  # the two diverged

            taken = await client.call_tool("snapshot", {})
            snap = re.search(r"snapshot-\d+", text(taken))
            assert not taken.is_error and snap is not None, text(taken)
            await client.call_tool("execute", {"code": "x = 0"})
            back = await client.call_tool("restore", {"snapshot_id": snap.group()})
            assert not back.is_error, text(back)
            assert text(await client.call_tool("execute", {"code": "print(x)"})).startswith("41")
            branch = await client.call_tool(
                "restore", {"snapshot_id": snap.group(), "session": "b"}
            )
            assert not branch.is_error, text(branch)  # a fork takes its parent's snapshot

            unknown = await client.call_tool("restore", {"snapshot_id": "snapshot-99"})
            assert unknown.is_error and "no snapshot 'snapshot-99'" in text(unknown)
            taken_name = await client.call_tool("fork_session", {"new_session": "b"})
            assert taken_name.is_error and "already exists" in text(taken_name)

    anyio.run(scenario)
