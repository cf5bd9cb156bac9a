"""Whether the other languages' kernels (IRkernel, Deno, bash_kernel) and interpreters are here.

Tests that need them skip when they are missing, and fail instead under
``KERNELEXEC_REQUIRE_LANGUAGES=1`` (CI's ``.ci/languages.sh`` sets it once it installed them).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from kernelexec import ExecutionResult, KernelExecutor

KERNELS = {"r": "ir", "javascript": "deno", "bash": "bash"}
PROGRAMS = {"r": "Rscript", "javascript": "deno"}


def missing_kernels(*languages: str) -> list[str]:
    installed = KernelSpecManager().find_kernel_specs()
    return [KERNELS[lang] for lang in languages if KERNELS[lang] not in installed]


def need_kernels(*languages: str) -> None:
    """Skip (or fail, when required) unless these languages' kernelspecs are installed."""
    _need(missing_kernels(*languages), "kernelspecs")


def need_programs(*languages: str) -> None:
    _need([PROGRAMS[lang] for lang in languages if not shutil.which(PROGRAMS[lang])], "programs")


def _need(missing: list[str], what: str) -> None:
    if not missing:
        return
    why = f"{what} not installed: {', '.join(missing)} (see .ci/languages.sh)"
    if os.environ.get("KERNELEXEC_REQUIRE_LANGUAGES") == "1":
        pytest.fail(why)
    pytest.skip(why)


# -- checks the language tests of each back end share (local, sandboxed, Docker) ---------------
def timeout_cases(sleep_r: str, sleep_bash: str) -> list[tuple[str, str, str, str, str]]:
    """(language, setup, stuck block, check, expected) for each language's timeout test."""
    return [
        ("r", "left <- 5", sleep_r, "cat(left)", "5"),
        ("javascript", "var left = 6", "while (true) {}", "left", "6"),
        ("bash", "LEFT=7", sleep_bash, "echo $LEFT", "7\n"),
    ]


TIMEOUT_FIELDS = ("language", "setup", "stuck", "check", "expected")


def check_timeout_keeps_state(
    ex: KernelExecutor, language: str, setup: str, stuck: str, check: str, expected: str
) -> ExecutionResult:
    """A timed-out block is interrupted within seconds and the kernel's state is kept."""
    assert ex.execute(setup, language).exit_code == 0
    started = time.monotonic()
    result = ex.execute(stuck, language, timeout=2)
    assert time.monotonic() - started < 30
    outcome = (result.exit_code, result.timed_out, result.state_lost)
    assert outcome == (124, True, False), (outcome, result.output)
    assert result.error is not None and result.error.ename == "Timeout", result.output
    after = ex.execute(check, language)
    assert after.output == expected, after.output
    return result


def check_errors_are_error_info(ex: KernelExecutor) -> None:
    """R's, JavaScript's and bash's errors are error info, and the R kernel goes on."""
    r_error = ex.execute("kept <- 'yes'\nstop('no such table')", "r")
    assert r_error.exit_code == 1 and r_error.error is not None
    assert "no such table" in r_error.error.evalue
    js_error = ex.execute("throw new TypeError('bad shape')", "javascript")
    assert js_error.exit_code == 1 and js_error.error is not None
    assert (js_error.error.ename, js_error.error.evalue) == ("TypeError", "bad shape")
    sh_error = ex.execute("false", "bash")
    assert sh_error.exit_code == 1 and sh_error.error is not None
    assert ex.execute("cat(kept)", "r").output == "yes"


def check_flood_is_held_to_the_budget(ex: KernelExecutor) -> None:
    result = ex.execute('for (i in 1:20) cat(strrep("x", 50000), "\\n")', "r")
    assert result.exit_code == 0 and result.truncated
    assert len(result.output) < 30_000
    assert result.full_output_file is not None
    assert Path(result.full_output_file).stat().st_size > 1_000_000


def check_r_stdin_is_answered(ex: KernelExecutor) -> None:
    """IRkernel asks for input even when told not to: an empty line, or the input callback's."""
    started = time.monotonic()
    asked = ex.execute("answer <- readline('name? ')\ncat('[', answer, ']', sep = '')", "r")
    assert time.monotonic() - started < 20  # no hang
    assert asked.exit_code == 0 and asked.stdout == "[]"
    assert "asked for input ('name? ') and no input callback" in asked.stderr
    ex.aio.input_callback = lambda prompt: "Ada"
    try:
        answered = ex.execute("cat(readline('name? '))", "r")
    finally:
        ex.aio.input_callback = None
    assert answered.output == "Ada"


def check_notebook_cells_have_their_languages(ex: KernelExecutor) -> None:
    ex.execute("x <- 1", "r")
    path = ex.aio._notebook.path
    assert path is not None
    cells = json.loads(path.read_text())["cells"]
    languages = {c["metadata"]["kernelexec"]["language"] for c in cells if c["cell_type"] == "code"}
    assert {"python", "r", "javascript", "typescript", "shell"} <= languages
    last = cells[-1]
    assert "".join(last["source"]) == "x <- 1"  # as written: no %%bash or other magic in front


# -- host processes: what a session left running -----------------------------------------------
def gone(pid: int) -> bool:
    """Whether the process ended (or is a zombie) within 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False


def running(*argv: str) -> bool:
    """Whether a host process runs with exactly this command line."""
    wanted = "\0".join(argv).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().rstrip(b"\0") == wanted:
                    return True
            except OSError:
                continue
    return False
