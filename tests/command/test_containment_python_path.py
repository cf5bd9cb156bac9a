"""A relative ``python=`` (interpreter or virtualenv folder) means relative to the caller's cwd."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kx_python import relative_python

from kernelexec import CommandLineExecutor


@pytest.mark.parametrize("form", ["interpreter", "virtualenv"])
def test_relative_python_is_resolved_against_the_callers_cwd(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relative = relative_python(form, tmp_path, monkeypatch)
    work = tmp_path / "deeper" / "work"
    with CommandLineExecutor(python=relative, work_dir=work, timeout=30) as ex:
        monkeypatch.chdir(tmp_path)  # a later cwd change does not matter either
        result = ex.execute("import sys\nprint(sys.prefix)")
    assert result.ok, result.output
    assert result.output.strip() == sys.prefix
