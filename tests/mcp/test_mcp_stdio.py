"""``kernelexec mcp`` over stdio, driven by the MCP SDK's own client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from _mcp_client import ROOT, kinds, stdio_client, text

pytestmark = pytest.mark.kernel

TOOLS = {
    "execute",
    "list_sessions",
    "restart",
    "interrupt",
    "close_session",
    "upload_file",
    "read_file",
    "list_files",
    "job_status",
    "job_output",
    "job_cancel",
    "fork_session",
    "snapshot",
    "restore",
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_state_images_files_and_sessions() -> None:
    async def scenario() -> None:
        async with stdio_client() as client:
            listed = await client.list_tools()
            assert {tool.name for tool in listed.tools} == TOOLS

            first = await client.call_tool("execute", {"code": "x = 41\nprint(x + 1)"})
            assert not first.is_error and text(first).startswith("42")
            again = await client.call_tool("execute", {"code": "print(x)"})
            assert text(again).startswith("41")  # state kept across calls

            plot = (
                "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n"
                "open('table.csv', 'w').write('a,b\\n1,2\\n')"
            )
            drawn = await client.call_tool("execute", {"code": plot})
            assert kinds(drawn) == ["text", "image", "resource_link"]
            assert drawn.content[1].mime_type == "image/png"  # type: ignore[union-attr]
            assert drawn.content[2].uri.endswith("table.csv")  # type: ignore[union-attr]

            failed = await client.call_tool("execute", {"code": "1 / 0"})
            assert failed.is_error and "ZeroDivisionError" in text(failed)

            other = await client.call_tool("execute", {"code": "print(x)", "session": "b"})
            assert "NameError" in text(other)  # sessions do not share state
            sessions = json.loads(text(await client.call_tool("list_sessions", {})))["sessions"]
            assert {s["session"] for s in sessions} == {"default", "b"}
            assert sessions[0]["work_dir"] != sessions[1]["work_dir"]

            closed = await client.call_tool("close_session", {"session": "b"})
            assert not closed.is_error
            gone = await client.call_tool("restart", {"session": "b"})
            assert gone.is_error and "no session named 'b'" in text(gone)
            assert "Sessions: default" in text(gone)

            await client.call_tool("restart", {})
            wiped = await client.call_tool("execute", {"code": "print(x)"})
            assert "NameError" in text(wiped)

    anyio.run(scenario)


def test_file_tools_are_confined_to_the_work_dir() -> None:
    async def scenario() -> None:
        async with stdio_client() as client:
            up = await client.call_tool("upload_file", {"path": "in/data.txt", "content": "héllo"})
            assert not up.is_error, text(up)
            seen = await client.call_tool(
                "execute", {"code": "print(open('in/data.txt', encoding='utf-8').read())"}
            )
            assert text(seen).startswith("héllo")
            read = await client.call_tool("read_file", {"path": "in/data.txt"})
            assert text(read) == "héllo"
            png = (
                "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAA"
                "AABJRU5ErkJggg=="
            )
            await client.call_tool(
                "upload_file", {"path": "dot.png", "content": png, "encoding": "base64"}
            )
            assert kinds(await client.call_tool("read_file", {"path": "dot.png"})) == ["image"]
            files = json.loads(text(await client.call_tool("list_files", {})))["files"]
            paths = {f["path"] for f in files}
            assert {"in/data.txt", "dot.png", "session.ipynb"} <= paths  # the session notebook
            notebook = json.loads(
                text(await client.call_tool("read_file", {"path": "session.ipynb"}))
            )
            sources = ["".join(cell["source"]) for cell in notebook["cells"]]
            assert any("in/data.txt" in source for source in sources)  # the blocks run so far

            for bad in ("../outside.txt", "/etc/passwd", "in/../../x", "~/x"):
                refused = await client.call_tool("upload_file", {"path": bad, "content": "x"})
                assert refused.is_error, bad
                refused = await client.call_tool("read_file", {"path": bad})
                assert refused.is_error, bad
            link = await client.call_tool(
                "execute", {"code": "import os; os.symlink('/etc', 'etc_link')"}
            )
            assert not link.is_error
            escaped = await client.call_tool("read_file", {"path": "etc_link/hostname"})
            assert escaped.is_error and "escapes" in text(escaped)
            unknown = await client.call_tool("read_file", {"path": "x", "session": "nope"})
            assert unknown.is_error and "no session named 'nope'" in text(unknown)

    anyio.run(scenario)


def test_timeout_keeps_the_session_and_progress_is_reported() -> None:
    async def scenario() -> None:
        async with stdio_client() as client:
            await client.call_tool("execute", {"code": "kept = 7"})
            progress: list[tuple[float, str | None]] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append((value, message))

            code = (
                "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n"
                "    time.sleep(1)"
            )
            ticked = await client.call_tool(
                "execute", {"code": code}, progress_callback=on_progress
            )
            assert not ticked.is_error
            assert progress, "no progress notification for a 3 s block"
            assert any("tick" in (message or "") for _, message in progress)

            slow = await client.call_tool(
                "execute", {"code": "import time; time.sleep(30)", "timeout": 1}
            )
            assert slow.is_error and "timed out" in text(slow)
            after = await client.call_tool("execute", {"code": "print(kept)"})
            assert text(after).startswith("7")
            # A zero timeout is refused as the library refuses it, not read as "the default".
            zero = await client.call_tool("execute", {"code": "print('ran')", "timeout": 0})
            assert zero.is_error and "timeout must be a positive" in text(zero), text(zero)

    anyio.run(scenario)


def test_a_culled_session_says_so_then_starts_afresh() -> None:
    async def scenario() -> None:
        async with stdio_client("--idle-timeout", "1") as client:
            await client.call_tool("execute", {"code": "y = 1", "session": "s"})
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                sessions = json.loads(text(await client.call_tool("list_sessions", {})))
                if not sessions["sessions"]:
                    break
                await anyio.sleep(0.5)
            culled = await client.call_tool("execute", {"code": "print(y)", "session": "s"})
            assert culled.is_error
            assert "closed after 1 s idle" in text(culled), text(culled)
            fresh = await client.call_tool("execute", {"code": "print(y)", "session": "s"})
            assert "NameError" in text(fresh)  # a new session, without the old state

    anyio.run(scenario)


def test_a_cancelled_call_interrupts_its_block_and_keeps_the_session(tmp_path: Path) -> None:
    marker = tmp_path / "running"
    code = (
        f"import time, pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        "while True:\n    time.sleep(0.05)"
    )

    async def scenario() -> None:
        async with stdio_client() as client:
            await client.call_tool("execute", {"code": "kept = 3"})
            with anyio.move_on_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "execute", {"code": code})
                    while not marker.exists():
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()  # the client gives up on the call
            assert marker.exists()
            started = time.monotonic()
            after = await client.call_tool("execute", {"code": "print(kept)"})
            assert text(after).startswith("3")
            assert time.monotonic() - started < 30  # the loop was interrupted, not waited out

    anyio.run(scenario)


def test_the_interrupt_tool_stops_a_block_and_keeps_state(tmp_path: Path) -> None:
    marker = tmp_path / "running"
    code = (
        f"import time, pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        "while True:\n    time.sleep(0.05)"
    )

    async def scenario() -> None:
        async with stdio_client("--max-sessions", "2") as client:
            idle = await client.call_tool("interrupt", {})
            assert idle.is_error and "no session named 'default'" in text(idle)
            await client.call_tool("execute", {"code": "kept = 9"})
            assert "No block is running" in text(await client.call_tool("interrupt", {}))
            results = []

            async def run() -> None:
                results.append(await client.call_tool("execute", {"code": code}))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run)
                    while not marker.exists():
                        await anyio.sleep(0.05)
                    stopped = await client.call_tool("interrupt", {})
                    assert text(stopped) == "Interrupted."
            assert results[0].is_error and "KeyboardInterrupt" in text(results[0])
            assert text(await client.call_tool("execute", {"code": "print(kept)"})).startswith("9")

            await client.call_tool("execute", {"code": "1", "session": "second"})
            full = await client.call_tool("execute", {"code": "1", "session": "third"})
            assert full.is_error and "maximum of 2 sessions" in text(full)
            assert "Sessions: default, second" in text(full)

            marker.unlink()
            with anyio.fail_after(60):  # closing a session does not wait for its running block
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run)
                    while not marker.exists():
                        await anyio.sleep(0.05)
                    closed = await client.call_tool("close_session", {})
                    assert not closed.is_error, text(closed)
            assert "KeyboardInterrupt" in text(results[1])

    anyio.run(scenario)


def test_the_command_executor_runs_each_block_afresh(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    loop = (
        f"import os, time, pathlib\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        "while True:\n    time.sleep(0.05)"
    )

    async def scenario() -> None:
        async with stdio_client("--executor", "command") as client:
            first = await client.call_tool("execute", {"code": "x = 1\nprint('one')"})
            assert text(first).startswith("one")
            second = await client.call_tool("execute", {"code": "print(x)"})
            assert "NameError" in text(second)  # a process per block: no state
            shell = await client.call_tool("execute", {"code": "echo hi", "language": "sh"})
            assert text(shell).startswith("hi")

            results = []

            async def run() -> None:
                results.append(await client.call_tool("execute", {"code": loop}))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run)
                    while not pid_file.exists() or not pid_file.read_text():
                        await anyio.sleep(0.05)
                    stopped = await client.call_tool("interrupt", {})
                    assert text(stopped) == "Interrupted.", text(stopped)
            assert results[0].is_error and "process was stopped" in text(results[0])
            pid, deadline = int(pid_file.read_text()), time.monotonic() + 30
            while _alive(pid) and time.monotonic() < deadline:
                await anyio.sleep(0.1)
            assert not _alive(pid), "the block's process outlived the interrupt"
            after = await client.call_tool("execute", {"code": "print('next')"})
            assert text(after).startswith("next")

    anyio.run(scenario)


def test_cli_refuses_an_unknown_executor() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "kernelexec", "mcp", "--executor", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert "unknown executor 'nope'" in refused.stderr and "docker-kernel" in refused.stderr


def test_a_client_that_leaves_mid_block_leaves_nothing_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = (
        f"import os, time, pathlib\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        "while True:\n    time.sleep(0.05)"
    )

    async def scenario() -> None:
        with anyio.move_on_after(60):
            async with stdio_client() as client, anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "execute", {"code": code})
                while not pid_file.exists():
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()

    anyio.run(scenario)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the kernel outlived its client"


def test_nothing_but_protocol_on_stdout() -> None:
    """A block writing to fd 1 (directly and from a child process) cannot corrupt the stream."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelexec", "mcp"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    code = (
        "import os, subprocess, sys\nos.write(1, b'LEAK-FD\\n')\n"
        "subprocess.run('echo LEAK-CHILD', shell=True)\nprint('ok')"
    )
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": code}},
        },
    ]
    try:
        for message in messages:
            proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        lines = []
        while True:
            line = proc.stdout.readline()
            assert line, "the server closed stdout before answering"
            lines.append(line)
            if json.loads(line).get("id") == 2:
                break
        proc.stdin.close()
        rest = proc.stdout.read()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if not proc.stdin.closed:
            proc.stdin.close()
    for line in [*lines, *rest.splitlines()]:  # every line a JSON-RPC message, nothing else
        assert json.loads(line)["jsonrpc"] == "2.0", line
    reply = json.loads(lines[-1])["result"]["content"][0]["text"]
    assert "LEAK-FD" in reply and "ok" in reply  # the block's output is in the result instead
    assert proc.returncode == 0


def test_the_parser_lists_mcp_without_loading_the_sdk() -> None:
    probe = (
        "import sys\nfrom kernelexec.cli import build_parser\n"
        "build_parser().parse_args(['mcp', '--http'])\n"
        "print(sorted(m for m in ('mcp', 'uvicorn', 'jupyter_client') if m in sys.modules))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "[]"


def test_no_charts_leaves_the_chart_documents_out() -> None:
    plot = "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()"

    async def scenario() -> None:
        for flags, said in (((), "[chart: line"), (("--no-charts",), "[image/png saved to")):
            async with stdio_client("--executor", "command", *flags) as client:
                result = await client.call_tool("execute", {"code": plot})
                assert text(result).startswith(said), text(result)

    anyio.run(scenario)
