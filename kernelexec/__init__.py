"""kernelexec: run code written by LLM agents, statefully in IPython kernels or statelessly.

The public API is what ``__all__`` lists; everything in a ``_module`` is private.
"""

from ._command import AsyncCommandLineExecutor, CommandLineExecutor
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
from ._types import CodeBlock, ErrorInfo, ExecutionResult
from ._version import __version__
from .backends.base import CommandBackend, CommandOutcome, KernelBackend
from .backends.local_command import LocalCommand

__all__ = [
    "AsyncCommandLineExecutor",
    "AsyncExecutor",
    "BackendUnavailable",
    "CodeBlock",
    "CommandBackend",
    "CommandLineExecutor",
    "CommandOutcome",
    "DockerUnavailable",
    "ErrorInfo",
    "ExecutionResult",
    "ExecutionTimeout",
    "ExecutorClosed",
    "ExecutorOptions",
    "GatewayAuthError",
    "GatewayUnavailable",
    "ImageNotFound",
    "InvalidBlock",
    "KernelBackend",
    "KernelDied",
    "KernelExecError",
    "KernelStartFailed",
    "LocalCommand",
    "MarkdownCodeExtractor",
    "NotebookError",
    "PoolExhausted",
    "SessionError",
    "SessionLimitReached",
    "SessionNotFound",
    "SyncExecutor",
    "__version__",
    "extract_code_blocks",
    "normalize_language",
]
