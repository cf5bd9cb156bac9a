"""kernelexec as an AutoGen 0.4+ code executor (``autogen_core.code_executor.CodeExecutor``).

::

    from autogen_agentchat.agents import CodeExecutorAgent
    from kernelexec.integrations.autogen import KernelExecCodeExecutor

    async with KernelExecCodeExecutor(kind="kernel", timeout=60) as executor:
        agent = CodeExecutorAgent("executor", code_executor=executor, approval_func=...)

``kind`` is any executor name of the registry (``kernel``, ``command``, ``docker-kernel``,
``docker-command``, ``gateway``). ``JupyterCodeExecutor``, ``LocalCommandLineCodeExecutor`` and
``DockerCommandLineCodeExecutor`` are drop-ins under autogen-ext's names: the same constructor
arguments and behaviour (running without ``start()``, a cancelled token, ``functions=``,
``dump_component()``), on kernelexec's executors.

The adapter behaves as autogen-ext's executors do where the native API differs (see the README's
table): it must be started before use (``ExecutorNotStarted``, a ``RuntimeError``); a kernel's
timeout raises ``TimeoutError`` (``ExecutionTimeout``) as ``JupyterCodeExecutor`` does, a
command's is a result with exit code 124 as ``LocalCommandLineCodeExecutor`` gives; code files
are deleted after the run for the local command executor (``cleanup_temp_files``); images and
HTML go to ``output_files`` without a line in the text.

Cancelling the ``CancellationToken`` interrupts the running block: a kernel gets an interrupt
and keeps its state, a process is killed; ``execute_code_blocks`` then raises
``asyncio.CancelledError`` as AutoGen's contract says (the drop-ins answer as their peer).
Each class is a component: ``dump_component()`` / ``CodeExecutor.load_component()`` round-trip
its configuration and give the same class back.

Install with ``pip install 'kernelexec[autogen]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, ClassVar

from .._errors import DockerConfigError, ExecutionTimeout, ExecutorNotStarted, InvalidBlock
from .._executor import AsyncExecutor, SyncExecutor
from .._functions import (
    DEFAULT_MODULE,
    PROMPT_TEMPLATE,
    check_module_name,
    describe_functions,
)
from .._functions import format_functions_for_prompt as _format_for_prompt
from .._registry import executor_entry
from .._types import ExecutionResult
from ..backends._docker_options import WORKSPACE
from ._common import (
    as_peers_do,
    branching,
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
    "JupyterCodeExecutor",
    "KernelExecCodeExecutor",
    "KernelExecCodeExecutorConfig",
    "KernelExecCodeResult",
    "LocalCommandLineCodeExecutor",
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

    #: image and HTML files saved, and files the code made (``Path``, as autogen-ext's)
    output_files: list[Path] = field(default_factory=list)
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
    #: None: ``functions``
    functions_module: str | None = None
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
    alone, it is the work dir too (the files go in it, as there); with ``work_dir``, a folder
    inside it.

    ``functions`` (plain functions, ``FunctionWithRequirements``, their ``from_str`` form) are
    written to ``<functions_module>.py`` in the work dir before the first block runs, their
    packages installed, and loaded once (a kernel has them defined in its session too), as
    autogen-ext's command-line executors do; a module that fails to load raises ``ValueError``
    (``InvalidBlock``). ``format_functions_for_prompt()`` describes them for the LLM.

    Cancelling the token raises ``asyncio.CancelledError`` here (the ``CodeExecutor``
    contract); the drop-in classes answer as the class they replace does.
    """

    component_config_schema = KernelExecCodeExecutorConfig
    component_provider_override = "kernelexec.integrations.autogen.KernelExecCodeExecutor"

    #: the peers' template for ``format_functions_for_prompt``
    FUNCTION_PROMPT_TEMPLATE: ClassVar[str] = PROMPT_TEMPLATE
    #: whether running before ``start()`` raises (autogen-ext's local executor does not)
    _must_start: ClassVar[bool] = True
    _not_started = (
        "the executor must be started before executing code: await executor.start() "
        "or use 'async with' (as autogen-ext's executors require)"
    )

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
        functions: Sequence[Any] = (),
        functions_module: str = DEFAULT_MODULE,
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
        # Checked now, as the peers check them when built; loaded before the first block.
        self._functions = list(functions)
        self._function_specs = describe_functions(self._functions)
        self._functions_module = check_module_name(functions_module)
        self._functions_ready = not self._functions
        self._output_dir = None if output_dir is None else Path(output_dir)
        if output_dir is not None:
            if executor is not None:
                raise ValueError("give either an executor or output_dir, not both")
            if work_dir is None:
                work_dir = output_dir  # the kernel runs there too
            # The files go in output_dir itself, where JupyterCodeExecutor writes them.
            options["outputs_dir"] = _inside(Path(output_dir), Path(work_dir))
        executor_entry(kind)  # an unknown name fails here, naming the valid ones
        self._given_work_dir = None if work_dir is None else Path(work_dir)
        self._config = KernelExecCodeExecutorConfig(
            kind=kind,
            work_dir=None if work_dir is None else str(work_dir),
            timeout=timeout,
            python=python,
            cleanup_temp_files=cleanup_temp_files,
            raise_on_timeout=raise_on_timeout,
            functions_module=None if functions_module == DEFAULT_MODULE else functions_module,
            options=options or None,
        )
        self._owned = executor is None
        self._started = False
        self._interrupting: asyncio.Future[Any] | None = None
        self._executor = executor if executor is not None else self._build()
        if executor is not None:
            self._config = _config_of(executor, cleanup_temp_files, raise_on_timeout)
            self._config.functions_module = (
                None if self._functions_module == DEFAULT_MODULE else self._functions_module
            )
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
    def functions(self) -> list[Any]:
        """The functions the code can import from ``functions_module``."""
        return list(self._functions)

    @property
    def functions_module(self) -> str:
        """The module the functions are written to (``from functions import add``)."""
        return self._functions_module

    def format_functions_for_prompt(self, prompt_template: str | None = None) -> str:
        """The functions as stubs for the LLM's prompt (``$module_name``, ``$functions`` in
        the template; the default is autogen-ext's ``FUNCTION_PROMPT_TEMPLATE``)."""
        template = self.FUNCTION_PROMPT_TEMPLATE if prompt_template is None else prompt_template
        return _format_for_prompt(self._function_specs, self._functions_module, template)

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
            if self._must_start:
                raise ExecutorNotStarted(self._not_started)
            await self.start()
        if cancellation_token.is_cancelled():
            return self._cancelled("cancelled before the code ran")
        if not self._functions_ready:
            await self._load_functions()
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
            return self._cancelled("the code was stopped by the cancellation token")
        finally:
            finished = task.done() and not task.cancelled() and task.exception() is None
            if finished and self.cleanup_temp_files:
                _delete_code_files(task.result())
        if cancelled.is_set():
            return self._cancelled("the code was interrupted by the cancellation token")
        if result.timed_out and self.raise_on_timeout:
            raise ExecutionTimeout(f"the code ran longer than {self.timeout:g} s: {result.output}")
        output = result.output
        if self._executor.kind == "kernel":
            output = _SAVED_FIRST.sub("", _SAVED_AFTER_TEXT.sub("", output))
        return KernelExecCodeResult(
            exit_code=result.exit_code,
            output=output,
            output_files=[Path(name) for name in result.output_files],
            code_file=result.code_file,
            result=result,
        )

    def _cancelled(self, why: str) -> KernelExecCodeResult:
        """What a cancelled token gives: kernelexec's contract (the ``CodeExecutor``
        protocol's) raises; a drop-in answers as the class it replaces."""
        raise asyncio.CancelledError(why)

    async def _load_functions(self) -> None:
        """Write, install and load the functions (before the first block, as the peers do)."""
        result = await self._executor.add_functions(self._functions, module=self._functions_module)
        if self.cleanup_temp_files:
            _delete_code_files(result)
        if result.exit_code != 0:
            raise InvalidBlock(f"Functions failed to load: {result.output}")  # a ValueError
        self._functions_ready = True

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
            self._functions_ready = not self._functions  # a new session: load them again
        await self._executor.start()
        self._started = True

    async def stop(self) -> None:
        self._started = False
        if self._owned:
            await self._executor.close()

    async def restart(self) -> None:
        await self._executor.restart()
        self._functions_ready = not self._functions  # a kernel lost the names it had

    # AutoGen's CodeExecutor has start / stop / restart and no place for these: they are
    # kernelexec's own, for an agent that branches (each fork to its own CodeExecutorAgent).
    async def fork(self, n: int | None = None) -> Any:
        """A new, started ``KernelExecCodeExecutor`` (``n``: a list of that many) whose kernel
        holds this one's state (the functions loaded included) and whose work dir is a copy
        (``AsyncKernelExecutor.fork``); each is closed by its own ``stop()``. A command
        executor has no state to fork: ``ForkUnsupported``."""
        forked = await branching(self._executor, "fork")(n)
        children = [self._adopt(child) for child in (forked if n is not None else [forked])]
        return children if n is not None else children[0]

    def _adopt(self, executor: AsyncExecutor) -> KernelExecCodeExecutor:
        child = KernelExecCodeExecutor(
            executor,
            cleanup_temp_files=self._config.cleanup_temp_files,
            raise_on_timeout=self._config.raise_on_timeout,
            functions=self._functions,
            functions_module=self._functions_module,
        )
        # started, the adapter's own, its functions loaded if this one's were (they are state)
        child._owned, child._started = True, True
        child._functions_ready = self._functions_ready
        return child

    async def snapshot(self, path: str | Path | None = None, *, key: Any = None) -> Any:
        """``AsyncKernelExecutor.snapshot``: a live snapshot, or with ``path`` a durable one."""
        return await branching(self._executor, "snapshot")(path, key=key)

    async def restore(self, snapshot: Any, *, key: Any = None) -> Any:
        """``AsyncKernelExecutor.restore``: a live snapshot made current, or a durable one
        loaded into a fresh kernel."""
        return await branching(self._executor, "restore")(snapshot, key=key)

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
            functions_module=config.functions_module or DEFAULT_MODULE,
            **(config.options or {}),
        )


class LocalCommandLineCodeExecutorConfig(BaseModel):
    """``LocalCommandLineCodeExecutor``'s configuration, with autogen-ext's field names."""

    timeout: int = 60
    work_dir: str | None = None
    functions_module: str = DEFAULT_MODULE
    cleanup_temp_files: bool = True


class LocalCommandLineCodeExecutor(KernelExecCodeExecutor):
    """Drop-in for autogen-ext's ``LocalCommandLineCodeExecutor``, on kernelexec's local
    command executor (each block its own process, killed whole at the timeout).

    As there: it runs without ``start()`` (``start()`` and ``stop()`` are accepted), a timeout
    is a result with exit code 124, code files are deleted after the run
    (``cleanup_temp_files``), ``functions`` are importable from ``functions_module``, and a
    cancelled token gives a result with exit code 125 whose output ends with ``Cancelled``
    (the output of blocks run before it in the same call is not kept). ``virtual_env_context``
    (``venv.EnvBuilder().ensure_directories(...)``) runs Python blocks with that venv's
    interpreter and its ``bin`` first on ``PATH``.
    """

    component_config_schema = LocalCommandLineCodeExecutorConfig  # type: ignore[assignment]
    component_provider_override = "kernelexec.integrations.autogen.LocalCommandLineCodeExecutor"
    _must_start = False

    def __init__(
        self,
        timeout: int = 60,
        work_dir: str | Path | None = None,
        functions: Sequence[Any] = (),
        functions_module: str = DEFAULT_MODULE,
        cleanup_temp_files: bool = True,
        virtual_env_context: SimpleNamespace | None = None,
    ) -> None:
        options: dict[str, Any] = {}
        python = None
        if virtual_env_context is not None:
            python = os.path.abspath(virtual_env_context.env_exe)
            venv_bin = os.path.abspath(virtual_env_context.bin_path)
            options["env"] = {"PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")])}
        super().__init__(
            kind="command",
            work_dir=work_dir,
            timeout=timeout,
            python=python,
            cleanup_temp_files=cleanup_temp_files,
            raise_on_timeout=False,
            functions=functions,
            functions_module=functions_module,
            **options,
        )
        self._peer_config = LocalCommandLineCodeExecutorConfig(
            timeout=timeout,
            work_dir=None if work_dir is None else str(work_dir),
            functions_module=functions_module,
            cleanup_temp_files=cleanup_temp_files,
        )

    @property
    def timeout(self) -> int:
        return self._peer_config.timeout

    def _cancelled(self, why: str) -> KernelExecCodeResult:
        # autogen-ext: the process is terminated and the result says so, exit code 125.
        return KernelExecCodeResult(exit_code=125, output="\nCancelled")

    def _to_config(self) -> LocalCommandLineCodeExecutorConfig:  # type: ignore[override]
        return self._peer_config.model_copy()

    @classmethod
    def _from_config(cls, config: LocalCommandLineCodeExecutorConfig) -> Self:  # type: ignore[override]
        return cls(**config.model_dump())


class JupyterCodeExecutorConfig(BaseModel):
    """``JupyterCodeExecutor``'s configuration, with autogen-ext's field names."""

    kernel_name: str = "python3"
    timeout: int = 60
    output_dir: str | None = None


class JupyterCodeExecutor(KernelExecCodeExecutor):
    """Drop-in for autogen-ext's ``JupyterCodeExecutor``, on kernelexec's local kernel.

    As there: it must be started (``start()`` or ``async with``); images and HTML are saved
    in ``output_dir`` itself and listed in ``output_files`` as ``Path`` objects, with no line in
    the text; a timeout raises ``TimeoutError`` (``ExecutionTimeout``); a cancelled token
    raises ``asyncio.CancelledError`` (the kernel is interrupted and keeps its state). Unlike
    there, the kernel runs in ``output_dir`` (a temporary folder when none is given, removed
    at ``stop()``), not in the current directory.
    """

    component_config_schema = JupyterCodeExecutorConfig  # type: ignore[assignment]
    component_provider_override = "kernelexec.integrations.autogen.JupyterCodeExecutor"

    def __init__(
        self,
        kernel_name: str = "python3",
        timeout: int = 60,
        output_dir: str | Path | None = None,
    ) -> None:
        options: dict[str, Any] = {"outputs_dir": "."} if output_dir is None else {}
        if kernel_name != "python3":
            options["kernel_name"] = kernel_name
        super().__init__(
            kind="kernel", timeout=timeout, output_dir=output_dir, raise_on_timeout=True, **options
        )
        self._peer_config = JupyterCodeExecutorConfig(
            kernel_name=kernel_name,
            timeout=timeout,
            output_dir=None if output_dir is None else str(output_dir),
        )

    @property
    def timeout(self) -> int:
        return self._peer_config.timeout

    def _to_config(self) -> JupyterCodeExecutorConfig:  # type: ignore[override]
        return self._peer_config.model_copy()

    @classmethod
    def _from_config(cls, config: JupyterCodeExecutorConfig) -> Self:  # type: ignore[override]
        return cls(**config.model_dump())


class DockerCommandLineCodeExecutorConfig(BaseModel):
    """``DockerCommandLineCodeExecutor``'s configuration, with autogen-ext's field names
    (``image`` None: kernelexec's image)."""

    image: str | None = None
    container_name: str | None = None
    timeout: int = 60
    work_dir: str | None = None
    bind_dir: str | None = None
    auto_remove: bool = True
    stop_container: bool = True
    functions_module: str = DEFAULT_MODULE
    extra_volumes: dict[str, dict[str, str]] = {}
    extra_hosts: dict[str, str] = {}
    init_command: str | None = None
    delete_tmp_files: bool = False


class DockerCommandLineCodeExecutor(KernelExecCodeExecutor):
    """Drop-in for autogen-ext's ``DockerCommandLineCodeExecutor``, on kernelexec's Docker
    command executor (a locked-down container; ``image`` defaults to kernelexec's image).

    Takes autogen-ext's arguments: ``image``, ``container_name``, ``timeout``, ``work_dir``,
    ``bind_dir`` (the work dir's path on the Docker host, for Docker out of Docker),
    ``auto_remove``, ``stop_container``, ``delete_tmp_files``, ``functions`` and
    ``functions_module``, ``extra_volumes`` (``{host_path: {"bind": path, "mode": "ro"}}``:
    read-only unless the mode says ``rw``; a host path that does not exist is an error, not a
    folder made for it), ``extra_hosts``, ``device_requests`` and ``init_command`` (a shell
    command run once in the container when it starts, and again after ``restart()``; a failure
    is logged, as the peer's container ignores it). A timeout is a result with exit code 124; a
    cancelled token gives exit code 1 and ``Code execution was cancelled.``, as there.
    """

    component_config_schema = DockerCommandLineCodeExecutorConfig  # type: ignore[assignment]
    component_provider_override = "kernelexec.integrations.autogen.DockerCommandLineCodeExecutor"
    _not_started = (
        "Container is not running. Must first be started with either start or a context manager."
    )

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
        device_requests: list[Any] | None = None,
        functions: Sequence[Any] = (),
        functions_module: str = DEFAULT_MODULE,
        extra_volumes: dict[str, dict[str, str]] | None = None,
        extra_hosts: dict[str, str] | None = None,
        init_command: str | None = None,
        delete_tmp_files: bool = False,
    ) -> None:
        run_kwargs: dict[str, Any] = {}
        if extra_volumes:
            run_kwargs["mounts"] = _volume_mounts(extra_volumes)
        if extra_hosts:
            run_kwargs["extra_hosts"] = dict(extra_hosts)
        if device_requests:
            run_kwargs["device_requests"] = list(device_requests)
        options = docker_peer_options(
            image=image,
            container_name=container_name,
            bind_dir=bind_dir,
            auto_remove=auto_remove,
            stop_container=stop_container,
            run_kwargs=run_kwargs,
        )
        super().__init__(
            kind="docker-command",
            work_dir=work_dir,
            timeout=timeout,
            cleanup_temp_files=delete_tmp_files,
            raise_on_timeout=False,
            functions=functions,
            functions_module=functions_module,
            **options,
        )
        self._bind_dir = None if bind_dir is None else Path(bind_dir)
        self._init_command = init_command
        self._peer_config = DockerCommandLineCodeExecutorConfig(
            image=image,
            container_name=container_name,
            timeout=timeout,
            work_dir=None if work_dir is None else str(work_dir),
            bind_dir=None if bind_dir is None else str(bind_dir),
            auto_remove=auto_remove,
            stop_container=stop_container,
            functions_module=functions_module,
            extra_volumes=dict(extra_volumes or {}),
            extra_hosts=dict(extra_hosts or {}),
            init_command=init_command,
            delete_tmp_files=delete_tmp_files,
        )

    @property
    def timeout(self) -> int:
        return self._peer_config.timeout

    @property
    def bind_dir(self) -> Path:
        """The directory mounted into the container: ``bind_dir`` if given, else the work dir."""
        return self._bind_dir or self.work_dir

    async def execute_code_blocks(
        self, code_blocks: list[CodeBlock], cancellation_token: CancellationToken
    ) -> KernelExecCodeResult:
        if self._started and not code_blocks:
            raise ValueError("No code blocks to execute.")  # autogen-ext's rule
        return await super().execute_code_blocks(code_blocks, cancellation_token)

    async def start(self) -> None:
        await super().start()
        await self._run_init_command()

    async def restart(self) -> None:
        await super().restart()
        await self._run_init_command()

    async def _run_init_command(self) -> None:
        if not self._init_command:
            return
        result = await self.executor.execute(self._init_command, "sh")
        _delete_code_files(result)  # kernelexec's file, not the caller's
        if result.exit_code != 0:
            logger.warning("init_command failed (exit %s): %s", result.exit_code, result.output)

    def _cancelled(self, why: str) -> KernelExecCodeResult:
        # autogen-ext: the command is killed in the container and the result says so.
        return KernelExecCodeResult(exit_code=1, output="Code execution was cancelled.")

    def _to_config(self) -> DockerCommandLineCodeExecutorConfig:  # type: ignore[override]
        return self._peer_config.model_copy(deep=True)

    @classmethod
    def _from_config(cls, config: DockerCommandLineCodeExecutorConfig) -> Self:  # type: ignore[override]
        return cls(**config.model_dump())


def _volume_mounts(volumes: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """Bind mounts for ``extra_volumes`` (docker-py's ``volumes=`` form), as the engine's
    mount dicts: a missing host path fails at start instead of being made by the engine, and
    a volume is read-only unless its ``mode`` (or ``ro``) says it may be written."""
    mounts = []
    for host, spec in volumes.items():
        target = PurePosixPath(str(spec.get("bind", "")))
        if not target.is_absolute() or target.is_relative_to(WORKSPACE):
            raise DockerConfigError(
                f"extra_volumes: {host!r} needs an absolute 'bind' path outside {WORKSPACE} "
                f"(the work dir's place): {spec!r}"
            )
        if PurePosixPath(WORKSPACE).is_relative_to(target):
            raise DockerConfigError(f"extra_volumes: {target} would hide the work dir {WORKSPACE}")
        if "ro" in spec:
            writable = not spec["ro"]
        else:
            modes = set(str(spec.get("mode", "ro")).split(","))
            if not modes & {"ro", "rw"}:
                raise DockerConfigError(f"extra_volumes: mode must be 'ro' or 'rw': {spec!r}")
            writable = "rw" in modes
        source = os.path.abspath(host)
        mounts.append(
            {"Target": str(target), "Source": source, "Type": "bind", "ReadOnly": not writable}
        )
    return mounts


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


def _inside(output_dir: Path, work_dir: Path) -> str:
    """``output_dir`` as the executor's ``outputs_dir``: a folder inside ``work_dir`` (``"."``:
    the work dir itself)."""
    try:
        relative = output_dir.resolve().relative_to(work_dir.resolve())
    except ValueError:
        raise ValueError(
            f"output_dir {output_dir} must be inside work_dir {work_dir}: kernelexec saves "
            "output files inside the work dir"
        ) from None
    return relative.as_posix()
