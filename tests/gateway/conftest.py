"""Gateway fixtures: one real server of each kind per test session (see gateway_servers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gateway_servers import SERVERS, Gateway, run_gateway


@pytest.fixture(scope="session")
def kernel_gateway() -> Iterator[Gateway]:
    with run_gateway("kernel-gateway") as gateway:
        yield gateway


@pytest.fixture(scope="session")
def enterprise_gateway() -> Iterator[Gateway]:
    with run_gateway("enterprise-gateway") as gateway:
        yield gateway


@pytest.fixture(scope="module", params=sorted(SERVERS))
def gateway(request: pytest.FixtureRequest) -> Gateway:
    """Each gateway in turn: the tests that take it run against both servers."""
    fixture = "kernel_gateway" if request.param == "kernel-gateway" else "enterprise_gateway"
    found: Gateway = request.getfixturevalue(fixture)
    return found
