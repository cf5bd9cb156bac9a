"""A relative ``python=`` as a caller would give it (issue 14.8), for the tests of every layer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def relative_python(form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """This interpreter (``form="interpreter"``) or its environment (``"virtualenv"``), as a
    path relative to a fresh current directory the caller is now in."""
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    relative = os.path.relpath(sys.executable if form == "interpreter" else sys.prefix)
    assert not os.path.isabs(relative)
    return relative
