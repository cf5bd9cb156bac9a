"""The behaviour both executors share, checked once over each (one executor per kind)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_sandbox import sandbox_unavailable

from kernelexec import (
    CodeBlock,
    CommandLineExecutor,
    ExecutorClosed,
    KernelExecutor,
    make_executor,
)
from kernelexec._executor import SyncExecutor

KINDS = [
    "command",
    "warm-command",
    "kernel",
    "fork-kernel",
    "sandboxed-command",
    "sandboxed-kernel",
]


def make(kind: str, work_dir: Path, **options: Any) -> SyncExecutor[Any]:
    if kind.startswith("sandboxed") and (reason := sandbox_unavailable()):
        pytest.skip(reason)
    if kind not in ("command", "kernel"):
        return make_executor(kind, work_dir=work_dir, timeout=30, **options)
    factory = CommandLineExecutor if kind == "command" else KernelExecutor
    return factory(work_dir=work_dir, timeout=30, **options)


@pytest.fixture(scope="module", params=KINDS)
def ex(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with make(request.param, tmp_path_factory.mktemp(request.param)) as executor:
        yield executor


def test_print_output(ex: SyncExecutor[Any]) -> None:
    r = ex.execute("print('hello shared')")
    assert (r.exit_code, r.output.strip()) == (0, "hello shared")
    assert r.stdout.strip() == "hello shared"


def test_shell_block(ex: SyncExecutor[Any]) -> None:
    r = ex.execute("echo from-shell", "bash")
    assert r.ok and r.output.strip() == "from-shell"


def test_error_is_exit_1(ex: SyncExecutor[Any]) -> None:
    r = ex.execute("raise ValueError('shared failure')")
    assert r.exit_code == 1
    assert r.error is not None and r.error.ename == "ValueError"
    assert "shared failure" in r.output


def test_unsupported_language_is_a_result(ex: SyncExecutor[Any]) -> None:
    r = ex.execute("puts 1", "ruby")
    assert r.exit_code == 1
    assert "unsupported language" in r.output


def test_filename_escaping_the_work_dir_is_refused(ex: SyncExecutor[Any]) -> None:
    r = ex.execute("# filename: ../escape.py\nprint('no')")
    assert r.exit_code == 1
    assert "escapes" in r.output
    assert not (ex.work_dir.parent / "escape.py").exists()


def test_timeout_is_124_and_returns_on_time(ex: SyncExecutor[Any]) -> None:
    started = time.monotonic()
    r = ex.execute("import time\ntime.sleep(30)", timeout=1)
    assert time.monotonic() - started < 5
    assert r.exit_code == 124 and r.timed_out


def test_artifacts_are_listed(ex: SyncExecutor[Any]) -> None:
    r = ex.execute("open('artifact.txt', 'w').write('data')")
    assert ex.work_dir / "artifact.txt" in r.files
    assert str(ex.work_dir / "artifact.txt") in r.output_files


def test_execute_code_blocks_stops_at_first_failure(ex: SyncExecutor[Any]) -> None:
    blocks = [
        CodeBlock("print('one')"),
        CodeBlock("raise RuntimeError('two')"),
        CodeBlock("print('three')"),
    ]
    r = ex.execute_code_blocks(blocks)
    assert r.exit_code == 1
    assert len(r.block_results) == 2
    assert "one" in r.output and "three" not in r.output


def test_execute_message(ex: SyncExecutor[Any]) -> None:
    r = ex.execute_message("Run this:\n\n```python\nprint(6 * 7)\n```\n")
    assert r.ok and r.output.strip() == "42"


@pytest.mark.parametrize("kind", KINDS)
def test_closed_executor_raises_and_context_manager_closes(kind: str, tmp_path: Path) -> None:
    with make(kind, tmp_path) as executor:
        assert executor.execute("print(1)").ok
    assert executor.closed
    with pytest.raises(ExecutorClosed):
        executor.execute("print(1)")
    executor.close()  # closing again is harmless
