"""The files API on a remote kernel: no shared disk assumed, so files travel through the kernel.

The gateway's kernel works in its own folder (``working_dir``), distinct from the executor's
local work dir: a file that lands there, and not in the local one, went over the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_servers import Gateway

from kernelexec import KernelExecutor


@pytest.fixture
def remote(gateway: Gateway, tmp_path: Path) -> Iterator[tuple[KernelExecutor, Path]]:
    there = tmp_path / "remote-side"
    backend = gateway.backend(working_dir=str(there))
    with KernelExecutor(backend, work_dir=tmp_path / "local-side", timeout=30) as ex:
        yield ex, there


def test_files_go_through_the_kernel(
    remote: tuple[KernelExecutor, Path], files_contract: Callable[[Any, Path], None]
) -> None:
    ex, there = remote
    files_contract(ex, there)
    assert not (ex.work_dir / "data.bin").exists()  # nothing took the shared-disk shortcut
    # the transfers left nothing in the session's history
    r = ex.execute("len([h for h in In if '__kx_' + 'files__' in h])")
    assert r.output == "0"


def test_upload_and_download(
    remote: tuple[KernelExecutor, Path], transfer_roundtrip: Callable[[Any], None]
) -> None:
    ex, there = remote
    transfer_roundtrip(ex)
    assert (there / "in" / "copy.bin").is_file()
