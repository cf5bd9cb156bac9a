"""The fidelity tier's random sequences on both real gateways (issue 31): each block ran once
(counted in the kernel's own folder, read back over the protocol), its result holds exactly what
it wrote, nothing of it lands in a neighbour, after failures, timeouts and interrupts."""

from __future__ import annotations

import sys
from pathlib import Path

from gateway_servers import Gateway

from kernelexec import KernelExecutor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fidelity"))
from kx_sequences import check_sequences  # tests/fidelity is not a package


def test_random_sequences(gateway: Gateway, tmp_path: Path) -> None:
    backend = gateway.backend(working_dir=str(tmp_path / "remote-side"))
    with KernelExecutor(backend, work_dir=tmp_path / "local-side", timeout=30) as ex:
        check_sequences(ex, interrupts=True)
