"""R, JavaScript/TypeScript and bash blocks in one stateful session (issue 36, item 1).

Real kernels: IRkernel, Deno's Jupyter kernel and bash_kernel, each started on its language's
first block in the session's work dir. One session is shared by the tests whose state does not
matter (its kernels start once); the tests that kill or restart kernels make their own.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kx_languages import (
    TIMEOUT_FIELDS,
    check_errors_are_error_info,
    check_flood_is_held_to_the_budget,
    check_notebook_cells_have_their_languages,
    check_r_stdin_is_answered,
    check_timeout_keeps_state,
    gone,
    need_kernels,
    running,
    timeout_cases,
)

from kernelexec import (
    AsyncKernelExecutor,
    InvalidBlock,
    KernelExecutor,
    extract_code_blocks,
)

MIXED = """\
First Python writes the data, R summarises it, Deno and bash read what R wrote.

```python
rows = [3, 1, 4, 1, 5]
with open("data.csv", "w") as f:
    f.write("v\\n" + "\\n".join(map(str, rows)) + "\\n")
```

```r
d <- read.csv("data.csv")
total <- sum(d$v)
writeLines(as.character(total), "total.txt")
```

```r
cat("total", total, "\\n")
```

```js
const total = Number(Deno.readTextFileSync("total.txt").trim());
console.log("js", total * 2);
```

```ts
const tripled: number = total * 3;
console.log("ts", tripled);
```

```bash
TOTAL=$(cat total.txt)
```

```bash
echo "bash $TOTAL"
```
"""


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    need_kernels("r", "javascript", "bash")
    folder = tmp_path_factory.mktemp("languages")
    with KernelExecutor(
        work_dir=folder / "work",
        timeout=60,
        languages={"bash": "bash"},
        notebook_path=folder / "session.ipynb",
    ) as executor:
        yield executor


def test_a_mixed_message_runs_each_language_in_its_own_stateful_kernel(ex: KernelExecutor) -> None:
    result = ex.execute_message(MIXED)
    assert result.exit_code == 0, result.output
    assert [r.language for r in result.block_results] == [
        "python", "r", "r", "javascript", "typescript", "shell", "shell",
    ]  # fmt: skip
    # R's `total` outlived its block; JavaScript and TypeScript share Deno's kernel; bash's
    # variable outlived its block: each language keeps its own state, and they share files.
    lines = [line.strip() for line in result.output.splitlines() if line.strip()]
    assert lines == ["total 14", "js 28", "ts 42", "bash 14"]
    assert (ex.work_dir / "total.txt").read_text() == "14\n"
    # Python's state is its own: R's `total` is not a Python name.
    assert "NameError" in ex.execute("total").output


def test_an_r_plot_comes_back_as_a_png_file(ex: KernelExecutor) -> None:
    result = ex.execute("plot(1:10, main = 'ten')", "r")
    assert result.exit_code == 0, result.output
    pngs = [p for p in result.files if p.suffix == ".png"]
    assert len(pngs) == 1 and pngs[0].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert any("image/png" in o.get("data", {}) for o in result.outputs)
    assert f"[image/png saved to outputs/{pngs[0].name}]" in result.output
    # An R value is R's own text, not also four files (HTML, Markdown, LaTeX).
    value = ex.execute("c(a = 1, b = 2)", "r")
    assert value.output.split() == ["a", "b", "1", "2"] and value.files == []


def test_errors_are_error_info_and_the_kernel_goes_on(ex: KernelExecutor) -> None:
    check_errors_are_error_info(ex)


@pytest.mark.parametrize(TIMEOUT_FIELDS, timeout_cases("Sys.sleep(120)", "sleep 120"))
def test_a_timeout_interrupts_the_block_and_keeps_the_state(
    ex: KernelExecutor, language: str, setup: str, stuck: str, check: str, expected: str
) -> None:
    check_timeout_keeps_state(ex, language, setup, stuck, check, expected)


def test_a_flood_is_held_to_the_output_budget(ex: KernelExecutor) -> None:
    check_flood_is_held_to_the_budget(ex)


def test_an_r_block_that_reads_stdin_gets_an_empty_line_or_the_callback(
    ex: KernelExecutor,
) -> None:
    check_r_stdin_is_answered(ex)
    piped = ex.execute("length(readLines('stdin'))", "r")  # the kernel's stdin: nothing
    assert piped.output == "[1] 0"


def test_the_session_notebook_has_each_cell_with_its_language(ex: KernelExecutor) -> None:
    check_notebook_cells_have_their_languages(ex)


def test_unknown_language_is_refused_naming_what_runs(ex: KernelExecutor) -> None:
    result = ex.execute("puts 1", "ruby")
    assert result.not_run and result.error is not None
    assert result.error.ename == "UnsupportedLanguage"
    assert "python, shell, r, javascript, typescript" in result.output


def test_tags_map_to_languages() -> None:
    tags = ["r", "R", "js", "javascript", "node", "ts", "typescript"]
    message = "\n".join(f"```{tag}\n1\n```" for tag in tags)
    languages = [b.language for b in extract_code_blocks(message)]
    assert languages == ["r", "r", *["javascript"] * 3, "typescript", "typescript"]


# -- bad input: each makes its own session ------------------------------------------------------
def test_a_language_whose_kernel_is_not_installed_says_what_to_install(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30, languages={"cobol": "no-such-kernel"}) as ex:
        started = time.monotonic()
        result = ex.execute("DISPLAY 'HI'.", "cobol")
        assert time.monotonic() - started < 20
        assert result.not_run and result.error is not None
        assert result.error.ename == "KernelNotInstalled"
        assert "'no-such-kernel'" in result.output and "jupyter kernelspec list" in result.output
        assert ex.execute("print('python still runs')").output == "python still runs\n"


def test_the_install_hint_names_the_package_for_each_default_kernel() -> None:
    from kernelexec._languages import DEFAULT_KERNELS, install_hint

    hints = {kernel: install_hint(kernel) for kernel in DEFAULT_KERNELS.values()}
    assert "apt-get install r-cran-irkernel" in hints["ir"]
    assert "pip install deno" in hints["deno"] and "deno jupyter --install" in hints["deno"]
    assert "pip install bash_kernel" in install_hint("bash")


def test_a_kernel_that_dies_at_start_is_a_clear_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "kernels" / "dies"
    spec.mkdir(parents=True)
    argv = ["sh", "-c", "echo 'no licence for this kernel' >&2; exit 3", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "x"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    with KernelExecutor(
        work_dir=tmp_path / "w", timeout=30, startup_timeout=20, languages={"x": "dies"}
    ) as ex:
        started = time.monotonic()
        result = ex.execute("anything", "x")
        assert time.monotonic() - started < 25
        assert result.not_run and result.error is not None
        assert result.error.ename == "KernelStartFailed"
        assert "exit status 3" in result.output and "no licence" in result.output
        again = ex.execute("anything", "x")  # tried afresh, not a half-made kernel
        assert again.error is not None and again.error.ename == "KernelStartFailed"


def test_languages_naming_python_is_refused() -> None:
    with pytest.raises(InvalidBlock, match="Python blocks run in the session's own kernel"):
        AsyncKernelExecutor(languages={"py": "ir"})


def test_a_back_end_without_other_kernels_runs_python_and_shell_only() -> None:
    from kernelexec.backends.local_kernel import LocalKernel

    class Confined(LocalKernel):  # a subclass confines its kernel: no plain sibling escapes it
        pass

    executor = AsyncKernelExecutor(Confined())
    assert executor.supported_languages == ("python", "shell")


def test_death_is_noticed_and_restart_and_close_end_the_kernels(tmp_path: Path) -> None:
    need_kernels("r")
    with KernelExecutor(work_dir=tmp_path, timeout=60) as ex:
        assert ex.execute("x <- 1", "r").exit_code == 0
        died = ex.execute("tools::pskill(Sys.getpid(), 9)", "r")
        assert died.kernel_died and died.state_lost and died.error is not None
        assert "killed by signal SIGKILL" in died.output
        assert ex.execute("exists('x')", "r").output == "[1] FALSE"  # a fresh R kernel
        # A process an R block left running is the R kernel's: it ends with the session.
        ex.execute("system2('sleep', '4711', wait = FALSE)", "r")
        assert running("sleep", "4711")
        r_kernel = ex.aio._others["ir"].backend.pid  # type: ignore[attr-defined]
        ex.restart()
        assert r_kernel is not None and gone(r_kernel)
        assert not ex.aio._others  # started again on the next R block
    assert not running("sleep", "4711")


def test_the_work_dir_is_shared_and_nothing_is_written_outside(ex: KernelExecutor) -> None:
    before = set(os.listdir(ex.work_dir.parent))
    ex.execute("writeLines('r', 'from_r.txt')", "r")
    ex.execute("Deno.writeTextFileSync('from_js.txt', 'js')", "javascript")
    assert ex.execute("cat(readLines('from_js.txt', warn = FALSE))", "r").output == "js"
    assert set(os.listdir(ex.work_dir.parent)) == before


# -- the ways in: `kernelexec run`, the REPL ---------------------------------------------------
def test_kernelexec_run_on_a_mixed_message(tmp_path: Path) -> None:
    need_kernels("r", "javascript")
    message = tmp_path / "reply.md"
    message.write_text(
        "```python\nprint(6 * 7)\n```\n\n```r\ncat(6 * 7)\n```\n\n```ts\nconsole.log(6 * 7)\n```\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "kernelexec", "run", str(message), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [b["language"] for b in report["blocks"]] == ["python", "r", "typescript"]
    assert [b["stdout"].strip() for b in report["blocks"]] == ["42", "42", "42"]


def test_the_repl_switches_language_with_percent_lang(ex: KernelExecutor) -> None:
    from kernelexec._repl import run_repl

    typed = "w = 2\n\n%lang r\n\nw <- 3\ncat(w)\n\n%lang cobol\n\n%lang py\n\nprint(w)\n"
    out = io.StringIO()
    status = run_repl(ex, io.StringIO(typed), out)
    assert status == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "language: r" and lines[1] == "3"
    assert lines[2].startswith("unsupported language: cobol (this session runs: python, shell, r")
    assert lines[3:] == ["language: python", "2"]  # each language kept its own `w`


def test_the_sandboxed_command_executor_runs_r_and_deno_in_its_sandbox(tmp_path: Path) -> None:
    from kx_languages import need_programs
    from kx_sandbox import sandbox_unavailable

    from kernelexec import make_executor

    need_programs("r", "javascript")
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    outside = Path("/tmp") / f"kx-langs-escape-{os.getpid()}"
    with make_executor("sandboxed-command", work_dir=tmp_path, timeout=60) as ex:
        r = ex.execute(f"cat(6 * 7)\ntry(writeLines('x', '{outside}'), silent = TRUE)", "r")
        ts = ex.execute(
            f"console.log(6 * 7)\ntry {{ Deno.writeTextFileSync('{outside}', 'x') }} catch {{}}",
            "ts",
        )
    assert (r.exit_code, r.output) == (0, "42")
    assert (ts.exit_code, ts.output) == (0, "42\n")
    assert not outside.exists()  # the host is read-only inside the sandbox


def test_a_shell_block_after_each_of_three_timeouts_gets_its_own_output(ex: KernelExecutor) -> None:
    """The interrupt's SIGKILL of the block's processes waits for the SIGINT to end them: killed
    at once, bash printed "Killed" and a second prompt beside bash_kernel's ^C, and from then on
    each block read the one before's output ("^C\\n: 4" for `echo $LEFT`; 1 in 5 timeouts under
    load)."""
    for n in range(3):
        assert ex.execute(f"LEFT={n}", "bash").exit_code == 0
        stuck = ex.execute("sleep 120", "bash", timeout=1)
        assert (stuck.timed_out, stuck.state_lost) == (True, False)
        assert "Killed" not in stuck.output
        assert ex.execute("echo $LEFT", "bash").output == f"{n}\n"
