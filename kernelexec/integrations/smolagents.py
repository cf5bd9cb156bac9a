"""A kernelexec executor for smolagents' ``CodeAgent``: its code runs in a real IPython kernel.

Built like smolagents' own remote executors (its Docker executor also drives a Jupyter kernel):
the agent's tools and variables are sent into the kernel, ``final_answer`` is detected by the
exception smolagents' patched tool raises, the block's print output comes back as the logs and
its last value (an image as a PIL image) as the output. Any kernel executor works: a local
kernel, or ``kind="docker-kernel"`` for a locked-down container::

    from smolagents import CodeAgent
    from kernelexec.integrations.smolagents import KernelExecPythonExecutor

    executor = KernelExecPythonExecutor(kind="docker-kernel")
    agent = CodeAgent(tools=[], model=model, executor=executor)
    agent.run("What is the 20th Fibonacci number?")
    agent.cleanup()  # or executor.cleanup(): the kernel stops

Install with ``pip install 'kernelexec[smolagents]'``.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from .._executor import SyncExecutor
from .._types import ExecutionResult, NbOutput
from ._common import branching, make_executor, missing_framework

try:
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.utils import AgentError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_framework("kernelexec.integrations.smolagents", "smolagents", exc) from exc

__all__ = ["KernelExecPythonExecutor"]

_IMAGE_MIMES = ("image/png", "image/jpeg")


class KernelExecPythonExecutor(RemotePythonExecutor):  # type: ignore[misc]
    """smolagents' ``PythonExecutor`` on a kernelexec kernel (``kind``: a stateful executor).

    ``options`` go to the executor (``timeout=``, ``work_dir=``, ``image=`` for Docker, ...);
    ``executor=`` takes a ready ``SyncExecutor`` instead (it is closed by ``cleanup``).
    ``last_result`` is kernelexec's full result of the last block (outputs, files, timing).
    """

    def __init__(
        self,
        additional_imports: list[str] | None = None,
        logger: AgentLogger | None = None,
        *,
        kind: str = "kernel",
        executor: SyncExecutor[Any] | None = None,
        allow_pickle: bool = False,
        **options: Any,
    ) -> None:
        self.executor = executor if executor is not None else make_executor(kind, **options)
        logger = logger or AgentLogger(level=LogLevel.INFO)
        # smolagents' base class prints "Initializing executor, hold on..." for its remote
        # executors, which start a server here; a kernel starts at the first block, so the
        # line would announce a wait that does not come.
        level, logger.level = logger.level, LogLevel.OFF
        try:
            super().__init__(list(additional_imports or []), logger, allow_pickle=allow_pickle)
        finally:
            logger.level = level
        #: what smolagents' CodeAgent reads after a failed step: ``_print_outputs`` (the
        #: block's printed text) becomes the step's "Execution logs:" section, as with
        #: smolagents' local executor, so the error text holds the error alone
        self.state: dict[str, Any] = {}
        self.last_result: ExecutionResult | None = None
        if self.additional_imports:
            self.installed_packages = self.install_packages(self.additional_imports)

    def run_code_raise_errors(self, code: str) -> Any:
        """Run ``code``; a ``CodeOutput``, or ``AgentError`` with the output the model reads."""
        from smolagents.local_python_executor import CodeOutput

        result = self.executor.execute(code)
        self.last_result = result
        logs = result.stdout
        self.state["_print_outputs"] = logs
        final = _error_output(result.outputs, self.FINAL_ANSWER_EXCEPTION)
        if final is not None:
            value = self._deserialize_final_answer(final.get("evalue", ""), self.allow_pickle)
            return CodeOutput(output=value, logs=logs, is_final_answer=True)
        if not result.ok:
            # The printed text is in ``state`` (the step's "Execution logs:"); the error text
            # is what kernelexec's output holds after it: the traceback, or the timeout note.
            raise AgentError(
                f"Executing code yielded an error:\n{_error_text(result)}", self.logger
            )
        return CodeOutput(output=_last_value(result.outputs), logs=logs, is_final_answer=False)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        if additional_imports:
            names = " ".join(additional_imports)
            result = self.executor.execute(f"%pip install -q {names}")
            self.logger.log(result.output, level=LogLevel.DEBUG)
        return additional_imports

    # smolagents has no place for these (an agent gets one executor): they are kernelexec's
    # own, for tree search: ``CodeAgent(..., executor=executor.fork())`` per branch.
    def fork(self, n: int | None = None) -> Any:
        """A new ``KernelExecPythonExecutor`` (``n``: a list of that many) whose kernel holds
        this one's state (the tools and variables sent, the packages installed) and whose work
        dir is a copy (``KernelExecutor.fork``); each is closed by its own ``cleanup()``."""
        forked = branching(self.executor, "fork")(n)
        children = [self._adopt(child) for child in (forked if n is not None else [forked])]
        return children if n is not None else children[0]

    def _adopt(self, executor: SyncExecutor[Any]) -> KernelExecPythonExecutor:
        child = KernelExecPythonExecutor(
            logger=self.logger, executor=executor, allow_pickle=self.allow_pickle
        )
        # installed in the parent's kernel, so in the fork's too: not installed again
        child.additional_imports = list(self.additional_imports)
        child.installed_packages = list(self.installed_packages)
        return child

    def snapshot(self, path: str | Path | None = None, *, key: Any = None) -> Any:
        """``KernelExecutor.snapshot``: a live snapshot, or with ``path`` a durable one."""
        return branching(self.executor, "snapshot")(path, key=key)

    def restore(self, snapshot: Any, *, key: Any = None) -> Any:
        """``KernelExecutor.restore``: a live snapshot made current, or a durable one loaded."""
        return branching(self.executor, "restore")(snapshot, key=key)

    def cleanup(self) -> None:
        """Stop the kernel (``CodeAgent.cleanup`` and ``with CodeAgent(...)`` call this)."""
        self.executor.close()

    def delete(self) -> None:
        self.cleanup()

    def __enter__(self) -> KernelExecPythonExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _error_text(result: ExecutionResult) -> str:
    """A failed block's output without what it printed to stdout (kept as its logs)."""
    text = result.output
    if result.stdout and text.startswith(result.stdout):
        text = text[len(result.stdout) :]
    return text.lstrip("\n") or str(result.error or f"exit code {result.exit_code}")


def _error_output(outputs: list[NbOutput], ename: str) -> NbOutput | None:
    for output in outputs:
        if output.get("output_type") == "error" and output.get("ename") == ename:
            return output
    return None


def _last_value(outputs: list[NbOutput]) -> Any:
    """The block's value: its ``execute_result`` (an image as PIL), else the last image shown."""
    shown: Any = None
    for output in outputs:
        kind = output.get("output_type")
        if kind not in {"execute_result", "display_data"}:
            continue
        data = output.get("data") or {}
        image = next((data[m] for m in _IMAGE_MIMES if m in data), None)
        if kind == "execute_result":
            return _image(image) if image is not None else data.get("text/plain")
        if image is not None:
            shown = image
    return _image(shown) if shown is not None else None


def _image(payload: str | list[str]) -> Any:
    from PIL import Image

    text = "".join(payload) if isinstance(payload, list) else payload
    return Image.open(io.BytesIO(base64.b64decode(text)))
