"""Whether the other languages' kernels (IRkernel, Deno, bash_kernel) and interpreters are here.

Tests that need them skip when they are missing, and fail instead under
``KERNELEXEC_REQUIRE_LANGUAGES=1`` (CI's ``.ci/languages.sh`` sets it once it installed them).
"""

from __future__ import annotations

import os
import shutil

import pytest
from jupyter_client.kernelspec import KernelSpecManager

KERNELS = {"r": "ir", "javascript": "deno", "bash": "bash"}
PROGRAMS = {"r": "Rscript", "javascript": "deno"}


def missing_kernels(*languages: str) -> list[str]:
    installed = KernelSpecManager().find_kernel_specs()
    return [KERNELS[lang] for lang in languages if KERNELS[lang] not in installed]


def need_kernels(*languages: str) -> None:
    """Skip (or fail, when required) unless these languages' kernelspecs are installed."""
    _need(missing_kernels(*languages), "kernelspecs")


def need_programs(*languages: str) -> None:
    _need([PROGRAMS[lang] for lang in languages if not shutil.which(PROGRAMS[lang])], "programs")


def _need(missing: list[str], what: str) -> None:
    if not missing:
        return
    why = f"{what} not installed: {', '.join(missing)} (see .ci/languages.sh)"
    if os.environ.get("KERNELEXEC_REQUIRE_LANGUAGES") == "1":
        pytest.fail(why)
    pytest.skip(why)
