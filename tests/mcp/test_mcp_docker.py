"""``kernelexec mcp --executor docker-kernel``: the documented choice for untrusted code."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import anyio
import pytest
from _mcp_client import kinds, stdio_client, text

from kernelexec.backends._docker_options import DEFAULT_IMAGE


def _docker_ready() -> bool:
    if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":
        return True
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "image", "inspect", DEFAULT_IMAGE], capture_output=True, timeout=60
    )
    return probe.returncode == 0


pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not _docker_ready(), reason=f"no Docker engine or {DEFAULT_IMAGE}"),
]


def test_docker_kernel_sessions_over_stdio() -> None:
    async def scenario() -> None:
        async with stdio_client("--executor", "docker-kernel") as client:
            await client.call_tool("upload_file", {"path": "in.txt", "content": "from host"})
            got = await client.call_tool(
                "execute",
                {"code": "data = open('in.txt').read()\nopen('out.txt', 'w').write(data.upper())"},
            )
            assert not got.is_error, text(got)
            assert kinds(got) == ["text", "resource_link"]
            back = await client.call_tool("read_file", {"path": "out.txt"})
            assert text(back) == "FROM HOST"
            kept = await client.call_tool("execute", {"code": "print(data)"})
            assert text(kept).startswith("from host")
            offline = await client.call_tool(
                "execute",
                {"code": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)"},
            )
            assert offline.is_error  # no network in the container

    anyio.run(scenario)


def _container_exists(name: str) -> bool:
    probe = subprocess.run(["docker", "inspect", name], capture_output=True, timeout=60)
    return probe.returncode == 0


def test_a_client_leaving_mid_block_leaves_no_container() -> None:
    containers: list[str] = []

    async def scenario() -> None:
        with anyio.fail_after(120):
            async with stdio_client("--executor", "docker-kernel", "--warm", "0") as client:
                named = await client.call_tool(
                    "execute", {"code": "import socket; print(socket.gethostname())"}
                )
                containers.append(text(named).split()[0])
                assert _container_exists(containers[0])  # the hostname names the container
                started = anyio.Event()

                async def on_progress(value: float, total: float | None, msg: str | None) -> None:
                    if "looping" in (msg or ""):
                        started.set()

                loop = (
                    "import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.05)"
                )
                async with anyio.create_task_group() as tg:
                    tg.start_soon(
                        lambda: client.call_tool(
                            "execute", {"code": loop}, progress_callback=on_progress
                        )
                    )
                    await started.wait()
                    tg.cancel_scope.cancel()  # then the client goes away

    anyio.run(scenario)
    deadline = time.monotonic() + 30
    while _container_exists(containers[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _container_exists(containers[0]), "the container outlived its client"
