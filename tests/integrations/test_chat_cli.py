"""`kernelexec chat` as a person meets it: the transcript kept by default, and a model server
that is down or refuses the key reported in one line (no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .test_agent_openai import ScriptedServer

pytest.importorskip("openai", reason="the openai extra is part of the dev extra")


def _chat(base_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kernelexec", "chat", "What is 6 * 7?", "--model", "m"]
    return subprocess.run(
        [*command, "--base-url", base_url, "--yes", "--executor", "command", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def refusing_server() -> Iterator[str]:
    """A chat-completions server that answers every request with 401."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"error": {"message": "Incorrect API key", "type": "auth"}})
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def _unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_is_one_clear_line() -> None:
    proc = _chat(f"http://127.0.0.1:{_unused_port()}/v1")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelexec: cannot reach the model server")


def test_refused_key_is_one_clear_line(refusing_server: str) -> None:
    proc = _chat(refusing_server)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the API key" in lines[0]


def test_transcript_is_saved_in_the_work_dir_by_default(tmp_path: Path) -> None:
    server = ScriptedServer(["```python\nprint(6 * 7)\n```", "It is 42. TERMINATE"])
    try:
        proc = _chat(server.base_url, "--work-dir", str(tmp_path))
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    transcript = tmp_path / "chat.ipynb"
    assert f"Transcript saved to {transcript}" in proc.stdout
    nb = nbformat.read(transcript, as_version=4)
    nbformat.validate(nb)
    assert any(
        "42" in o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )


def test_no_key_and_no_server_is_one_clear_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    command = [sys.executable, "-m", "kernelexec", "chat", "What is 6 * 7?", "--model", "m"]
    proc = subprocess.run(
        [*command, "--yes", "--executor", "command"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "set OPENAI_API_KEY" in lines[0], proc.stderr
