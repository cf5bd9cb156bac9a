"""kernelexec as an AG2 1.x ``CodeEnvironment`` (``ag2.tools.code``).

From 1.0 the ``ag2`` package no longer ships the classic ``autogen`` module; agents run code
through a ``CodeEnvironment`` handed to ``SandboxCodeTool``. This one gives them a stateful
kernel (or a process per block)::

    from ag2 import Agent
    from ag2.tools.code import SandboxCodeTool
    from kernelexec.integrations.ag2x import KernelCodeEnvironment

    async with KernelCodeEnvironment(kind="kernel") as env:
        agent = Agent("coder", config=..., tools=[SandboxCodeTool(env)])
        reply = await agent.ask("What is the 14th Fibonacci number?")

Install with ``pip install 'kernelexec[ag2x]'`` (it cannot share an environment with the
classic ``kernelexec[ag2]``: both are the ``ag2`` distribution).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from .._executor import AsyncExecutor, SyncExecutor
from .._types import ExecutionResult
from ._common import as_peers_do, make_async_executor, missing_framework

try:
    from ag2.tools.code import CodeLanguage, CodeRunResult
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_framework("kernelexec.integrations.ag2x", "ag2x", exc) from exc

__all__ = ["KernelCodeEnvironment"]

# AG2's language names -> kernelexec's canonical ones.
_LANGUAGES: dict[CodeLanguage, str] = {"python": "python", "bash": "shell"}


class KernelCodeEnvironment:
    """An AG2 1.x ``CodeEnvironment`` running code in a kernelexec executor.

    Give an async executor to wrap it (it stays yours to close), or ``kind=`` and executor
    options to have one built (closed by ``aclose()`` / ``async with``).
    """

    def __init__(
        self, executor: AsyncExecutor | None = None, *, kind: str = "kernel", **options: Any
    ) -> None:
        if isinstance(executor, SyncExecutor):
            raise TypeError("pass an async executor: AG2 runs tools on your event loop")
        if executor is not None and options:
            raise ValueError("give either an executor or executor options, not both")
        self._owned = executor is None
        self.executor: AsyncExecutor = executor or make_async_executor(
            kind, **as_peers_do(kind, options)
        )
        #: the full kernelexec result of the last run (outputs, files, error)
        self.last_result: ExecutionResult | None = None

    # AG2 deep-copies tools when an agent takes them; a copy must reach the same kernel (and
    # the executor's locks and sockets cannot be copied), so copies are this object.
    def __copy__(self) -> KernelCodeEnvironment:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> KernelCodeEnvironment:
        return self

    @property
    def supported_languages(self) -> tuple[CodeLanguage, ...]:
        runs = set(self.executor.supported_languages)
        return tuple(name for name, ours in _LANGUAGES.items() if ours in runs)

    async def run(self, code: str, language: CodeLanguage, *, context: Any = None) -> CodeRunResult:
        """Run ``code``; a language this environment does not run is a failed result."""
        result = await self.executor.execute(code, _LANGUAGES.get(language, language))
        self.last_result = result
        output = result.output
        if result.files:
            names = ", ".join(_relative(p, self.executor) for p in result.files)
            output = f"{output.rstrip()}\nFiles: {names}" if output.strip() else f"Files: {names}"
        return CodeRunResult(output=output, exit_code=result.exit_code)

    async def aclose(self) -> None:
        if self._owned:
            await self.executor.close()

    async def __aenter__(self) -> KernelCodeEnvironment:
        await self.executor.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _relative(path: Any, executor: AsyncExecutor) -> str:
    try:
        return str(path.relative_to(executor.work_dir))
    except ValueError:
        return str(path)
