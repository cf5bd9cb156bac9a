"""``kernelexec run --remote URL --token T`` against the real gateways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gateway_servers import Gateway

from kernelexec.cli import main


def test_run_on_a_remote_kernel(
    gateway: Gateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = tmp_path / "message.md"
    message.write_text(
        "```python\nimport os\nx = 6 * 7\n```\n```python\nprint(x, os.getcwd())\n```\n"
    )
    work = tmp_path / "work"
    argv = ["run", str(message), "--json", "--work-dir", str(work), "--timeout", "30"]
    argv += ["--remote", gateway.url, "--token", gateway.token, "--remote-user", "kernelexec"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["output"].strip() == f"42 {work}"  # stateful, and in the work dir


def test_wrong_token_is_a_clear_error(
    gateway: Gateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = tmp_path / "m.py"
    message.write_text("print(1)\n")
    argv = ["run", str(message), "--remote", gateway.url, "--token", "wrong"]
    assert main(argv) == 2
    assert "refused" in capsys.readouterr().err


def test_remote_with_another_executor_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = tmp_path / "m.py"
    message.write_text("print(1)\n")
    argv = ["run", str(message), "--executor", "command", "--remote", "http://127.0.0.1:1"]
    assert main(argv) == 2  # a usage error: one line naming the flag
    err = capsys.readouterr().err
    assert "--remote" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
