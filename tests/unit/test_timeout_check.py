"""One check for every timeout a caller gives (issue 31.6): numbers only, positive and finite."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest

from kernelexec import InvalidTimeout
from kernelexec._executor import check_timeout
from kernelexec._mcp.hub import HubOptions

REFUSED = [0, -1, 0.0, math.nan, math.inf, -math.inf, True, False, "5", b"5", None, [5]]


@pytest.mark.parametrize("timeout", REFUSED, ids=repr)
def test_anything_but_a_positive_finite_number_is_refused(timeout: Any) -> None:
    with pytest.raises(InvalidTimeout, match="positive, finite number of seconds"):
        check_timeout(timeout)
    with pytest.raises(ValueError, match="timeout"):  # InvalidTimeout is a ValueError too
        HubOptions(timeout=timeout)


@pytest.mark.parametrize(("timeout", "seconds"), [(5, 5.0), (0.25, 0.25), (Fraction(1, 2), 0.5)])
def test_numbers_are_taken_as_seconds(timeout: Any, seconds: float) -> None:
    assert check_timeout(timeout) == seconds
    assert HubOptions(timeout=timeout).timeout == timeout
