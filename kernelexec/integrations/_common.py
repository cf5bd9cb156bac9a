"""What the framework adapters share: a clear ImportError when a framework is missing.

Executors are built by name through the registry (``kernelexec._registry``): an adapter's
``kind=`` takes every registered name (``kernel``, ``command``, ``docker-kernel``, ...).
"""

from __future__ import annotations

from .._registry import EXECUTOR_NAMES, make_async_executor, make_executor

#: executor names the adapters accept for ``kind=``
KINDS = EXECUTOR_NAMES

__all__ = ["KINDS", "make_async_executor", "make_executor", "missing_framework"]


def missing_framework(module: str, extra: str, exc: ImportError) -> ImportError:
    """The ImportError raised when an adapter's framework is not installed."""
    error = ImportError(
        f"{module} needs an optional framework that is not installed ({exc}); "
        f"install it with: pip install 'kernelexec[{extra}]'"
    )
    error.__cause__ = exc
    return error
