"""R, Deno and bash kernels in a sandboxed-kernel session (issue 36): each runs inside a bubblewrap
sandbox of its own with the session's options (the host read-only, no network, not root, only the
work dir writable), started through the bridge (``_sandbox_bridge``). One session is shared.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kx_languages import need_kernels
from kx_sandbox import sandbox_unavailable

from kernelexec import KernelExecutor, make_executor


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    why = sandbox_unavailable()
    if why is not None:
        pytest.skip(why)
    need_kernels("r", "javascript", "bash")
    folder = tmp_path_factory.mktemp("langs-sandbox")
    with make_executor(
        "sandboxed-kernel", work_dir=folder / "work", timeout=60, languages={"bash": "bash"}
    ) as executor:
        yield executor


def test_each_language_runs_in_the_sandbox_and_shares_the_work_dir(ex: KernelExecutor) -> None:
    r = ex.execute("writeLines('from r', 'r.txt')\ncat(system('id -u', intern = TRUE))", "r")
    assert r.exit_code == 0 and r.output.isdigit() and r.output != "0", r.output  # not root
    js = ex.execute("console.log(Deno.readTextFileSync('r.txt').trim(), Deno.cwd())", "js")
    assert js.output == f"from r {ex.work_dir}\n"
    sh = ex.execute("cat r.txt; id -u", "bash")
    assert sh.output.splitlines()[0] == "from r" and sh.output.splitlines()[1] != "0"


@pytest.mark.parametrize(
    ("language", "write"),
    [
        ("r", "writeLines('x', '{path}')"),
        ("javascript", "Deno.writeTextFileSync('{path}', 'x')"),
        ("bash", "echo x > {path}"),
    ],
)
def test_nothing_is_written_outside_and_no_network(
    ex: KernelExecutor, tmp_path: Path, language: str, write: str
) -> None:
    target = tmp_path / f"escape-{language}.txt"
    result = ex.execute(write.format(path=target), language)
    assert result.exit_code == 1 and not target.exists(), result.output
    if language == "r":  # no network: not even a name lookup
        net = ex.execute("tryCatch(nsl('deb.debian.org'), error = function(e) NULL)", "r")
        assert net.output.endswith("NULL") and "unable to resolve" in net.output, net.output


@pytest.mark.parametrize(
    ("language", "setup", "stuck", "check", "expected"),
    [
        ("r", "left <- 5", "Sys.sleep(120)", "cat(left)", "5"),
        ("javascript", "var left = 6", "while (true) {}", "left", "6"),
        ("bash", "LEFT=7", "sleep 120", "echo $LEFT", "7\n"),
    ],
)
def test_a_timeout_interrupts_the_block_and_keeps_the_state(
    ex: KernelExecutor, language: str, setup: str, stuck: str, check: str, expected: str
) -> None:
    assert ex.execute(setup, language).exit_code == 0
    started = time.monotonic()
    result = ex.execute(stuck, language, timeout=2)
    assert time.monotonic() - started < 30
    assert (result.exit_code, result.timed_out, result.state_lost) == (124, True, False)
    assert ex.execute(check, language).output == expected


def test_a_plot_and_a_death(ex: KernelExecutor) -> None:
    plot = ex.execute("plot(1:3)", "r")
    assert [p.suffix for p in plot.files] == [".png"]
    died = ex.execute("tools::pskill(Sys.getpid(), 9)", "r")
    assert died.kernel_died and died.state_lost
    assert ex.execute("exists('left')", "r").output == "[1] FALSE"


def test_a_missing_kernel_says_what_to_install(tmp_path: Path) -> None:
    if (why := sandbox_unavailable()) is not None:
        pytest.skip(why)
    with make_executor(
        "sandboxed-kernel", work_dir=tmp_path, timeout=30, languages={"x": "no-such-kernel"}
    ) as ex:
        result = ex.execute("anything", "x")
        assert result.not_run and result.error is not None
        assert result.error.ename == "KernelNotInstalled"
