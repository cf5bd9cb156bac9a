"""The command executor runs R blocks with Rscript and JavaScript/TypeScript with ``deno run``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kx_languages import need_programs

from kernelexec import CommandLineExecutor


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CommandLineExecutor]:
    need_programs("r", "javascript")
    with CommandLineExecutor(work_dir=tmp_path_factory.mktemp("cmd-langs"), timeout=60) as ex:
        yield ex


def test_r_and_deno_blocks_run_stateless_and_share_files(ex: CommandLineExecutor) -> None:
    assert {"r", "javascript", "typescript"} <= set(ex.supported_languages)
    r = ex.execute("x <- 21\ncat(x * 2, '\\n')\nwriteLines('from R', 'r.txt')", "r")
    assert (r.exit_code, r.output) == (0, "42 \n")
    assert r.code_file is not None and r.code_file.endswith(".R")
    assert ex.execute("cat(exists('x'))", "r").output == "FALSE"  # a fresh Rscript each block
    code = "const n: number = 6 * 7;\nconsole.log(n, Deno.readTextFileSync('r.txt'))"
    ts = ex.execute(code, "ts")
    assert (ts.exit_code, ts.output) == (0, "42 from R\n\n")
    assert ts.code_file is not None and ts.code_file.endswith(".ts")
    js = ex.execute("console.log([1, 2].map((v) => v * 2).join(','))", "javascript")
    assert (js.exit_code, js.output) == (0, "2,4\n")


def test_failures_and_timeouts(ex: CommandLineExecutor) -> None:
    r = ex.execute("stop('bad input')", "r")
    assert r.exit_code == 1 and "bad input" in r.output
    js = ex.execute("throw new RangeError('too far')", "js")
    assert js.exit_code == 1 and "RangeError: too far" in js.output
    assert "\x1b[" not in js.output  # Deno's colours are off
    slow = ex.execute("Sys.sleep(60)", "r", timeout=2)
    assert slow.exit_code == 124 and slow.timed_out


def test_an_r_block_reading_stdin_gets_end_of_input(ex: CommandLineExecutor) -> None:
    result = ex.execute("cat(length(readLines(file('stdin'))))", "r", timeout=20)
    assert (result.exit_code, result.output) == (0, "0")
