"""``refuse_dangerous=True`` (issue 32.5): AG2's list of host-wrecking shell commands, refused
before a block runs, on kernelexec's own executors. A guard-rail, not a sandbox: off by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelexec import CommandLineExecutor

# Matches AG2's "rm -rf" pattern; ``exit 0`` first, so it would not act even if run.
CODE = "touch ran.txt; exit 0\nrm -rf ./gone\n"


def test_a_dangerous_shell_block_is_refused_and_not_run(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path, refuse_dangerous=True) as executor:
        result = executor.execute(CODE, "shell")
        assert result.not_run and result.exit_code != 0
        assert result.error is not None and result.error.ename == "DangerousCommand"
        assert "Potentially dangerous command detected: Use of 'rm -rf'" in result.output
        assert not (tmp_path / "ran.txt").exists()
        # Python is not read as shell: only a kernel's ``!`` lines are shell there.
        assert executor.execute("print('rm -rf is only text here')", "python").ok
        assert executor.execute("echo fine", "shell").output == "fine\n"


def test_off_by_default(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path) as executor:
        assert executor.aio.options.refuse_dangerous is False
        assert executor.execute(CODE, "shell").ok
    assert (tmp_path / "ran.txt").exists()


@pytest.mark.kernel
def test_a_kernels_bang_lines_are_checked(tmp_path: Path) -> None:
    from kernelexec import KernelExecutor

    with KernelExecutor(work_dir=tmp_path, refuse_dangerous=True) as executor:
        refused = executor.execute("open('ran.txt', 'w').close()\n!rm -rf ./gone")
        assert refused.not_run and not (tmp_path / "ran.txt").exists()
        assert executor.execute("!echo fine").output.strip() == "fine"
