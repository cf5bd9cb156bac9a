"""The MCP tests need the ``mcp`` extra; without it they are not collected."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("mcp") is None:
    collect_ignore_glob = ["test_*.py"]
