"""``kernelexec run`` (the kernel is the default executor) and ``kernelexec repl``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from kernelexec import KernelExecutor
from kernelexec._repl import render, run_repl, split_blocks
from kernelexec.cli import DEFAULT_EXECUTOR, build_parser


def kx(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelexec", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_kernel_is_the_default_executor() -> None:
    assert DEFAULT_EXECUTOR == "kernel"
    assert build_parser().parse_args(["run", "x.md"]).executor == "kernel"


def test_run_keeps_state_between_blocks_of_a_message(tmp_path: Path) -> None:
    message = "```python\nx = 20\n```\n\nthen\n\n```python\nprint(x + 22)\n```\n"
    proc = kx("run", "-", "--json", "--work-dir", str(tmp_path), stdin=message)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["output"].strip() == "42"  # the second block saw the first's variable


def test_run_mirrors_the_exit_code(tmp_path: Path) -> None:
    proc = kx("run", "-", "--executor", "kernel", "--work-dir", str(tmp_path),
              stdin="```python\n1/0\n```\n")  # fmt: skip
    assert proc.returncode == 1
    assert "ZeroDivisionError" in proc.stdout


def test_repl_keeps_state_from_piped_stdin(tmp_path: Path) -> None:
    script = "x = 41\n\nx + 1\n;;\ndef f():\n    return 'in f'\n\nprint(f())\n1/0\n"
    proc = kx("repl", "--work-dir", str(tmp_path), stdin=script)
    lines = proc.stdout.splitlines()
    assert lines[0] == "42"
    assert "in f" in lines
    assert "[exit code 1]" in lines
    assert proc.returncode == 1  # a block failed


def test_piped_repl_status_is_the_sessions_not_the_last_blocks(tmp_path: Path) -> None:
    proc = kx("repl", "--work-dir", str(tmp_path), stdin="1/0\n\nprint('after')\n")
    assert "after" in proc.stdout.splitlines()
    assert proc.returncode == 1  # the failure earlier in the session is not forgotten


def test_split_blocks() -> None:
    lines = ["a = 1\n", "\n", "b = 2\n", "c = 3\n", ";;\n", "\n", "d\n"]
    assert list(split_blocks(lines)) == ["a = 1\n", "b = 2\nc = 3\n", "d\n"]
    kept = list(split_blocks(["a\n", "\n", "b\n", ";;\n", "c\n"], separator_only=True))
    assert kept == ["a\n\nb\n", "c\n"]


def test_run_repl_in_process(tmp_path: Path) -> None:
    out = io.StringIO()
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        status = run_repl(ex, io.StringIO("open('f.txt','w').write('x')\n\n'ok'\n"), out)
    assert status == 0
    text = out.getvalue()
    assert "Files: " in text and "f.txt" in text
    assert text.rstrip().endswith("'ok'")


def test_render_marks_failures() -> None:
    from kernelexec import ExecutionResult

    assert render(ExecutionResult(exit_code=124, output="slow")) == "slow\n[exit code 124]"
    assert render(ExecutionResult(exit_code=0, output="")) == ""


def test_an_untagged_command_line_runs_as_shell_on_a_kernel_and_a_command_executor(
    tmp_path: Path,
) -> None:
    """``ls -la | head -2`` is valid Python: a kernel ran it through IPython's automagic and
    a command executor failed with NameError. One detector now makes it shell on both."""
    (tmp_path / "a.txt").write_text("x")
    outputs = []
    for executor in ("kernel", "command"):
        proc = kx(
            "run", "-", "--json", "--executor", executor, "--work-dir", str(tmp_path),
            stdin="```\nls -la | head -2\n```\n",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [block] = json.loads(proc.stdout)["blocks"]
        assert block["language"] == "shell"
        outputs.append(block["output"].splitlines())
    for lines in outputs:
        assert len(lines) == 2 and lines[0].startswith("total ")
