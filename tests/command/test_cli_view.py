"""What a person sees of ``kernelexec run``: live output, a section per block, JSON per block."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

TICKS = """```python
import time
print("tick 0", flush=True)
time.sleep(3)
print("tick 1", flush=True)
```"""

FOUR = """```python
print("one")
```
```python
with open("note.txt", "w") as f:
    f.write("hi")
```
```python
1/0
```
```sh
echo never
```"""


def _run(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelexec", "run", "-", "--executor", "command", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("executor", ["command", pytest.param("kernel", marks=pytest.mark.kernel)])
def test_output_is_shown_while_the_block_runs(executor: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelexec", "run", "-", "--executor", executor],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(TICKS)
    proc.stdin.close()
    try:
        lines = []
        while "tick 0" not in (line := proc.stdout.readline()):
            assert line, f"output ended before the first tick: {lines}"
            lines.append(line)
        # The block sleeps 3 s after its first tick: it is still running when the tick shows.
        assert proc.poll() is None
        seen_at = time.monotonic()
        rest = proc.stdout.read()
        assert time.monotonic() - seen_at > 1.0
        assert "tick 1" in rest
    finally:
        proc.stdout.close()
        proc.wait(30)
    assert proc.returncode == 0


def test_each_block_is_its_own_section_and_skipped_blocks_say_why(tmp_path: Path) -> None:
    proc = _run("--work-dir", str(tmp_path), stdin=FOUR)
    assert proc.returncode == 1
    out = proc.stdout
    for n in range(1, 4):
        assert f"block {n} of 4 · " in out
    assert "exit 0 (ok)" in out and "exit 1 (failed)" in out
    assert "saved: note.txt" in out
    assert "ZeroDivisionError" in out
    assert "block 4 of 4 not run: block 3 failed" in out
    assert "never" not in out


def test_json_has_a_result_per_block(tmp_path: Path) -> None:
    proc = _run("--work-dir", str(tmp_path), "--json", stdin=FOUR)
    assert proc.returncode == 1
    document = json.loads(proc.stdout)  # one document, nothing else on stdout
    assert document["exit_code"] == 1
    blocks = document["blocks"]
    assert [b["exit_code"] for b in blocks] == [0, 0, 1, None]  # every block, the 4th not run
    assert [b["status"] for b in blocks] == ["ok", "ok", "failed", "not_run"]
    assert [b["language"] for b in blocks] == ["python"] * 3 + ["shell"]
    assert blocks[0]["output"] == "one\n"
    assert blocks[1]["files"] == [str(tmp_path / "note.txt")]
    assert blocks[2]["error"]["ename"] == "ZeroDivisionError"
    assert all(b["code_file"] for b in blocks[:3])  # stateless blocks are saved, and say where


def test_help_lists_the_executors_and_examples() -> None:
    for args in ([], ["run"]):
        out = subprocess.run(
            [sys.executable, "-m", "kernelexec", *args, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        for name in ("kernel", "command", "docker-kernel", "docker-command", "gateway"):
            assert f"\n  {name} " in out
        assert "examples:" in out and "kernelexec run message.md" in out


def test_a_block_after_a_timed_out_one_is_not_run_and_says_why(tmp_path: Path) -> None:
    blocks = '```python\nprint("start")\n```\n```python\nimport time; time.sleep(30)\n```\n'
    blocks += '```python\nprint("never")\n```'
    proc = _run("--work-dir", str(tmp_path), "--timeout", "2", stdin=blocks)
    assert proc.returncode == 124, proc.stdout + proc.stderr
    assert "block 3 of 3 not run: block 2 timed out" in proc.stdout
    assert "never" not in proc.stdout
