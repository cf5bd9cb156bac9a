"""The fork kernel's options are checked when it is built, before any server starts."""

from __future__ import annotations

import pytest

from kernelexec import ForkKernel
from kernelexec.backends import fork_kernel


@pytest.mark.parametrize(
    ("warm_up", "error", "says"),
    [
        ("pandas", TypeError, r"not one string: \['pandas'\]"),
        (b"pandas", TypeError, "not one string"),
        (["json", 1], TypeError, "not int"),
        ([""], ValueError, "'' is not a module name"),
        (["os; import sys"], ValueError, "'os; import sys' is not a module name"),
        (["numpy.", "x"], ValueError, "'numpy.' is not a module name"),
        (["my-package"], ValueError, "'my-package' is not a module name"),
    ],
)
def test_a_bad_warm_up_list_is_refused_at_once(
    warm_up: object, error: type[Exception], says: str
) -> None:
    before = dict(fork_kernel._servers)
    with pytest.raises(error, match=says):
        ForkKernel(warm_up=warm_up)  # type: ignore[arg-type]
    assert fork_kernel._servers == before  # no server was asked for


def test_a_good_warm_up_list_is_kept_in_order() -> None:
    names = ["numpy", "pandas.core.frame", "_private", "json"]
    assert ForkKernel(warm_up=names).warm_up == tuple(names)
    assert ForkKernel(warm_up=iter(["json"])).warm_up == ("json",)  # type: ignore[arg-type]
    assert ForkKernel().warm_up == ()
