"""kernelexec: run code written by LLM agents, statefully in IPython kernels or statelessly.

The public API is what ``__all__`` lists; everything in a ``_module`` is private.
"""

from ._command import AsyncCommandLineExecutor, CommandLineExecutor
from ._docker import DockerOptions
from ._errors import (
    BackendUnavailable,
    DockerUnavailable,
    ExecutionTimeout,
    ExecutorClosed,
    GatewayAuthError,
    GatewayUnavailable,
    ImageNotFound,
    InvalidBlock,
    KernelDied,
    KernelExecError,
    KernelStartFailed,
    NotebookError,
    PoolExhausted,
    SessionError,
    SessionLimitReached,
    SessionNotFound,
)
from ._executor import AsyncExecutor, ExecutorOptions, SyncExecutor
from ._extract import MarkdownCodeExtractor, extract_code_blocks, normalize_language
from ._kernel import AsyncKernelExecutor, KernelExecutor
from ._notebook import run_notebook, run_notebook_async
from ._types import CodeBlock, ErrorInfo, ExecutionResult
from ._version import __version__
from .backends.base import CommandBackend, CommandOutcome, KernelBackend
from .backends.docker_command import DockerCommand
from .backends.docker_kernel import DockerKernel
from .backends.gateway_kernel import GatewayKernel, GatewayOptions
from .backends.local_command import LocalCommand
from .backends.local_kernel import LocalKernel
from .pool import (
    AsyncKernelPool,
    AsyncSessionManager,
    KernelPool,
    PoolOptions,
    SessionManager,
    SessionOptions,
)

__all__ = [
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
]
