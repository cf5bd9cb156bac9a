"""The command line as a person meets it (issue 34): the temp work dir named and kept when
anything was made, every block in ``--json``, one-line usage errors, a closed stdout, a
transcript for ``run``. Real ``python -m kernelexec`` processes with a private TMPDIR, so
what a run leaves behind can be listed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.command

THREE = """```python
print("one")
```
```python
open("made.txt", "w").write("x")
1 / 0
```
```python
print("never")
```
"""


def kx(
    *args: str, tmp: Path, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run(
        [sys.executable, "-m", "kernelexec", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
    )


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    private = tmp_path / "tmp"
    private.mkdir()
    return private


def test_run_names_its_temp_folder_and_keeps_it_when_files_were_made(tmp: Path) -> None:
    proc = kx("run", "-", "--executor", "command", tmp=tmp, stdin=THREE)
    assert proc.returncode == 1, proc.stderr
    [work] = list(tmp.iterdir())
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"kernelexec: work dir {work} ")  # absolute, before anything
    assert lines[-1] == f"kernelexec: files kept in {work}"
    assert (work / "made.txt").read_text() == "x"
    assert "saved: made.txt" in proc.stdout


def test_run_removes_its_temp_folder_when_nothing_was_made(tmp: Path) -> None:
    proc = kx("run", "-", "--executor", "command", tmp=tmp, stdin='```py\nprint("hi")\n```')
    assert proc.returncode == 0, proc.stderr
    assert list(tmp.iterdir()) == []
    assert "nothing was made: removed" in proc.stderr


def test_json_lists_every_block_with_its_status(tmp: Path) -> None:
    message = THREE.replace('print("never")', 'print("never")\n```\n```klingon\nQapla\'')
    proc = kx("run", "-", "--executor", "command", "--json", tmp=tmp, stdin=message)
    assert proc.returncode == 1, proc.stderr
    document = json.loads(proc.stdout)
    blocks = document["blocks"]
    assert [b["index"] for b in blocks] == [1, 2, 3, 4]
    assert [b["status"] for b in blocks] == ["ok", "failed", "not_run", "not_run"]
    assert blocks[0]["reason"] is None
    assert "ZeroDivisionError" in blocks[1]["reason"]
    assert blocks[2]["reason"] == blocks[3]["reason"] == "block 2 failed"
    assert blocks[2]["code"] == 'print("never")'
    assert document["work_dir"] == str(next(tmp.iterdir()))


def test_json_says_why_a_refused_block_and_a_timed_out_one_did_not_finish(tmp: Path) -> None:
    message = "```klingon\nQapla'\n```\n"
    proc = kx("run", "-", "--executor", "command", "--json", tmp=tmp, stdin=message)
    [block] = json.loads(proc.stdout)["blocks"]
    assert block["status"] == "not_run" and "klingon" in block["reason"]
    message = "```python\nimport time; time.sleep(30)\n```\n```python\nprint(2)\n```\n"
    proc = kx(
        "run", "-", "--executor", "command", "--json", "--timeout", "1", tmp=tmp, stdin=message
    )
    assert proc.returncode == 124
    first, second = json.loads(proc.stdout)["blocks"]
    assert first["status"] == "timed_out" and "1 s" in first["reason"]
    expected = {"index": 2, "language": "python", "code": "print(2)", "exit_code": None}
    expected |= {"status": "not_run", "reason": "block 1 timed out", "not_run": True}
    assert second.items() >= expected.items()
    assert second.keys() == first.keys()  # the same shape as a block that ran


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["run", "-", "--executor", "gateway"], "--remote URL"),
        (["repl", "--executor", "gateway"], "--remote URL"),
        (["run", "-", "--executor", "provisioned-kernel"], "--kernelspec NAME"),
        (["run", "-", "--executor", "command", "--remote", "http://127.0.0.1:9"], "--executor"),
        (["notebook", "run", "x.ipynb", "--executor", "command"], "--executor"),
        (["chat", "hi", "--model", "m", "--executor", "gateway"], "--remote URL"),
    ],
)
def test_usage_errors_are_one_line_naming_the_flag(tmp: Path, args: list[str], flag: str) -> None:
    proc = kx(*args, tmp=tmp, stdin="```py\nprint(1)\n```")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("kernelexec: "), proc.stderr
    assert flag in proc.stderr
    assert "Error" not in proc.stderr and "Executor" not in proc.stderr  # no class names
    assert list(tmp.iterdir()) == []  # refused before any folder was made


MANY = "".join(f'```python\nprint("{n}" * 5000)\n```\n' for n in range(6))


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_closed_stdout_stops_the_run_with_one_line(tmp: Path, json_flag: list[str]) -> None:
    """``kernelexec run ... | head -1``: the reader goes away; no traceback, nothing left."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    command = [sys.executable, "-m", "kernelexec", "run", "-", "--executor", "command"]
    proc = subprocess.Popen(
        [*command, *json_flag],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # as `head` does once it has its line
    _, err = proc.communicate(MANY, timeout=60)
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    last = err.splitlines()[-1]
    assert last.startswith("kernelexec: the output was closed by its reader after block ")
    if not json_flag:  # the human view stops at once: the blocks after the first never ran
        assert last.endswith("after block 1 of 6; blocks 2-6 were not run")
    assert list(tmp.iterdir()) == []


def test_run_saves_a_transcript_notebook(tmp: Path, tmp_path: Path) -> None:
    transcript = tmp_path / "out.ipynb"
    proc = kx(
        "run", "-", "--executor", "command", "--notebook", str(transcript), tmp=tmp, stdin=THREE
    )
    assert proc.returncode == 1
    assert f"transcript saved to {transcript}" in proc.stderr
    nb = nbformat.read(transcript, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.source for c in cells] == [
        'print("one")',
        THREE.split("```")[3][len("python\n") : -1],
    ]
    assert cells[0].outputs[0]["text"] == "one\n"
    assert cells[1].outputs[-1]["ename"] == "ZeroDivisionError"
