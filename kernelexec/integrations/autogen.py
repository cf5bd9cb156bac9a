"""kernelexec as an AutoGen 0.4+ code executor (``autogen_core.code_executor.CodeExecutor``).

::

    from autogen_agentchat.agents import CodeExecutorAgent
    from kernelexec.integrations.autogen import KernelExecCodeExecutor

    async with KernelExecCodeExecutor(kind="kernel", timeout=60) as executor:
        agent = CodeExecutorAgent("executor", code_executor=executor, approval_func=...)

Cancelling the ``CancellationToken`` interrupts the running block: a kernel gets an interrupt
and keeps its state, a process is killed; ``execute_code_blocks`` then raises
``asyncio.CancelledError`` as AutoGen's contract says. The executor is a component, so
``dump_component()`` / ``CodeExecutor.load_component()`` round-trip its configuration.

Install with ``pip install 'kernelexec[autogen]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Literal

from .._executor import AsyncExecutor, SyncExecutor
from .._types import ExecutionResult
from ._common import make_async_executor, missing_framework

try:
    from autogen_core import CancellationToken, Component
    from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult
    from pydantic import BaseModel
    from typing_extensions import Self
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_framework("kernelexec.integrations.autogen", "autogen", exc) from exc

__all__ = ["KernelExecCodeExecutor", "KernelExecCodeExecutorConfig", "KernelExecCodeResult"]


@dataclass
class KernelExecCodeResult(CodeResult):
    """AutoGen's ``CodeResult`` plus the files made and kernelexec's full result."""

    output_files: list[str] = field(default_factory=list)
    code_file: str | None = None
    result: ExecutionResult | None = field(default=None, repr=False)


class KernelExecCodeExecutorConfig(BaseModel):
    """What ``dump_component()`` records; enough to build an equivalent executor."""

    kind: Literal["kernel", "command"] = "kernel"
    work_dir: str | None = None
    timeout: float = 60.0
    python: str | None = None


class KernelExecCodeExecutor(CodeExecutor, Component[KernelExecCodeExecutorConfig]):
    """An AutoGen code executor backed by a kernelexec executor (stateful kernel by default).

    Give an async executor to wrap it (it stays yours to close), or ``kind`` and options to have
    one built; ``stop()`` closes only an executor this adapter built.
    """

    component_config_schema = KernelExecCodeExecutorConfig
    component_provider_override = "kernelexec.integrations.autogen.KernelExecCodeExecutor"

    def __init__(
        self,
        executor: AsyncExecutor | None = None,
        *,
        kind: Literal["kernel", "command"] = "kernel",
        work_dir: str | None = None,
        timeout: float = 60.0,
        python: str | None = None,
    ) -> None:
        if isinstance(executor, SyncExecutor):
            raise TypeError(
                "pass an async executor (AsyncKernelExecutor, AsyncCommandLineExecutor): a "
                "synchronous one runs on its own event-loop thread, AutoGen runs on yours"
            )
        self._config = KernelExecCodeExecutorConfig(
            kind=kind, work_dir=work_dir, timeout=timeout, python=python
        )
        self._owned = executor is None
        self._interrupting: asyncio.Future[Any] | None = None
        self._executor = executor if executor is not None else self._build()
        if executor is not None:
            self._config = _config_of(executor)

    @property
    def executor(self) -> AsyncExecutor:
        """The kernelexec executor that runs the blocks."""
        return self._executor

    @property
    def work_dir(self) -> str:
        return str(self._executor.work_dir)

    async def execute_code_blocks(
        self, code_blocks: list[CodeBlock], cancellation_token: CancellationToken
    ) -> KernelExecCodeResult:
        if cancellation_token.is_cancelled():
            raise asyncio.CancelledError("cancelled before the code ran")
        task = asyncio.ensure_future(self._executor.execute_code_blocks(code_blocks))
        cancelled = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_cancel() -> None:  # may be called from any thread, even after the loop closed
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._stop_block, task, cancelled)

        cancellation_token.add_callback(on_cancel)
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not cancelled.is_set():  # our caller was cancelled, not the token
                task.cancel()
            raise
        if cancelled.is_set():
            raise asyncio.CancelledError("the code was interrupted by the cancellation token")
        return KernelExecCodeResult(
            exit_code=result.exit_code,
            output=result.output,
            output_files=result.output_files,
            code_file=result.code_file,
            result=result,
        )

    def _stop_block(self, task: asyncio.Future[ExecutionResult], cancelled: asyncio.Event) -> None:
        if task.done():
            return
        cancelled.set()
        interrupt = getattr(self._executor, "interrupt", None)
        if interrupt is None:
            # A process per block: cancelling kills its process group, nothing else is lost.
            task.cancel()
        else:
            # A kernel: interrupt the block, let it finish with KeyboardInterrupt, keep state.
            self._interrupting = asyncio.ensure_future(interrupt())

    async def start(self) -> None:
        if self._executor.closed and self._owned:
            self._executor = self._build()
        await self._executor.start()

    async def stop(self) -> None:
        if self._owned:
            await self._executor.close()

    async def restart(self) -> None:
        await self._executor.restart()

    def _build(self) -> AsyncExecutor:
        options: dict[str, Any] = {"timeout": self._config.timeout}
        if self._config.work_dir is not None:
            options["work_dir"] = self._config.work_dir
        if self._config.python is not None:
            options["python"] = self._config.python
        return make_async_executor(self._config.kind, **options)

    def _to_config(self) -> KernelExecCodeExecutorConfig:
        return self._config.model_copy()

    @classmethod
    def _from_config(cls, config: KernelExecCodeExecutorConfig) -> Self:
        return cls(
            kind=config.kind, work_dir=config.work_dir, timeout=config.timeout, python=config.python
        )


def _config_of(executor: AsyncExecutor) -> KernelExecCodeExecutorConfig:
    """The configuration that rebuilds ``executor`` (a temporary work dir is not carried)."""
    kind: Literal["kernel", "command"] = "kernel" if executor.kind == "kernel" else "command"
    python = getattr(executor, "python", None)
    if python is None:
        with contextlib.suppress(AttributeError):
            python = executor.backend.python  # type: ignore[attr-defined]
    owns_dir = getattr(executor, "_owns_work_dir", False)
    return KernelExecCodeExecutorConfig(
        kind=kind,
        work_dir=None if owns_dir else str(executor.work_dir),
        timeout=executor.timeout,
        python=None if python is None else str(python),
    )
