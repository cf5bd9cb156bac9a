"""The engine's timestamps, read as ``time.time()`` seconds: when a container ended tells a kernel
that died while idle from one that died in the block sent next (``died_before``)."""

from __future__ import annotations

import pytest

from kernelexec.backends.docker_kernel import engine_time

pytestmark = pytest.mark.unit


def test_nanoseconds_and_zones_are_read() -> None:
    assert engine_time("2026-11-27T10:50:01.123456789Z") == pytest.approx(1795776601.123456)
    assert engine_time("2026-11-27T10:50:01Z") == 1795776601.0
    assert engine_time("2026-11-27T11:50:01.5+01:00") == 1795776601.5


@pytest.mark.parametrize(
    "text", ["0001-01-01T00:00:00Z", "", "soon", None, 12, "2026-13-40T00:00:00Z"]
)
def test_an_unset_or_broken_time_is_none(text: object) -> None:
    assert engine_time(text) is None
