"""The MCP ``execute`` tool with ``language``: R and TypeScript blocks in the session's kernels."""

from __future__ import annotations

import anyio
import pytest
from _mcp_client import kinds, stdio_client, text
from kx_languages import need_kernels

pytestmark = pytest.mark.kernel


def test_execute_runs_r_and_typescript_in_one_session_beside_python() -> None:
    need_kernels("r", "javascript")

    async def scenario() -> None:
        async with stdio_client() as client:
            wrote = await client.call_tool(
                "execute", {"code": "open('n.txt', 'w').write('21')", "language": "python"}
            )
            assert not wrote.is_error
            plot = "n <- as.numeric(readLines('n.txt', warn = FALSE))\nplot(1:n)\ncat(n * 2)"
            drawn = await client.call_tool("execute", {"code": plot, "language": "r"})
            assert not drawn.is_error and text(drawn).startswith("42"), text(drawn)
            assert "image" in kinds(drawn)
            kept = await client.call_tool("execute", {"code": "cat(n)", "language": "r"})
            assert text(kept).startswith("21")  # R's state kept across calls
            typed = await client.call_tool(
                "execute", {"code": "const m: number = 6 * 7; console.log(m)", "language": "ts"}
            )
            assert text(typed).startswith("42")
            failed = await client.call_tool("execute", {"code": "stop('nope')", "language": "r"})
            assert failed.is_error and "nope" in text(failed)

    anyio.run(scenario)
