"""kernelexec as an AutoGen 0.4+ code executor (``autogen_core.code_executor.CodeExecutor``).

::

    from autogen_agentchat.agents import CodeExecutorAgent
    from kernelexec.integrations.autogen import KernelExecCodeExecutor

    async with KernelExecCodeExecutor(kind="kernel", timeout=60) as executor:
        agent = CodeExecutorAgent("executor", code_executor=executor, approval_func=...)

``kind`` is any executor name of the registry (``kernel``, ``command``, ``docker-kernel``,
``docker-command``, ``gateway``); ``DockerCommandLineCodeExecutor`` takes autogen-ext's
constructor arguments for the Docker command executor.

The adapter behaves as autogen-ext's executors do where the native API differs (see the README's
table): it must be started before use (``ExecutorNotStarted``, a ``RuntimeError``); a kernel's
timeout raises ``TimeoutError`` (``ExecutionTimeout``) as ``JupyterCodeExecutor`` does, a
command's is a result with exit code 124 as ``LocalCommandLineCodeExecutor`` gives; code files
are deleted after the run for the local command executor (``cleanup_temp_files``); images and
HTML go to ``output_files`` without a line in the text.

Cancelling the ``CancellationToken`` interrupts the running block: a kernel gets an interrupt
and keeps its state, a process is killed; ``execute_code_blocks`` then raises
``asyncio.CancelledError`` as AutoGen's contract says. The executor is a component, so
``dump_component()`` / ``CodeExecutor.load_component()`` round-trip its configuration.

Install with ``pip install 'kernelexec[autogen]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ExecutionTimeout, ExecutorNotStarted
from .._executor import AsyncExecutor, SyncExecutor
from .._registry import executor_entry
from .._types import ExecutionResult
from ._common import (
    as_peers_do,
    docker_peer_options,
    make_async_executor,
    missing_framework,
    quiet_pip,
)

try:
    from autogen_core import CancellationToken, Component
    from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult
    from pydantic import BaseModel
    from typing_extensions import Self
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_framework("kernelexec.integrations.autogen", "autogen", exc) from exc

__all__ = [
    "DockerCommandLineCodeExecutor",
    "KernelExecCodeExecutor",
    "KernelExecCodeExecutorConfig",
    "KernelExecCodeResult",
]

logger = logging.getLogger(__name__)

# The lines kernelexec adds to the text for a rich output saved to a file; autogen-ext's
# Jupyter executor saves images and HTML to output_files and adds nothing to the text.
_SAVED = r"\[(?:image/[\w.+-]+|text/html) saved to \S+\]"
_SAVED_AFTER_TEXT = re.compile(rf"\n{_SAVED}(?=\n|$)")
_SAVED_FIRST = re.compile(rf"^{_SAVED}\n?")


@dataclass
class KernelExecCodeResult(CodeResult):
    """AutoGen's ``CodeResult`` plus the files made and kernelexec's full result."""

    output_files: list[str] = field(default_factory=list)
    code_file: str | None = None
    result: ExecutionResult | None = field(default=None, repr=False)


class KernelExecCodeExecutorConfig(BaseModel):
    """What ``dump_component()`` records; enough to build an equivalent executor."""

    kind: str = "kernel"
    work_dir: str | None = None
    timeout: float = 60.0
    python: str | None = None
    cleanup_temp_files: bool | None = None
    raise_on_timeout: bool | None = None
    #: further executor options (``image=`` for a Docker kind, ...), JSON values only
    options: dict[str, Any] | None = None


class KernelExecCodeExecutor(CodeExecutor, Component[KernelExecCodeExecutorConfig]):
    """An AutoGen code executor backed by a kernelexec executor (stateful kernel by default).

    Give an async executor to wrap it (it stays yours to close), or ``kind`` and options to have
    one built; ``stop()`` closes only an executor this adapter built.

    ``cleanup_temp_files`` (default: on for the local ``command`` kind, as autogen-ext's
    ``LocalCommandLineCodeExecutor``) deletes each block's code file after the run; a failure to
    delete is logged. ``raise_on_timeout`` (default: on for kernels, as ``JupyterCodeExecutor``)
    raises ``ExecutionTimeout`` (a ``TimeoutError``) instead of returning exit code 124.
    ``output_dir`` (``JupyterCodeExecutor``'s argument) is where image and HTML files are saved:
    alone, it is the work dir too (the files go under it); with ``work_dir``, a folder inside it.
    """

    component_config_schema = KernelExecCodeExecutorConfig
    component_provider_override = "kernelexec.integrations.autogen.KernelExecCodeExecutor"

    def __init__(
        self,
        executor: AsyncExecutor | None = None,
        *,
        kind: str = "kernel",
        work_dir: str | Path | None = None,
        timeout: float = 60.0,
        python: str | None = None,
        cleanup_temp_files: bool | None = None,
        raise_on_timeout: bool | None = None,
        output_dir: str | Path | None = None,
        **options: Any,
    ) -> None:
        if isinstance(executor, SyncExecutor):
            raise TypeError(
                "pass an async executor (AsyncKernelExecutor, AsyncCommandLineExecutor): a "
                "synchronous one runs on its own event-loop thread, AutoGen runs on yours"
            )
        if executor is not None and options:
            raise ValueError("give either an executor or executor options, not both")
        if timeout < 1:
            raise ValueError("Timeout must be greater than or equal to 1.")  # autogen-ext's rule
        if work_dir is not None and Path(work_dir).resolve() == Path.cwd().resolve():
            warnings.warn(  # as autogen-ext warns
                "Using the current directory as work_dir is deprecated.",
                DeprecationWarning,
                stacklevel=2,
            )
        self._output_dir = None if output_dir is None else Path(output_dir)
        if output_dir is not None:
            if executor is not None:
                raise ValueError("give either an executor or output_dir, not both")
            if work_dir is None:
                work_dir = output_dir  # the files go under it; the kernel runs there too
            elif (folder := _inside(Path(output_dir), Path(work_dir))) is not None:
                options["outputs_dir"] = folder
        executor_entry(kind)  # an unknown name fails here, naming the valid ones
        self._given_work_dir = None if work_dir is None else Path(work_dir)
        self._config = KernelExecCodeExecutorConfig(
            kind=kind,
            work_dir=None if work_dir is None else str(work_dir),
            timeout=timeout,
            python=python,
            cleanup_temp_files=cleanup_temp_files,
            raise_on_timeout=raise_on_timeout,
            options=options or None,
        )
        self._owned = executor is None
        self._started = False
        self._interrupting: asyncio.Future[Any] | None = None
        self._executor = executor if executor is not None else self._build()
        if executor is not None:
            self._config = _config_of(executor, cleanup_temp_files, raise_on_timeout)
        elif python is not None:
            # A relative python= is the caller's now: a rebuild after stop() or a loaded
            # component must not read it against another current directory.
            resolved = _python_of(self._executor)
            if resolved is not None:
                self._config.python = resolved

    @property
    def executor(self) -> AsyncExecutor:
        """The kernelexec executor that runs the blocks."""
        return self._executor

    @property
    def work_dir(self) -> Path:
        """The work dir as given (autogen-ext's property), else the executor's."""
        return self._given_work_dir or self._executor.work_dir

    @property
    def output_dir(self) -> Path:
        """Where image and HTML files go, as given (``JupyterCodeExecutor``'s argument; not
        deprecated there), else the work dir. The current directory warns, as there."""
        if self._output_dir == Path("."):
            warnings.warn(  # as JupyterCodeExecutor warns, when its property is read
                "Using the current directory as output_dir is deprecated",
                DeprecationWarning,
                stacklevel=2,
            )
        return self._output_dir or self.work_dir

    @property
    def timeout(self) -> float:
        return self._config.timeout

    @property
    def cleanup_temp_files(self) -> bool:
        """Whether code files are deleted after each run."""
        if self._config.cleanup_temp_files is not None:
            return self._config.cleanup_temp_files
        return self._executor.kind == "command" and _is_local(self._executor)

    @property
    def raise_on_timeout(self) -> bool:
        """Whether a timeout raises ``ExecutionTimeout`` rather than returning exit code 124."""
        if self._config.raise_on_timeout is not None:
            return self._config.raise_on_timeout
        return self._executor.kind == "kernel"

    async def execute_code_blocks(
        self, code_blocks: list[CodeBlock], cancellation_token: CancellationToken
    ) -> KernelExecCodeResult:
        if not self._started:
            raise ExecutorNotStarted(
                "the executor must be started before executing code: await executor.start() "
                "or use 'async with' (as autogen-ext's executors require)"
            )
        if cancellation_token.is_cancelled():
            raise asyncio.CancelledError("cancelled before the code ran")
        task = asyncio.ensure_future(self._executor.execute_code_blocks(_quietened(code_blocks)))
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
        finally:
            finished = task.done() and not task.cancelled() and task.exception() is None
            if finished and self.cleanup_temp_files:
                _delete_code_files(task.result())
        if cancelled.is_set():
            raise asyncio.CancelledError("the code was interrupted by the cancellation token")
        if result.timed_out and self.raise_on_timeout:
            raise ExecutionTimeout(f"the code ran longer than {self.timeout:g} s: {result.output}")
        output = result.output
        if self._executor.kind == "kernel":
            output = _SAVED_FIRST.sub("", _SAVED_AFTER_TEXT.sub("", output))
        return KernelExecCodeResult(
            exit_code=result.exit_code,
            output=output,
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
        self._started = True

    async def stop(self) -> None:
        self._started = False
        if self._owned:
            await self._executor.close()

    async def restart(self) -> None:
        await self._executor.restart()

    def _build(self) -> AsyncExecutor:
        options: dict[str, Any] = {"timeout": self._config.timeout, **(self._config.options or {})}
        if self._config.work_dir is not None:
            options["work_dir"] = self._config.work_dir
        if self._config.python is not None:
            options["python"] = self._config.python
        return make_async_executor(self._config.kind, **as_peers_do(self._config.kind, options))

    def _to_config(self) -> KernelExecCodeExecutorConfig:
        return self._config.model_copy()

    @classmethod
    def _from_config(cls, config: KernelExecCodeExecutorConfig) -> Self:
        return cls(
            kind=config.kind,
            work_dir=config.work_dir,
            timeout=config.timeout,
            python=config.python,
            cleanup_temp_files=config.cleanup_temp_files,
            raise_on_timeout=config.raise_on_timeout,
            **(config.options or {}),
        )


class DockerCommandLineCodeExecutor(KernelExecCodeExecutor):
    """Drop-in for autogen-ext's ``DockerCommandLineCodeExecutor``, on kernelexec's Docker
    command executor (a locked-down container; ``image`` defaults to kernelexec's image).

    Takes autogen-ext's arguments: ``image``, ``container_name``, ``timeout``, ``work_dir``,
    ``bind_dir`` (the work dir's path on the Docker host, for Docker out of Docker),
    ``auto_remove``, ``stop_container`` and ``delete_tmp_files``. A timeout is a result with
    exit code 124, as there. ``functions``, ``extra_volumes``, ``extra_hosts``,
    ``device_requests`` and ``init_command`` are not supported and raise ``NotImplementedError``.
    """

    def __init__(
        self,
        image: str | None = None,
        container_name: str | None = None,
        *,
        timeout: int = 60,
        work_dir: str | Path | None = None,
        bind_dir: str | Path | None = None,
        auto_remove: bool = True,
        stop_container: bool = True,
        delete_tmp_files: bool = False,
        **unsupported: Any,
    ) -> None:
        _refuse_unsupported(unsupported)
        options = docker_peer_options(
            image=image,
            container_name=container_name,
            bind_dir=bind_dir,
            auto_remove=auto_remove,
            stop_container=stop_container,
        )
        super().__init__(
            kind="docker-command",
            work_dir=work_dir,
            timeout=timeout,
            cleanup_temp_files=delete_tmp_files,
            raise_on_timeout=False,
            **options,
        )
        self._bind_dir = None if bind_dir is None else Path(bind_dir)

    @property
    def bind_dir(self) -> Path:
        """The directory mounted into the container: ``bind_dir`` if given, else the work dir."""
        return self._bind_dir or self.work_dir

    async def execute_code_blocks(
        self, code_blocks: list[CodeBlock], cancellation_token: CancellationToken
    ) -> KernelExecCodeResult:
        if not self._started:
            raise ExecutorNotStarted(
                "Container is not running. Must first be started with either start or a "
                "context manager."
            )
        if not code_blocks:
            raise ValueError("No code blocks to execute.")  # autogen-ext's rule
        return await super().execute_code_blocks(code_blocks, cancellation_token)


_UNSUPPORTED = frozenset(
    {"functions", "functions_module", "extra_volumes", "extra_hosts", "device_requests"}
    | {"init_command"}
)


def _refuse_unsupported(given: dict[str, Any]) -> None:
    for name, value in given.items():
        if name not in _UNSUPPORTED:
            raise TypeError(f"unexpected keyword argument {name!r}")
        if value not in (None, [], (), {}, "functions"):
            raise NotImplementedError(
                f"{name}= of autogen-ext's DockerCommandLineCodeExecutor is not supported by "
                "kernelexec's drop-in"
            )


_PYTHON_TAGS = frozenset({"python", "py", "python3"})
_SHELL_TAGS = frozenset({"bash", "shell", "sh", "pwsh", "powershell", "ps1"})


def _quietened(blocks: list[CodeBlock]) -> list[CodeBlock]:
    """The blocks with ``-qqq`` added to their ``pip install`` lines, as autogen-ext's
    executors do before running them (the code file holds what ran)."""
    quieted = []
    for block in blocks:
        tag = (block.language or "").strip().lower()
        if tag in _PYTHON_TAGS or tag in _SHELL_TAGS:
            code = quiet_pip(block.code, python=tag in _PYTHON_TAGS)
            if code != block.code:
                block = CodeBlock(code=code, language=block.language)
        quieted.append(block)
    return quieted


def _delete_code_files(result: ExecutionResult) -> None:
    """Delete the code file of every block run; a failure to delete is logged, not raised."""
    for block in result.block_results or [result]:
        if block.code_file is None:
            continue
        try:
            Path(block.code_file).unlink(missing_ok=True)
        except OSError as error:
            logger.error("Failed to delete temporary file %s: %s", block.code_file, error)


def _is_local(executor: AsyncExecutor) -> bool:
    backend = getattr(executor, "backend", None)
    return str(getattr(backend, "kind", "local-command")).startswith("local")


def _config_of(
    executor: AsyncExecutor, cleanup: bool | None, raise_on_timeout: bool | None
) -> KernelExecCodeExecutorConfig:
    """The configuration that rebuilds ``executor`` (a temporary work dir is not carried)."""
    label = str(getattr(getattr(executor, "backend", None), "kind", "") or "")
    kind = executor.kind
    if label.startswith("docker-"):
        kind = label
    python = _python_of(executor)
    owns_dir = getattr(executor, "_owns_work_dir", False)
    return KernelExecCodeExecutorConfig(
        kind=kind,
        work_dir=None if owns_dir else str(executor.work_dir),
        timeout=executor.timeout,
        python=python,
        cleanup_temp_files=cleanup,
        raise_on_timeout=raise_on_timeout,
    )


def _python_of(executor: AsyncExecutor) -> str | None:
    """The interpreter ``executor`` runs, as its back end resolved it (an absolute path)."""
    python = getattr(executor, "python", None)
    if python is None:
        with contextlib.suppress(AttributeError):
            python = executor.backend.python  # type: ignore[attr-defined]
    return None if python is None else str(python)


def _inside(output_dir: Path, work_dir: Path) -> str | None:
    """``output_dir`` as the executor's ``outputs_dir``: a folder inside ``work_dir`` (None:
    the work dir itself, where the files go to its default folder)."""
    try:
        relative = output_dir.resolve().relative_to(work_dir.resolve())
    except ValueError:
        raise ValueError(
            f"output_dir {output_dir} must be inside work_dir {work_dir}: kernelexec saves "
            "output files inside the work dir"
        ) from None
    return relative.as_posix() if relative.parts else None
