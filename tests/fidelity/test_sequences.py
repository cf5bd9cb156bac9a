"""Seeded random sequences of blocks, on every back end: each block ran exactly once, its result
holds exactly what it wrote, and nothing of it turns up in a neighbour's result (issue 31).

The kinds of block and the check are in ``kx_sequences`` (the gateway and cluster tiers run
the same sequences); kernels also get blocks interrupted with ``interrupt()`` mid-block.
"""

from __future__ import annotations

from typing import Any

import pytest
from kx_fidelity import COMMANDS, KERNELS, params
from kx_sequences import check_sequences


@pytest.mark.parametrize("backend", params(KERNELS + COMMANDS), indirect=True)
def test_random_sequences(backend: str, ex: Any) -> None:
    check_sequences(ex, interrupts=backend in KERNELS)
