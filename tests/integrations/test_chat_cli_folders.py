"""`kernelexec chat` leaves no empty temp folder behind when it fails, and keeps its folder
(with the transcript) when it ran (issue 34, item 3). A private TMPDIR lists what is left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_agent_openai import ScriptedServer
from .test_chat_cli import _unused_port

pytest.importorskip("openai", reason="the openai extra is part of the dev extra")


def _chat(tmp: Path, *extra: str, key: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if key or k != "OPENAI_API_KEY"}
    env["TMPDIR"] = str(tmp)
    command = [sys.executable, "-m", "kernelexec", "chat", "What is 6 * 7?", "--model", "m"]
    return subprocess.run(
        [*command, "--yes", "--executor", "command", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("how", ["unreachable", "no key"])
def test_a_failed_chat_leaves_no_empty_folder(tmp_path: Path, how: str) -> None:
    if how == "unreachable":
        proc = _chat(tmp_path, "--base-url", f"http://127.0.0.1:{_unused_port()}/v1")
    else:
        proc = _chat(tmp_path, key=False)
    assert proc.returncode == 2, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_chat_that_ran_keeps_its_folder_and_transcript(tmp_path: Path) -> None:
    server = ScriptedServer(["```python\nprint(6 * 7)\n```", "It is 42. TERMINATE"])
    try:
        proc = _chat(tmp_path, "--base-url", server.base_url)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    [folder] = tmp_path.iterdir()
    assert f"Transcript saved to {folder / 'chat.ipynb'}" in proc.stdout
    assert (folder / "chat.ipynb").is_file()
