"""The public API is pinned: adding or removing a name must be a deliberate change here."""

from __future__ import annotations

import kernelexec

EXPECTED = {
    "AsyncCommandLineExecutor",
    "AsyncExecutor",
    "AsyncKernelExecutor",
    "AsyncKernelPool",
    "AsyncSessionManager",
    "BackendUnavailable",
    "CodeBlock",
    "CommandBackend",
    "CommandLineExecutor",
    "CommandOutcome",
    "DockerCommand",
    "DockerKernel",
    "DockerOptions",
    "DockerUnavailable",
    "ErrorInfo",
    "ExecutionResult",
    "ExecutionTimeout",
    "ExecutorClosed",
    "ExecutorOptions",
    "GatewayAuthError",
    "GatewayKernel",
    "GatewayOptions",
    "GatewayUnavailable",
    "ImageNotFound",
    "InvalidBlock",
    "KernelBackend",
    "KernelDied",
    "KernelExecError",
    "KernelExecutor",
    "KernelPool",
    "KernelStartFailed",
    "LocalCommand",
    "LocalKernel",
    "MarkdownCodeExtractor",
    "NotebookError",
    "PoolExhausted",
    "PoolOptions",
    "SessionError",
    "SessionLimitReached",
    "SessionManager",
    "SessionNotFound",
    "SessionOptions",
    "SyncExecutor",
    "__version__",
    "extract_code_blocks",
    "normalize_language",
    "run_notebook",
    "run_notebook_async",
}


def test_all_is_pinned() -> None:
    assert set(kernelexec.__all__) == EXPECTED


def test_every_name_in_all_exists() -> None:
    for name in kernelexec.__all__:
        assert hasattr(kernelexec, name), name


def test_errors_are_builtins_too() -> None:
    assert issubclass(kernelexec.ExecutorClosed, RuntimeError)
    assert issubclass(kernelexec.InvalidBlock, ValueError)
    assert issubclass(kernelexec.ExecutionTimeout, TimeoutError)
    assert issubclass(kernelexec.DockerUnavailable, kernelexec.BackendUnavailable)
    for name in kernelexec.__all__:
        obj = getattr(kernelexec, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, kernelexec.KernelExecError), name
