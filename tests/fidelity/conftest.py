"""Fidelity tier: what a result says is what the block did, on every back end.

``ex`` is one executor of the case's ``backend`` per module (30 s default timeout), built on
first use; cases that need a fresh one build it with ``kx_fidelity.make``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_fidelity import make


class _Executors:
    def __init__(self, root: Path) -> None:
        self._root = root
        self._open: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name not in self._open:
            self._open[name] = make(name, self._root / name, timeout=30)
        return self._open[name]

    def close(self) -> None:
        for executor in self._open.values():
            executor.close()
        self._open.clear()


@pytest.fixture(scope="module")
def executors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Executors]:
    cache = _Executors(tmp_path_factory.mktemp("fidelity"))
    yield cache
    cache.close()


@pytest.fixture
def ex(backend: str, executors: _Executors) -> Any:
    return executors.get(backend)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name
