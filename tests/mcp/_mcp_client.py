"""Starting ``kernelexec mcp`` the way an MCP client does: a process spoken to with the SDK."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, TextContent

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose kernelexec is under test


def stdio_params(*args: str) -> StdioServerParameters:
    """``python -m kernelexec mcp ARGS`` run from this checkout, over stdio."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernelexec", "mcp", *args],
        cwd=str(ROOT),
        env=server_env(),
    )


def server_env() -> dict[str, str]:
    """The SDK gives a server only a few variables; pass on what the back ends read too."""
    passed = {k: v for k, v in os.environ.items() if k.startswith(("DOCKER_", "KERNELEXEC_"))}
    return {**passed, "PYTHONPATH": str(ROOT)}


def stdio_client(*args: str) -> Client:
    return Client(stdio_params(*args), read_timeout_seconds=120)


def text(result: CallToolResult) -> str:
    """The text blocks of a tool result, joined."""
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


def kinds(result: CallToolResult) -> list[Any]:
    return [block.type for block in result.content]
