"""What the framework adapters share: building an executor by name, and a clear ImportError."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._executor import AsyncExecutor, SyncExecutor

#: executor names the adapters accept for ``kind=``
KINDS = ("kernel", "command")


def missing_framework(module: str, extra: str, exc: ImportError) -> ImportError:
    """The ImportError raised when an adapter's framework is not installed."""
    error = ImportError(
        f"{module} needs an optional framework that is not installed ({exc}); "
        f"install it with: pip install 'kernelexec[{extra}]'"
    )
    error.__cause__ = exc
    return error


def make_async_executor(kind: str, **options: Any) -> AsyncExecutor:
    """An async executor: ``"kernel"`` (stateful) or ``"command"`` (a process per block)."""
    if kind == "command":
        from .._command import AsyncCommandLineExecutor

        return AsyncCommandLineExecutor(**options)
    if kind == "kernel":
        from .._kernel import AsyncKernelExecutor

        return AsyncKernelExecutor(**options)
    raise ValueError(f"unknown executor kind {kind!r} (valid: {', '.join(KINDS)})")


def make_sync_executor(kind: str, **options: Any) -> SyncExecutor[Any]:
    """The synchronous twin of ``make_async_executor``."""
    if kind == "command":
        from .._command import CommandLineExecutor

        return CommandLineExecutor(**options)
    if kind == "kernel":
        from .._kernel import KernelExecutor

        return KernelExecutor(**options)
    raise ValueError(f"unknown executor kind {kind!r} (valid: {', '.join(KINDS)})")
