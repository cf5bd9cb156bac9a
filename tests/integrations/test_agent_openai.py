"""The OpenAI-compatible writer and `kernelexec chat`, against a scripted server on loopback
(the shape of the chat-completions API that OpenAI, Ollama and vLLM serve). No real LLM."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernelexec import CommandLineExecutor, cli
from kernelexec.agent import OpenAIChatModel, run_chat

from . import _fixtures as flows

pytest.importorskip("openai", reason="the openai extra is installed in CI (.ci/extras.sh)")


class ScriptedServer:
    """Answers POST /v1/chat/completions with the next scripted reply; records the requests."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path != "/v1/chat/completions" or not server.replies:
                    self.send_response(404)
                    self.end_headers()
                    return
                payload = json.dumps(_completion(body["model"], server.replies.pop(0))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer([flows.FIB, "377. TERMINATE"])
    try:
        yield srv
    finally:
        srv.close()


def test_openai_model_talks_to_the_configured_base_url(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = OpenAIChatModel("tiny-coder", base_url=server.base_url, temperature=0)
    try:
        with CommandLineExecutor(timeout=30) as executor:
            chat = run_chat("fib 14", model=model, executor=executor)
    finally:
        model.close()
    assert chat.stop_reason == "terminate"
    assert chat.turns[0].result is not None and chat.turns[0].result.output.strip() == "377"
    first, second = server.requests
    assert first["model"] == "tiny-coder" and first["temperature"] == 0
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert "377" in second["messages"][-1]["content"]
    # No key in the environment: a placeholder is sent, as local servers expect.
    assert server.headers[0]["authorization"] == "Bearer unused"


def test_cli_chat(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    notebook = tmp_path / "chat.ipynb"
    status = cli.main(
        [
            "chat",
            "What is the 14th Fibonacci number?",
            "--model",
            "tiny-coder",
            "--base-url",
            server.base_url,
            "--yes",
            "--notebook",
            str(notebook),
            "--work-dir",
            str(tmp_path / "work"),
            "--timeout",
            "30",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "exitcode: 0 (execution succeeded)\nCode output: 377" in out
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    assert any(
        "377" in o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )


def test_cli_chat_without_yes_asks_and_refuses_on_no_input(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal: end of input
    status = cli.main(
        ["chat", "fib", "--model", "m", "--base-url", server.base_url, "--work-dir", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "Run this code? [y/N]" in out and "Execution refused" in out
    assert not list(tmp_path.glob("tmp_code_*"))  # nothing was written or run
