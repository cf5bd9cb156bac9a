"""``kernelexec mcp --http``: streamable HTTP on 127.0.0.1, a bearer token off it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from _mcp_client import ROOT, text
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

pytestmark = pytest.mark.kernel


@contextmanager
def http_server(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``kernelexec mcp --http --port 0 ARGS``; yields its URL once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelexec", "mcp", "--http", "--port", "0", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stderr is not None
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "the server never said where it listens"
        yield url
    finally:
        proc.terminate()  # SIGTERM: the server closes its sessions and kernels
        try:
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()


def test_http_on_localhost_keeps_state_and_cancels_blocks(tmp_path: Path) -> None:
    marker = tmp_path / "running"
    loop = (
        f"import time, pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        "while True:\n    time.sleep(0.05)"
    )
    with http_server() as url:
        assert url.startswith("http://127.0.0.1:")

        async def scenario() -> None:
            async with Client(url) as client:
                await client.call_tool("execute", {"code": "z = 5"})
                got = await client.call_tool("execute", {"code": "print(z * 2)"})
                assert text(got).startswith("10")
                with anyio.move_on_after(60):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(client.call_tool, "execute", {"code": loop})
                        while not marker.exists():
                            await anyio.sleep(0.05)
                        tg.cancel_scope.cancel()
                started = time.monotonic()
                after = await client.call_tool("execute", {"code": "print(z)"})
                assert text(after).startswith("5")
                assert time.monotonic() - started < 30  # the loop was interrupted

            marker.unlink()
            with anyio.move_on_after(60):  # a client that leaves mid-block
                async with Client(url) as client, anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "execute", {"code": loop})
                    while not marker.exists():
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()
            async with Client(url) as client:  # sessions belong to the server, not a connection
                started = time.monotonic()
                after = await client.call_tool("execute", {"code": "print(z + 1)"})
                assert text(after).startswith("6")
                assert time.monotonic() - started < 30  # nothing was left running

        anyio.run(scenario)


def test_binding_beyond_localhost_needs_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KERNELEXEC_MCP_TOKEN"}
    refused = subprocess.run(
        [sys.executable, "-m", "kernelexec", "mcp", "--http", "--host", "0.0.0.0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert refused.returncode == 2
    assert "without a bearer token" in refused.stderr


def test_a_token_is_required_when_set() -> None:
    token = "s3cret-token"
    with http_server("--host", "0.0.0.0", env={"KERNELEXEC_MCP_TOKEN": token}) as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        local = f"http://127.0.0.1:{port}/mcp"
        with httpx2.Client() as plain:
            denied = plain.post(local, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert denied.status_code == 401
            wrong = plain.post(
                local,
                json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                headers={"Authorization": "Bearer nope"},
            )
            assert wrong.status_code == 401

        async def scenario() -> None:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            async with http, Client(streamable_http_client(local, http_client=http)) as client:
                got = await client.call_tool("execute", {"code": "print(6 * 7)"})
                assert text(got).startswith("42")

        anyio.run(scenario)
