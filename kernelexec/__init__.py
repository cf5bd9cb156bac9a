"""kernelexec: run code written by LLM agents, statefully in IPython kernels or statelessly.

The public API is what ``__all__`` lists; everything in a ``_module`` is private.

Names are imported on first use (PEP 562): ``import kernelexec`` loads no kernel client, Docker
SDK or nbformat, so tools that only need a name or two (and ``kernelexec --help``) start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from ._branch import AsyncLiveSnapshot, LiveSnapshot
    from ._command import AsyncCommandLineExecutor, CommandLineExecutor
    from ._durable import SnapshotManifest
    from ._errors import (
        BackendUnavailable,
        DangerousCommand,
        DockerConfigError,
        DockerUnavailable,
        ExecutionTimeout,
        ExecutorClosed,
        ExecutorNotStarted,
        FileTooLarge,
        ForkUnsupported,
        GatewayAuthError,
        GatewayUnavailable,
        ImageNotFound,
        InvalidBlock,
        InvalidNetworkPolicy,
        InvalidPath,
        InvalidSecret,
        InvalidTimeout,
        InvalidWorkDir,
        JobNotFinished,
        JobNotFound,
        KernelDied,
        KernelExecError,
        KernelStartFailed,
        NotebookError,
        PoolExhausted,
        ReentrantCall,
        RequestAborted,
        SessionBusy,
        SessionError,
        SessionExists,
        SessionLimitReached,
        SessionNotFound,
        SnapshotError,
        UnknownExecutor,
        UnsafePath,
        WorkDirNotFound,
    )
    from ._executor import AsyncExecutor, ExecutorOptions, SyncExecutor
    from ._extract import MarkdownCodeExtractor, extract_code_blocks, normalize_language
    from ._files import FileEntry
    from ._jobs import AsyncJob, Job, JobStatus
    from ._kernel import AsyncKernelExecutor, KernelExecutor
    from ._network import NetworkPolicy, Secret
    from ._notebook import run_notebook, run_notebook_async
    from ._registry import EXECUTOR_NAMES, make_async_executor, make_executor
    from ._render import LiveDisplay
    from ._types import CodeBlock, ErrorInfo, ExecutionResult, NetworkEvent
    from ._version import __version__
    from .backends._docker_options import DockerOptions
    from .backends._sandbox import SandboxOptions
    from .backends.base import CommandBackend, CommandOutcome, KernelBackend
    from .backends.docker_command import DockerCommand
    from .backends.docker_kernel import DockerKernel
    from .backends.fork_kernel import ForkKernel, stop_fork_servers
    from .backends.gateway_kernel import GatewayKernel, GatewayOptions
    from .backends.local_command import LocalCommand
    from .backends.local_kernel import LocalKernel
    from .backends.provisioned_kernel import ProvisionedKernel, ProvisionedOptions
    from .backends.sandboxed import SandboxedCommand, SandboxedKernel
    from .pool import (
        AsyncKernelPool,
        AsyncSessionManager,
        KernelPool,
        PoolOptions,
        SessionManager,
        SessionOptions,
    )

# public name -> the private module that defines it
_LAZY: dict[str, str] = {
    "AsyncCommandLineExecutor": "._command",
    "AsyncExecutor": "._executor",
    "AsyncJob": "._jobs",
    "AsyncKernelExecutor": "._kernel",
    "AsyncLiveSnapshot": "._branch",
    "AsyncKernelPool": ".pool",
    "AsyncSessionManager": ".pool",
    "BackendUnavailable": "._errors",
    "CodeBlock": "._types",
    "CommandBackend": ".backends.base",
    "CommandLineExecutor": "._command",
    "CommandOutcome": ".backends.base",
    "DockerCommand": ".backends.docker_command",
    "DockerKernel": ".backends.docker_kernel",
    "DockerOptions": ".backends._docker_options",
    "DangerousCommand": "._errors",
    "DockerConfigError": "._errors",
    "DockerUnavailable": "._errors",
    "EXECUTOR_NAMES": "._registry",
    "ErrorInfo": "._types",
    "ExecutionResult": "._types",
    "ExecutionTimeout": "._errors",
    "ExecutorClosed": "._errors",
    "ExecutorNotStarted": "._errors",
    "ExecutorOptions": "._executor",
    "FileEntry": "._files",
    "FileTooLarge": "._errors",
    "ForkUnsupported": "._errors",
    "ForkKernel": ".backends.fork_kernel",
    "GatewayAuthError": "._errors",
    "GatewayKernel": ".backends.gateway_kernel",
    "GatewayOptions": ".backends.gateway_kernel",
    "GatewayUnavailable": "._errors",
    "ImageNotFound": "._errors",
    "InvalidBlock": "._errors",
    "InvalidPath": "._errors",
    "InvalidTimeout": "._errors",
    "InvalidNetworkPolicy": "._errors",
    "InvalidSecret": "._errors",
    "NetworkPolicy": "._network",
    "Secret": "._network",
    "NetworkEvent": "._types",
    "InvalidWorkDir": "._errors",
    "Job": "._jobs",
    "JobNotFinished": "._errors",
    "JobNotFound": "._errors",
    "JobStatus": "._jobs",
    "KernelBackend": ".backends.base",
    "KernelDied": "._errors",
    "KernelExecError": "._errors",
    "KernelExecutor": "._kernel",
    "LiveDisplay": "._render",
    "LiveSnapshot": "._branch",
    "KernelPool": ".pool",
    "KernelStartFailed": "._errors",
    "LocalCommand": ".backends.local_command",
    "LocalKernel": ".backends.local_kernel",
    "MarkdownCodeExtractor": "._extract",
    "NotebookError": "._errors",
    "PoolExhausted": "._errors",
    "PoolOptions": ".pool",
    "ProvisionedKernel": ".backends.provisioned_kernel",
    "ProvisionedOptions": ".backends.provisioned_kernel",
    "ReentrantCall": "._errors",
    "RequestAborted": "._errors",
    "SandboxOptions": ".backends._sandbox",
    "SandboxedCommand": ".backends.sandboxed",
    "SandboxedKernel": ".backends.sandboxed",
    "SessionError": "._errors",
    "SessionBusy": "._errors",
    "SessionExists": "._errors",
    "SessionLimitReached": "._errors",
    "SessionManager": ".pool",
    "SessionNotFound": "._errors",
    "SnapshotError": "._errors",
    "SnapshotManifest": "._durable",
    "SessionOptions": ".pool",
    "SyncExecutor": "._executor",
    "UnknownExecutor": "._errors",
    "UnsafePath": "._errors",
    "WorkDirNotFound": "._errors",
    "extract_code_blocks": "._extract",
    "make_async_executor": "._registry",
    "make_executor": "._registry",
    "normalize_language": "._extract",
    "run_notebook": "._notebook",
    "run_notebook_async": "._notebook",
    "stop_fork_servers": ".backends.fork_kernel",
}

__all__ = [
    "EXECUTOR_NAMES",
    "AsyncCommandLineExecutor",
    "AsyncExecutor",
    "AsyncJob",
    "AsyncKernelExecutor",
    "AsyncKernelPool",
    "AsyncLiveSnapshot",
    "AsyncSessionManager",
    "BackendUnavailable",
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
    "FileEntry",
    "FileTooLarge",
    "ForkKernel",
    "ForkUnsupported",
    "GatewayAuthError",
    "GatewayKernel",
    "GatewayOptions",
    "GatewayUnavailable",
    "ImageNotFound",
    "InvalidBlock",
    "InvalidNetworkPolicy",
    "InvalidPath",
    "InvalidSecret",
    "InvalidTimeout",
    "InvalidWorkDir",
    "Job",
    "JobNotFinished",
    "JobNotFound",
    "JobStatus",
    "KernelBackend",
    "KernelDied",
    "KernelExecError",
    "KernelExecutor",
    "KernelPool",
    "KernelStartFailed",
    "LiveDisplay",
    "LiveSnapshot",
    "LocalCommand",
    "LocalKernel",
    "MarkdownCodeExtractor",
    "NetworkEvent",
    "NetworkPolicy",
    "NotebookError",
    "PoolExhausted",
    "PoolOptions",
    "ProvisionedKernel",
    "ProvisionedOptions",
    "ReentrantCall",
    "RequestAborted",
    "SandboxOptions",
    "SandboxedCommand",
    "SandboxedKernel",
    "Secret",
    "SessionBusy",
    "SessionError",
    "SessionExists",
    "SessionLimitReached",
    "SessionManager",
    "SessionNotFound",
    "SessionOptions",
    "SnapshotError",
    "SnapshotManifest",
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
    "stop_fork_servers",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelexec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
