"""Adversarial outputs and inputs through the stateless executor (a real local process)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kernelexec import CommandLineExecutor, InvalidTimeout, InvalidWorkDir


def test_timeout_message_is_not_doubled(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path) as ex:
        result = ex.execute("import time; time.sleep(30)", timeout=1)
    assert result.timed_out and result.error is not None
    assert "Timeout: Timeout" not in json.dumps(result.to_dict())
    assert str(result.error) == "Timeout: the block ran longer than 1 s and was killed."
    assert result.output.endswith(str(result.error))


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf])
def test_a_bad_per_call_timeout_is_refused(tmp_path: Path, timeout: float) -> None:
    with CommandLineExecutor(work_dir=tmp_path) as ex:
        with pytest.raises(InvalidTimeout, match="timeout"):
            ex.execute("open('ran', 'w').close()", timeout=timeout)
        with pytest.raises(ValueError, match="timeout"):
            ex.execute_code_blocks([_Block("open('ran', 'w').close()")], timeout=timeout)
        assert not (tmp_path / "ran").exists()
        assert ex.execute("print(1)").output == "1\n"


class _Block:
    def __init__(self, code: str) -> None:
        self.code, self.language = code, "python"


def test_a_work_dir_that_is_a_file_is_refused_clearly(tmp_path: Path) -> None:
    file = tmp_path / "plain-file"
    file.write_text("x")
    with pytest.raises(InvalidWorkDir, match="plain-file"):
        CommandLineExecutor(work_dir=file)
    with pytest.raises(ValueError):
        CommandLineExecutor(work_dir=file / "child")


def test_binary_output_is_visible_not_raw(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path) as ex:
        result = ex.execute("import os; os.write(1, b'a\\x00b\\x1b\\x07c\\n')")
    assert "a\\x00b\\x1b\\x07c\n" in result.output
    assert "\x00" in result.stdout  # stdout keeps the raw text


# -- 31.10: carriage returns: kept as written; ``output`` is the terminal view ---------------------
CARRIAGE_RETURNS = "print('a\\rb'); import sys; _ = sys.stdout.write('12%\\r50%\\r100%\\n')"


def test_stdout_keeps_carriage_returns_output_shows_the_terminal_view(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path) as ex:
        result = ex.execute(CARRIAGE_RETURNS)
    assert result.stdout == "a\rb\n12%\r50%\r100%\n"
    assert result.outputs[0]["text"] == result.stdout
    assert result.output == "b\n100%\n"  # as kernels show it (it was "a\\x0db\\n12%\\x0d...")


def test_a_progress_bar_past_the_limit_is_spilled_as_written(tmp_path: Path) -> None:
    code = "import sys\nfor i in range(3000): sys.stdout.write(f'\\r{i:5d}')\nprint()"
    with CommandLineExecutor(work_dir=tmp_path, output_limit=1000) as ex:
        result = ex.execute(code)
    assert result.output.startswith(" 2999\n[full output in ")  # the bar's last state
    assert result.full_output_file is not None
    assert result.full_output_file.read_bytes().count(b"\r") == 3000  # every update
