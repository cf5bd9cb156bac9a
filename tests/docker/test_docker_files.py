"""The files API on both Docker back ends: the work dir is bind-mounted, so the host's disk is
the container's, and what the API writes the code in the container reads (and back)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelexec import make_executor


@pytest.fixture(params=["docker-kernel", "docker-command"])
def ex(request: pytest.FixtureRequest, tmp_path: Path, docker_client: Any) -> Iterator[Any]:
    # docker_client: no engine or image, and the tests are skipped with the reason
    with make_executor(request.param, work_dir=tmp_path / "work", timeout=60) as executor:
        yield executor


def test_files_contract(ex: Any, files_contract: Callable[[Any, Path], None]) -> None:
    files_contract(ex, ex.work_dir)


def test_upload_then_use_in_the_container(
    ex: Any, transfer_roundtrip: Callable[[Any], None]
) -> None:
    transfer_roundtrip(ex)
    r = ex.execute("import os; print(os.path.getsize('in/copy.bin'))")
    assert r.output.strip() == "300000", r.output
