"""kernelexec executors for classic AG2 (the AutoGen 0.2 line: ``autogen.coding``).

Every kernelexec executor already satisfies AG2's ``CodeExecutor`` protocol, so
``ConversableAgent(code_execution_config={"executor": KernelExecutor()})`` works as it is. This
adapter goes further: it behaves as AG2's own executors do where kernelexec's native API differs
(the README's agents section has the table). Its extractor returns AG2's ``CodeBlock`` with the
language tag as written (``bash`` stays ``bash``); ``execution_policies`` saves html, css and
javascript blocks to a file instead of running them; a command executor honours AG2's first-line
file names (``# test.py``, kept inside the work dir); ``pip install`` lines are quietened; a
kernel runs a shell block of IPython ``!command`` lines as IPython does; results are AG2
``CodeResult`` models carrying ``output_files`` and ``code_file``::

    from autogen import ConversableAgent
    from kernelexec.integrations.ag2 import AG2CodeExecutor

    executor = AG2CodeExecutor(kind="kernel", timeout=60)
    agent = ConversableAgent("executor", llm_config=False,
                             code_execution_config={"executor": executor})

``kind`` is any executor name of the registry (``kernel``, ``command``, ``docker-kernel``,
``docker-command``, ``gateway``); ``DockerCommandLineCodeExecutor`` takes AG2's constructor
arguments for its Docker executor.

Install with ``pip install 'kernelexec[ag2]'`` (AG2 < 1; from 1.0 AG2 dropped ``autogen``, see
``kernelexec.integrations.ag2x``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from .._door import Door
from .._errors import DangerousCommand, KernelExecError, WorkDirNotFound
from .._executor import SyncExecutor, combine_results, error_result
from .._extract import DISPLAY_ONLY, MarkdownCodeExtractor, extract_code_blocks, normalize_language
from .._extract import _content_text as content_text
from .._guard import REFUSAL, dangerous_command
from .._types import CodeBlock as NativeBlock
from .._types import ExecutionResult
from .._workdir import filename_from_code, resolve_inside
from ._common import (
    as_peers_do,
    branching,
    docker_peer_options,
    make_executor,
    missing_framework,
    quiet_pip,
)

try:
    from autogen.coding.base import CodeBlock, CodeResult
    from pydantic import ConfigDict, Field
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_framework("kernelexec.integrations.ag2", "ag2", exc) from exc

__all__ = [
    "DEFAULT_EXECUTION_POLICY",
    "AG2CodeExecutor",
    "AG2CodeExtractor",
    "DockerCommandLineCodeExecutor",
    "KernelExecCodeResult",
]

#: AG2's default policy per language tag: run, or only save to a file (html, css, javascript)
DEFAULT_EXECUTION_POLICY: Mapping[str, bool] = {
    **dict.fromkeys(("bash", "shell", "sh", "pwsh", "powershell", "ps1", "python"), True),
    **dict.fromkeys(("javascript", "html", "css"), False),
}
# Tags AG2 reads as another: its Docker executor's aliases, and Python's spellings.
_TAG_ALIASES = {"py": "python", "js": "javascript", "python3": "python"}
_SHELL_TAGS = frozenset({"bash", "shell", "sh", "pwsh", "powershell", "ps1"})
# The tags AG2's sanitize_command checks (its local command-line executor, before each block).
_SANITIZED_TAGS = frozenset({"bash", "shell", "sh"})

# AG2 names a block's file on its first line, with or without "filename:", in the comment
# syntax of the block's language.
_FIRST_LINE_NAME = (
    re.compile(r"^<!-- (?:filename:)?(.+?) -->$"),
    re.compile(r"^/\* (?:filename:)?(.+?) \*/$"),
    re.compile(r"^// (?:filename:)?(.+)$"),
    re.compile(r"^# (?:filename:)?(.+)$"),
)


def ag2_filename(code: str) -> str | None:
    """The file name AG2 reads from a block's first line (``# test.py``), if any."""
    first = code.split("\n", 1)[0].strip()
    for pattern in _FIRST_LINE_NAME:
        match = pattern.match(first)
        if match:
            return match.group(1).strip() or None
    return None


class KernelExecCodeResult(CodeResult):
    """AG2's ``CodeResult`` with the fields of its IPython and command-line results."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    output_files: list[str] = Field(default_factory=list, description="Files the code made.")
    code_file: str | None = Field(default=None, description="Where the first block was saved.")
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
    """AG2's ``CodeExtractor``: code blocks found as CommonMark finds them (inside list items
    and block quotes too), returned as AG2 ``CodeBlock``s with the tag as written.

    Blocks tagged with a language of ``keep`` (the executor's ``execution_policies``: html and
    css too, which kernelexec's native extraction drops as display-only) are kept, as AG2's
    extractor keeps them for its executor to save; other display-only tags (``text``,
    ``json``...) are still dropped.
    """

    def __init__(
        self,
        extractor: MarkdownCodeExtractor | None = None,
        keep: Collection[str] = DEFAULT_EXECUTION_POLICY,
    ) -> None:
        self._extractor = extractor or MarkdownCodeExtractor()
        self._keep = keep  # the executor's policies, read at each call (they may change)

    def extract_code_blocks(self, message: Any) -> list[CodeBlock]:
        if type(self._extractor) is not MarkdownCodeExtractor:  # a custom extractor: as it says
            found = self._extractor.extract_code_blocks(message)
        else:
            found = [
                block
                for block in extract_code_blocks(
                    content_text(message), keep_display_only=True, canonical=False
                )
                if self._wanted(block.language)
            ]
        return [CodeBlock(code=b.code, language=_ag2_language(b.language, b.code)) for b in found]

    def _wanted(self, tag: str) -> bool:
        lowered = tag.lower()
        return normalize_language(lowered) not in DISPLAY_ONLY or lowered in self._keep


class AG2CodeExecutor:
    """An AG2 ``CodeExecutor`` over a kernelexec executor (stateful kernel by default).

    Give an executor to wrap it (it stays yours to close), or ``kind=`` and executor options to
    have one built (closed by ``close()``). ``execution_policies`` maps language tags to run
    (``True``) or save only (``False``), over the class's ``DEFAULT_EXECUTION_POLICY``.

    A ``work_dir`` that does not exist is made, as AG2's command-line executors make it: the
    folder itself, never a missing parent (``WorkDirNotFound``, a ``FileNotFoundError``).
    ``sanitize`` refuses ``bash``/``shell``/``sh`` blocks holding a dangerous command
    (``rm -rf``, ``dd``, ...) with ``DangerousCommand`` (a ``ValueError``, AG2's message), as
    AG2's ``LocalCommandLineCodeExecutor`` does: by default for ``kind="command"`` (the host's
    own processes), as in AG2, whose other executors do not check.
    """

    #: AG2's default policy per language tag (a class attribute, as AG2's executors have it)
    DEFAULT_EXECUTION_POLICY: ClassVar[dict[str, bool]] = dict(DEFAULT_EXECUTION_POLICY)

    def __init__(
        self,
        executor: SyncExecutor[Any] | None = None,
        *,
        kind: str = "kernel",
        execution_policies: Mapping[str, bool] | None = None,
        sanitize: bool | None = None,
        **options: Any,
    ) -> None:
        if executor is not None and options:
            raise ValueError("give either an executor or executor options, not both")
        self._owned = executor is None
        self._given_work_dir = options.get("work_dir")
        self._given_timeout = options.get("timeout")
        if self._given_work_dir is not None:
            make_ag2_work_dir(Path(self._given_work_dir))
        self.sanitize = (executor is None and kind == "command") if sanitize is None else sanitize
        self.executor: SyncExecutor[Any] = executor or make_executor(
            kind, **as_peers_do(kind, options)
        )
        self.execution_policies: dict[str, bool] = dict(self.DEFAULT_EXECUTION_POLICY)
        self.execution_policies.update(execution_policies or {})
        self._extractor = AG2CodeExtractor(self.executor.code_extractor, self.execution_policies)

    @property
    def code_extractor(self) -> AG2CodeExtractor:
        return self._extractor

    @property
    def work_dir(self) -> Path:
        """The work dir as given (as AG2's executors keep it), else the executor's."""
        if self._given_work_dir is not None:
            return Path(self._given_work_dir)
        return self.executor.work_dir

    @property
    def timeout(self) -> float:
        """The timeout as given, else the executor's."""
        return self._given_timeout if self._given_timeout is not None else self.executor.timeout

    @property
    def stateful(self) -> bool:
        """Whether blocks share state (a kernel, as AG2's IPython executors)."""
        return bool(self.executor.aio.kind == "kernel")

    def execute_code_blocks(self, code_blocks: list[Any]) -> KernelExecCodeResult:
        """Run (or save) the blocks in order, stopping at the first failure (AG2's rule)."""
        results: list[ExecutionResult] = []
        for block in code_blocks:
            result = self._execute_one(block)
            results.append(result)
            if not result.ok:
                break
        combined = combine_results(results)
        first_file = next((r.code_file for r in results if r.code_file), None)
        if combined.code_file != first_file:  # AG2 reports the first block's file
            combined = dataclasses.replace(combined, code_file=first_file)
        if not self.stateful and len(results) > 1:
            # AG2's command-line executor appends each block's output as it is (its IPython
            # executor joins them with a newline, as combine_results does).
            combined = dataclasses.replace(combined, output="".join(r.output for r in results))
        return KernelExecCodeResult.from_result(combined)

    def _execute_one(self, block: Any) -> ExecutionResult:
        tag = (getattr(block, "language", "") or "").strip().lower()
        code = str(block.code)
        if self.sanitize and tag in _SANITIZED_TAGS:
            why = dangerous_command(code)
            if why is not None:  # AG2 raises before running the block (earlier ones ran)
                raise DangerousCommand(REFUSAL + why)
        tag = _TAG_ALIASES.get(tag, tag)
        language = normalize_language(tag) if tag else ""
        ipython = self.stateful and language == "shell" and _has_ipython_lines(code)
        if ipython:
            language = "python"  # as AG2's IPython executor runs it: IPython, ! lines included
        if language in ("python", "shell"):
            code = quiet_pip(code, python=language == "python")
        if not self.execution_policies.get(tag, self.execution_policies.get(language, True)):
            return self._save_only(code, tag)
        if not self.stateful and filename_from_code(code) is None:
            name = ag2_filename(code)
            if name is not None:  # AG2's "# test.py": kernelexec's own spelling, same place
                _, _, rest = code.partition("\n")
                code = f"# filename: {name}\n{rest}"
        run_as = "python" if ipython else (tag or language)
        return self.executor.execute_code_blocks([NativeBlock(code=code, language=run_as)])

    def _save_only(self, code: str, tag: str) -> ExecutionResult:
        """AG2's save-only policy: write the block to its file, run nothing."""
        name = ag2_filename(code)
        if name is None:
            digest = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()[:16]
            name = f"tmp_code_{digest}.{'py' if tag == 'python' else tag or 'txt'}"
        try:
            path = resolve_inside(self.executor.work_dir, name)
            with Door(self.executor.work_dir) as door:  # no link planted there is followed
                door.write_bytes(path, code.encode("utf-8", errors="replace"))
        except (KernelExecError, OSError) as exc:
            return error_result(f"Filename is not in the workspace: {exc}", language=tag)
        return ExecutionResult(
            exit_code=0, output=f"Code saved to {path}\n", code_file=str(path), language=tag
        )

    def restart(self) -> None:
        """Called by AG2 when the agent is reset: for a kernel, a fresh one."""
        self.executor.restart()

    # AG2's CodeExecutor protocol has no place for these: they are kernelexec's own, for an
    # agent that branches (give each fork to its own ConversableAgent as code_execution_config).
    def fork(self, n: int | None = None) -> Any:
        """A new ``AG2CodeExecutor`` (``n``: a list of that many) whose kernel holds this one's
        state and whose work dir is a copy (``KernelExecutor.fork``); each is closed by its
        own ``close()``. A command executor has no state to fork: ``ForkUnsupported``."""
        forked = branching(self.executor, "fork")(n)
        children = [self._adopt(child) for child in (forked if n is not None else [forked])]
        return children if n is not None else children[0]

    def _adopt(self, executor: SyncExecutor[Any]) -> AG2CodeExecutor:
        child = AG2CodeExecutor(
            executor, execution_policies=self.execution_policies, sanitize=self.sanitize
        )
        child._owned = True  # a fork is the adapter's own, whoever made the parent
        return child

    def snapshot(self, path: str | Path | None = None, *, key: Any = None) -> Any:
        """``KernelExecutor.snapshot``: a live snapshot, or with ``path`` a durable one."""
        return branching(self.executor, "snapshot")(path, key=key)

    def restore(self, snapshot: Any, *, key: Any = None) -> Any:
        """``KernelExecutor.restore``: a live snapshot made current, or a durable one loaded."""
        return branching(self.executor, "restore")(snapshot, key=key)

    def close(self) -> None:
        """Close the executor if this adapter built it."""
        if self._owned:
            self.executor.close()

    def stop(self) -> None:
        """AG2's Docker executor's name for ``close()``."""
        self.close()

    def __enter__(self) -> AG2CodeExecutor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class DockerCommandLineCodeExecutor(AG2CodeExecutor):
    """Drop-in for AG2's ``DockerCommandLineCodeExecutor`` on kernelexec's Docker command
    executor (a locked-down container; ``image`` defaults to kernelexec's image).

    Takes AG2's arguments: ``image``, ``container_name``, ``timeout``, ``work_dir``, ``bind_dir``
    (the work dir's path on the Docker host, for Docker out of Docker), ``auto_remove``,
    ``stop_container``, ``execution_policies`` and ``container_create_kwargs`` (extra
    ``containers.run`` arguments). As in AG2 the container starts in the constructor, and an
    empty list of blocks is a ``ValueError``.
    """

    def __init__(
        self,
        image: str | None = None,
        container_name: str | None = None,
        timeout: int = 60,
        work_dir: str | Path | None = None,
        bind_dir: str | Path | None = None,
        auto_remove: bool = True,
        stop_container: bool = True,
        execution_policies: Mapping[str, bool] | None = None,
        *,
        container_create_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if timeout < 1:
            raise ValueError("Timeout must be greater than or equal to 1.")  # AG2's rule
        options = docker_peer_options(
            image=image,
            container_name=container_name,
            bind_dir=bind_dir,
            auto_remove=auto_remove,
            stop_container=stop_container,
            run_kwargs=container_create_kwargs,
        )
        if work_dir is not None:
            options["work_dir"] = work_dir
        super().__init__(
            kind="docker-command",
            execution_policies=execution_policies,
            timeout=timeout,
            **options,
        )
        self._bind_dir = None if bind_dir is None else Path(bind_dir)
        try:
            self.executor.start()
        except BaseException:
            self.executor.close()
            raise

    @property
    def bind_dir(self) -> Path:
        """The directory mounted into the container: ``bind_dir`` if given, else the work dir."""
        return self._bind_dir or self.work_dir

    def execute_code_blocks(self, code_blocks: list[Any]) -> KernelExecCodeResult:
        if not code_blocks:
            raise ValueError("No code blocks to execute.")  # AG2's rule
        return super().execute_code_blocks(code_blocks)


def make_ag2_work_dir(path: Path) -> None:
    """Make the work dir as AG2's command-line executors do (``mkdir(exist_ok=True)``): the
    folder itself when its parent exists; a missing parent is an error, never a chain made
    (``/invalid/directory`` stays absent)."""
    try:
        path.mkdir(exist_ok=True)
    except FileNotFoundError as exc:
        raise WorkDirNotFound(
            f"cannot make the work dir {path}: {path.parent} does not exist (as in AG2, the "
            "folder is made, never the folders above it)"
        ) from exc


def _ag2_language(language: str, code: str) -> str:
    """The block's language as AG2 names it: kernelexec reads an untagged command line as
    "shell"; AG2 calls a ``pip``/``python`` one "sh" (both run as shell)."""
    if language in ("", "shell") and _infer_tag(code):
        return "sh"
    return language


def _infer_tag(code: str) -> str:
    """AG2's guess for an untagged block that is not Python: a command line starting with
    ``pip`` or ``python`` is ``sh``."""
    return "sh" if code.startswith(("pip", "python ", "python3 ")) else ""


def _has_ipython_lines(code: str) -> bool:
    """Whether a block holds IPython's ``!command`` or ``%magic`` lines."""
    return any(line.lstrip().startswith(("!", "%")) for line in code.splitlines())
