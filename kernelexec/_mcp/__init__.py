"""``kernelexec mcp``: kernelexec's sessions served to any MCP client.

``hub`` holds the sessions (an ``AsyncSessionManager`` over a warm kernel pool), ``server`` turns
them into MCP tools with the official ``mcp`` SDK, ``cli`` is the sub-command. Only ``hub`` and
``cli`` import without the ``mcp`` extra.
"""
