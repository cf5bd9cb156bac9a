"""kernelexec executors for classic AG2 (the AutoGen 0.2 line: ``autogen.coding``).

Every kernelexec executor already satisfies AG2's ``CodeExecutor`` protocol, so
``ConversableAgent(code_execution_config={"executor": KernelExecutor()})`` works as it is. This
adapter goes one step further for code that checks types: its extractor returns AG2's own
``CodeBlock`` and its results are AG2 ``CodeResult`` models carrying ``output_files`` and
``code_file``::

    from autogen import ConversableAgent
    from kernelexec.integrations.ag2 import AG2CodeExecutor

    executor = AG2CodeExecutor(kind="kernel", timeout=60)
    agent = ConversableAgent("executor", llm_config=False,
                             code_execution_config={"executor": executor})

Install with ``pip install 'kernelexec[ag2]'`` (AG2 < 1; from 1.0 AG2 dropped ``autogen``, see
``kernelexec.integrations.ag2x``).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from .._executor import SyncExecutor
from .._extract import MarkdownCodeExtractor
from .._types import ExecutionResult
from ._common import make_executor, missing_framework

try:
    from autogen.coding.base import CodeBlock, CodeResult
    from pydantic import ConfigDict, Field
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_framework("kernelexec.integrations.ag2", "ag2", exc) from exc

__all__ = ["AG2CodeExecutor", "AG2CodeExtractor", "KernelExecCodeResult"]


class KernelExecCodeResult(CodeResult):
    """AG2's ``CodeResult`` with the fields of its IPython and command-line results."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    output_files: list[str] = Field(default_factory=list, description="Files the code made.")
    code_file: str | None = Field(default=None, description="Where the last block was saved.")
    result: ExecutionResult | None = Field(
        default=None, exclude=True, description="kernelexec's full result (outputs, error)."
    )

    @classmethod
    def from_result(cls, result: ExecutionResult) -> KernelExecCodeResult:
        return cls(
            exit_code=result.exit_code,
            output=result.output,
            output_files=result.output_files,
            code_file=result.code_file,
            result=result,
        )


class AG2CodeExtractor:
    """AG2's ``CodeExtractor``: kernelexec's markdown extraction, returning AG2 ``CodeBlock``s."""

    def __init__(self, extractor: MarkdownCodeExtractor | None = None) -> None:
        self._extractor = extractor or MarkdownCodeExtractor()

    def extract_code_blocks(self, message: Any) -> list[CodeBlock]:
        return [
            CodeBlock(code=block.code, language=block.language)
            for block in self._extractor.extract_code_blocks(message)
        ]


class AG2CodeExecutor:
    """An AG2 ``CodeExecutor`` over a kernelexec executor (stateful kernel by default).

    Give an executor to wrap it (it stays yours to close), or ``kind=`` and executor options to
    have one built (closed by ``close()``).
    """

    def __init__(
        self, executor: SyncExecutor[Any] | None = None, *, kind: str = "kernel", **options: Any
    ) -> None:
        if executor is not None and options:
            raise ValueError("give either an executor or executor options, not both")
        self._owned = executor is None
        self.executor: SyncExecutor[Any] = executor or make_executor(kind, **options)
        self._extractor = AG2CodeExtractor(self.executor.code_extractor)

    @property
    def code_extractor(self) -> AG2CodeExtractor:
        return self._extractor

    def execute_code_blocks(self, code_blocks: list[Any]) -> KernelExecCodeResult:
        """Run the blocks in order, stopping at the first failure (AG2's rule)."""
        return KernelExecCodeResult.from_result(self.executor.execute_code_blocks(code_blocks))

    def restart(self) -> None:
        """Called by AG2 when the agent is reset: for a kernel, a fresh one."""
        self.executor.restart()

    def close(self) -> None:
        """Close the executor if this adapter built it."""
        if self._owned:
            self.executor.close()

    def __enter__(self) -> AG2CodeExecutor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
