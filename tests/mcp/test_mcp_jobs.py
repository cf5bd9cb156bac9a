"""Detached blocks over MCP (streamable HTTP, a real kernel): ``execute`` with ``detach``,
``job_status``, ``job_output`` from an offset, ``job_cancel``; a job outlives the connection
that started it. Blocks wait on gate files, not sleeps."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from _mcp_client import text
from mcp import Client
from test_mcp_http import http_server

pytestmark = pytest.mark.kernel

GATED = """\
import os, time
for i in range(3):
    print('tick', i, flush=True)
while not os.path.exists({gate!r}):
    time.sleep(0.02)
print('finished')
"""


async def _call(client: Client, tool: str, **args: Any) -> str:
    return text(await client.call_tool(tool, args))


async def _status(client: Client, job: str) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(await _call(client, "job_status", job=job))
    return state


async def _until_status(client: Client, job: str, wanted: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        state = await _status(client, job)
        if state["status"] == wanted:
            return state
        assert time.monotonic() < deadline, state
        await anyio.sleep(0.05)


def test_detached_jobs_outlive_the_connection(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with http_server() as url:

        async def scenario() -> None:
            async with Client(url) as client:
                await _call(client, "execute", code="z = 5")
                started = time.monotonic()
                answer = await _call(
                    client, "execute", code=GATED.format(gate=str(gate)), detach=True
                )
                assert time.monotonic() - started < 20  # returned without waiting for the block
                job = json.loads(answer.splitlines()[0])["job"]
                assert job.startswith("job-")
                queued = json.loads(
                    (
                        await _call(client, "execute", code="z += 1; print(z)", detach=True)
                    ).splitlines()[0]
                )
                assert queued["status"] == "queued" and queued["position"] == 1
                deadline = time.monotonic() + 60
                while "tick 2" not in await _call(client, "job_output", job=job):
                    assert time.monotonic() < deadline
                    await anyio.sleep(0.05)
            # The client is gone; the job is not. Another connection reads it by id.
            async with Client(url) as client:
                assert (await _status(client, job))["status"] == "running"
                first = await _call(client, "job_output", job=job)
                assert "tick 0" in first and "tick 2" in first and "running" in first
                offset = int(re.findall(r"next offset (\d+)", first)[-1])
                gate.touch()
                done = await _until_status(client, job, "done")
                assert done["exit_code"] == 0 and done["result"] == "ok"
                rest = await _call(client, "job_output", job=job, offset=offset)
                assert "finished" in rest and "tick" not in rest
                second = await _until_status(client, queued["job"], "done")
                assert second["exit_code"] == 0
                assert "6" in await _call(client, "job_output", job=queued["job"])

                # cancel: interrupted, the session's state kept; twice changes nothing
                loop = "print('looping', flush=True)\nimport time\nwhile True: time.sleep(0.05)"
                answer = await _call(client, "execute", code=loop, detach=True)
                stuck = json.loads(answer.splitlines()[0])["job"]
                while "looping" not in await _call(client, "job_output", job=stuck):
                    await anyio.sleep(0.05)
                cancelled = await _call(client, "job_cancel", job=stuck)
                assert "now cancelled" in cancelled and "state is kept" in cancelled
                again = await _call(client, "job_cancel", job=stuck)
                assert "was cancelled; now cancelled" in again
                assert (await _status(client, stuck))["status"] == "cancelled"
                assert "cancelled" in await _call(client, "job_output", job=stuck)
                assert (await _call(client, "execute", code="print(z)")).startswith("6")

                # bad input: a tool error the model reads
                unknown = await client.call_tool("job_status", {"job": "job-nope"})
                assert unknown.is_error and "no job 'job-nope'" in text(unknown)
                bad = await client.call_tool("job_output", {"job": job, "offset": -1})
                assert bad.is_error and "offset" in text(bad)

        anyio.run(scenario)
