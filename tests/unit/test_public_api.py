"""The public API is pinned: adding or removing a name must be a deliberate change here."""

from __future__ import annotations

import kernelexec

EXPECTED = {
    "AsyncCommandLineExecutor",
    "AsyncExecutor",
    "AsyncJob",
    "AsyncKernelExecutor",
    "AsyncLiveSnapshot",
    "AsyncKernelPool",
    "AsyncSessionManager",
    "BackendUnavailable",
    "EXECUTOR_NAMES",
    "CodeBlock",
    "CommandBackend",
    "CommandLineExecutor",
    "CommandOutcome",
    "DangerousCommand",
    "DockerCommand",
    "DockerConfigError",
    "DockerKernel",
    "DockerOptions",
    "DockerUnavailable",
    "ErrorInfo",
    "ExecutionResult",
    "ExecutionTimeout",
    "ExecutorClosed",
    "ExecutorNotStarted",
    "ExecutorOptions",
    "GatewayAuthError",
    "GatewayKernel",
    "GatewayOptions",
    "GatewayUnavailable",
    "ImageNotFound",
    "InvalidBlock",
    "SandboxedKernel",
    "SandboxedCommand",
    "SandboxOptions",
    "stop_fork_servers",
    "ForkKernel",
    "FileTooLarge",
    "ForkUnsupported",
    "FileEntry",
    "InvalidPath",
    "InvalidTimeout",
    "InvalidNetworkPolicy",
    "InvalidSecret",
    "NetworkEvent",
    "NetworkPolicy",
    "Secret",
    "InvalidWorkDir",
    "Job",
    "JobNotFinished",
    "JobNotFound",
    "JobStatus",
    "KernelBackend",
    "KernelDied",
    "KernelExecError",
    "KernelExecutor",
    "LiveDisplay",
    "LiveSnapshot",
    "KernelPool",
    "KernelStartFailed",
    "LocalCommand",
    "LocalKernel",
    "MarkdownCodeExtractor",
    "NotebookError",
    "PoolExhausted",
    "PoolOptions",
    "ProvisionedKernel",
    "ProvisionedOptions",
    "ReentrantCall",
    "RequestAborted",
    "SessionBusy",
    "SessionError",
    "SessionExists",
    "SessionLimitReached",
    "SessionManager",
    "SessionNotFound",
    "SnapshotError",
    "SnapshotManifest",
    "SessionOptions",
    "SyncExecutor",
    "UnknownExecutor",
    "UnsafePath",
    "WorkDirNotFound",
    "__version__",
    "extract_code_blocks",
    "make_async_executor",
    "make_executor",
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
    assert issubclass(kernelexec.InvalidTimeout, ValueError)
    assert issubclass(kernelexec.InvalidWorkDir, ValueError)
    assert issubclass(kernelexec.ExecutionTimeout, TimeoutError)
    assert issubclass(kernelexec.ExecutorNotStarted, RuntimeError)
    assert issubclass(kernelexec.ExecutorNotStarted, ValueError)
    assert issubclass(kernelexec.DockerUnavailable, kernelexec.BackendUnavailable)
    for name in kernelexec.__all__:
        obj = getattr(kernelexec, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, kernelexec.KernelExecError), name


def test_unknown_executor_names_the_valid_ones() -> None:
    import pytest

    with pytest.raises(kernelexec.UnknownExecutor, match="valid: kernel, command") as info:
        kernelexec.make_executor("nope")
    assert isinstance(info.value, ValueError)


def test_importing_kernelexec_loads_no_heavy_dependency() -> None:
    """``import kernelexec`` stays fast: names load on first use (start-up time, issue 12)."""
    import subprocess
    import sys

    heavy = ["docker", "tornado", "matplotlib", "jupyter_client", "zmq", "nbformat", "rich"]
    code = (
        "import sys, kernelexec, kernelexec.cli; "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lazy_names_resolve_to_their_defining_module() -> None:
    assert kernelexec.KernelExecutor.__module__ == "kernelexec._kernel"
    assert "KernelExecutor" in dir(kernelexec)
    import pytest

    with pytest.raises(AttributeError):
        _ = kernelexec.NoSuchName  # type: ignore[attr-defined]


def test_a_pooled_back_end_says_what_its_inner_one_says() -> None:
    """Env inheritance and disk sharing are the inner back end's (a pooled gateway kernel's
    files go through the kernel; a pooled Docker kernel gets no host environment)."""
    from kernelexec.backends.docker_kernel import DockerKernel
    from kernelexec.backends.gateway_kernel import GatewayKernel
    from kernelexec.pool import AsyncKernelPool, _PooledBackend

    pool = AsyncKernelPool()
    for inner in (DockerKernel(), GatewayKernel("http://127.0.0.1:1")):
        wrapped = _PooledBackend(inner, pool)
        assert wrapped.inherits_host_env is False
        assert wrapped.shares_work_dir is inner.shares_work_dir
