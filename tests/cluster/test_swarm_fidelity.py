"""The fidelity tier's random sequences on a provisioned kernel (a Swarm service; issue 31):
each block ran once (counted in the kernel's folder, read back over the protocol), its result
holds exactly what it wrote, nothing lands in a neighbour, after failures, timeouts and
interrupts (through the launcher's listener)."""

from __future__ import annotations

import pytest
from kx_cluster import Swarm

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_random_sequences(swarm: Swarm) -> None:
    r = swarm.run(
        """
        sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"], "tests", "fidelity"))
        from kx_sequences import check_sequences

        with session() as ex:
            check_sequences(ex, interrupts=True)
        report(done=True)
        """
    )
    assert r == {"done": True}
