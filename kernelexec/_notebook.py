"""Running a notebook: papermill-style parameters, its code cells in order, outputs written back.

``run_notebook`` reads a notebook, injects parameters after the cell tagged ``parameters``, runs
its code cells in order on a stateful executor (given, named through the registry, or a local
kernel from the notebook's kernelspec) and writes each cell's outputs back as it finishes.
"""

from __future__ import annotations

import ast
import io
import keyword
import os
import sys
import time
import tokenize
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbformat import NotebookNode

from ._door import Door
from ._errors import NotebookError
from ._executor import (
    AsyncExecutor,
    OutputCallback,
    SyncExecutor,
    check_timeout,
    executor_label,
)
from ._kernel import AsyncKernelExecutor, KernelExecutor
from ._registry import make_executor
from ._session import (
    META_KEY,
    cell_outputs,
    new_code_cell,
    read_notebook,
    result_metadata,
    write_notebook,
)
from ._types import EXIT_OK, ExecutionResult

PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
DEFAULT_CELL_TIMEOUT = 600.0


# -- parameters -------------------------------------------------------------------------------
def parse_parameter(text: str) -> Any:
    """A ``-p`` value: a Python literal when it parses as one (``3``, ``True``), else the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _tags(cell: NotebookNode) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def parameters_source(parameters: Mapping[str, Any]) -> str:
    lines = ["# Parameters"]
    for name, value in parameters.items():
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"parameter name is not a Python identifier: {name!r}")
        literal = repr(value)
        try:
            ast.literal_eval(literal)
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"parameter {name}: {literal} is not a Python literal") from exc
        lines.append(f"{name} = {literal}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """A parameter the notebook declares: an assignment in its ``parameters`` cell."""

    name: str
    type: str  # the annotation, else the default's type, else "Unknown type" (as papermill)
    default: str  # as written
    help: str  # the comment at the end of its line


def declared_parameters(nb: NotebookNode) -> list[Parameter] | None:
    """The parameters the cell tagged ``parameters`` assigns, in order (None: no such cell).

    Read as papermill reads them: ``name = value`` or ``name: type = value``, with the comment
    after it as the help; a cell that is not valid Python declares nothing.
    """
    cell = next((c for c in nb.cells if PARAMETERS_TAG in _tags(c)), None)
    if cell is None:
        return None
    source = str(cell.source)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    found: dict[str, Parameter] = {}
    for node in tree.body:
        target, annotation, value = _assigned(node)
        if target is None or value is None:
            continue
        default = ast.get_source_segment(source, value) or ""
        kind = ast.get_source_segment(source, annotation) if annotation is not None else None
        found[target] = Parameter(
            name=target,
            type=kind or _literal_type(default),
            default=default,
            help=_line_comment(lines[(node.end_lineno or node.lineno) - 1]),
        )
    return list(found.values())


def _assigned(node: ast.stmt) -> tuple[str | None, ast.expr | None, ast.expr | None]:
    """The name a top-level ``name = ...`` / ``name: T = ...`` assigns, its annotation and
    its value."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        return (target.id if isinstance(target, ast.Name) else None), None, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id, node.annotation, node.value
    return None, None, None


def _literal_type(default: str) -> str:
    try:
        return type(ast.literal_eval(default)).__name__
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return "Unknown type"


def _line_comment(line: str) -> str:
    """The ``# comment`` that ends ``line`` (a ``#`` inside a string is not one)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):
        return ""
    comments = [t.string for t in tokens if t.type == tokenize.COMMENT]
    return comments[-1].lstrip("#").strip() if comments else ""


def _warn_unknown(nb: NotebookNode, parameters: Mapping[str, Any]) -> None:
    """papermill's warning for a parameter the notebook does not declare (often a typo)."""
    declared = declared_parameters(nb)
    if declared is None:
        return  # inject_parameters warns about the missing cell itself
    names = [p.name for p in declared]
    for name in parameters:
        if name not in names:
            listed = ", ".join(names) or "none"
            warnings.warn(
                f"unknown parameter {name!r}: the notebook's parameters cell declares {listed}",
                UserWarning,
                stacklevel=3,
            )


def inject_parameters(nb: NotebookNode, parameters: Mapping[str, Any]) -> NotebookNode:
    """Insert a cell tagged ``injected-parameters`` after the ``parameters`` cell (papermill's way).

    Without a ``parameters`` cell it goes first, with a warning (papermill's behaviour: the
    notebook's own assignments may then overwrite the values); a cell injected by an earlier run
    is replaced.
    """
    cell = new_code_cell(source=parameters_source(parameters))
    _warn_unknown(nb, parameters)
    cell.metadata["tags"] = [INJECTED_TAG]
    if nb.get("nbformat_minor", 0) < 5:
        del cell["id"]  # cell ids are only allowed from nbformat 4.5
    nb.cells = [c for c in nb.cells if INJECTED_TAG not in _tags(c)]
    at = next((i + 1 for i, c in enumerate(nb.cells) if PARAMETERS_TAG in _tags(c)), None)
    if at is None:
        warnings.warn(
            f"the notebook has no cell tagged {PARAMETERS_TAG!r}: the parameters are injected "
            "first, and the notebook's own assignments may overwrite them",
            UserWarning,
            stacklevel=2,
        )
    nb.cells.insert(at or 0, cell)
    return nb


# -- running notebooks ------------------------------------------------------------------------
def notebook_language(nb: NotebookNode) -> str:
    meta = nb.get("metadata", {})
    language = meta.get("kernelspec", {}).get("language") or meta.get("language_info", {}).get(
        "name"
    )
    return str(language or "python")


def kernelspec_name(nb: NotebookNode) -> str | None:
    name = nb.get("metadata", {}).get("kernelspec", {}).get("name")
    return str(name) if name else None


def check_kernelspec(name: str, *, chosen: bool = False) -> None:
    """Raise a ``NotebookError`` naming ``name`` when no such kernelspec is installed
    (``chosen``: the caller named it, not the notebook)."""
    manager = KernelSpecManager()
    try:
        manager.get_kernel_spec(name)
    except NoSuchKernel:
        installed = ", ".join(sorted(manager.find_kernel_specs())) or "none"
        whose = "kernelspec" if chosen else "the notebook's kernelspec"
        instead = "another with -k" if chosen else "an executor with --executor, or -k"
        raise NotebookError(
            f"{whose} {name!r} is not installed (installed: {installed}); "
            f"install it, or choose {instead}"
        ) from None


def _runnable(cell: NotebookNode) -> bool:
    return (
        cell.cell_type == "code"
        and bool(str(cell.source).strip())
        and "skip-execution" not in _tags(cell)
    )


class _Run:
    """One notebook run: the cells to execute, and where and how results are written back."""

    def __init__(
        self,
        nb: NotebookNode,
        output_path: str | os.PathLike[str] | None,
        timeout: float,
        *,
        allow_errors: bool,
        progress: bool,
    ) -> None:
        check_timeout(timeout)
        self.nb = nb
        self.output_path = None if output_path is None else Path(output_path).absolute()
        self.timeout = timeout
        self.allow_errors = allow_errors
        self.progress = progress
        self.language = notebook_language(nb)
        self.kind = ""
        self.count = 0
        self.status: dict[str, Any] = {"status": "ok", "failed_cells": []}
        # the work dir's door while it runs: an output notebook inside the work dir (the
        # notebook's own folder by default) is written through it, past any planted link
        self._door: Door | None = None
        for cell in nb.cells:
            if cell.cell_type == "code":  # stale outputs would look like this run's
                cell.outputs, cell.execution_count = [], None

    def cells(self) -> list[tuple[int, NotebookNode]]:
        return [(i, c) for i, c in enumerate(self.nb.cells) if _runnable(c)]

    def record(self, index: int, cell: NotebookNode, result: ExecutionResult) -> bool:
        """Write the result into the cell; True when the run should go on."""
        self.count += 1
        count = result.execution_count if result.execution_count is not None else self.count
        cell.execution_count = count
        cell.outputs = cell_outputs(result, count)
        cell.metadata[META_KEY] = result_metadata(result, self.kind)
        carry_on = result.exit_code == EXIT_OK or (
            not result.timed_out and (self.allow_errors or "raises-exception" in _tags(cell))
        )
        if result.exit_code != EXIT_OK:
            self.status["failed_cells"].append(index)
        if not carry_on:
            self.status.update(
                status="timeout" if result.timed_out else "error",
                failed_cell=index,
                exit_code=result.exit_code,
                error=str(result.error) if result.error else None,
            )
        self.save()
        return carry_on

    def save(self) -> None:
        self.nb.metadata[META_KEY] = dict(self.status)
        if self.output_path is not None:
            write_notebook(self.nb, self.output_path, door=self._door)

    async def execute(self, executor: AsyncExecutor) -> NotebookNode:
        started = time.perf_counter()
        self.kind = self.status["executor"] = executor_label(executor)
        todo = self.cells()
        self._door = Door(executor.work_dir)
        with self._door, _Progress(self.progress, len(todo)) as advance:
            for index, cell in todo:
                result = await executor.execute(
                    str(cell.source), self.language, timeout=self.timeout
                )
                advance()
                if not self.record(index, cell, result):
                    break
            self.status["duration_s"] = round(time.perf_counter() - started, 3)
            self.save()
        self._door = None
        return self.nb


class _Progress:
    """Progress on stderr: a rich bar when rich is installed, else a line per cell."""

    def __init__(self, enabled: bool, total: int) -> None:
        self._enabled = enabled
        self._total = total
        self._done = 0
        self._bar: Any = None
        self._task: Any = None
        if enabled:
            try:  # rich is optional (the bench extra brings it); imported only when asked for
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TimeElapsedColumn,
                )
            except ImportError:
                return
            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task("cells", total=total)

    def __enter__(self) -> Any:
        if self._bar is not None:
            self._bar.start()
        return self.advance

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.advance(self._task)
        elif self._enabled:
            print(f"cells: {self._done}/{self._total}", file=sys.stderr, flush=True)


def _prepare(
    path: str | os.PathLike[str], parameters: Mapping[str, Any] | None
) -> tuple[NotebookNode, Path]:
    source = Path(path).absolute()
    nb = read_notebook(source)
    if parameters:
        inject_parameters(nb, parameters)
    return nb, source


def _check_stateful(executor: AsyncExecutor) -> None:
    # Cells build on each other; run one per fresh process and every later cell breaks.
    if executor.kind != "kernel":
        raise ValueError(
            f"a notebook needs a stateful (kernel) executor, not {executor_label(executor)!r}"
        )


async def run_notebook_async(
    path: str | os.PathLike[str],
    *,
    executor: AsyncExecutor | None = None,
    output_path: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_CELL_TIMEOUT,
    allow_errors: bool = False,
    parameters: Mapping[str, Any] | None = None,
    progress: bool = False,
    work_dir: str | os.PathLike[str] | None = None,
    output_files: bool = True,
    kernel_name: str | None = None,
    on_output: OutputCallback | None = None,
) -> NotebookNode:
    """The async form of ``run_notebook``; ``executor`` None means a local kernel."""
    nb, source = _prepare(path, parameters)
    run = _Run(nb, output_path, timeout, allow_errors=allow_errors, progress=progress)
    if executor is not None:
        _check_stateful(executor)
        return await run.execute(executor)
    folder = files_folder(source, output_path, output_files)
    options = _kernel_options(nb, Path(work_dir or source.parent), timeout, folder, kernel_name)
    async with AsyncKernelExecutor(**options, on_output=on_output) as owned:
        return await run.execute(owned)


def run_notebook(
    path: str | os.PathLike[str],
    *,
    output_path: str | os.PathLike[str] | None = None,
    executor: SyncExecutor[Any] | str | None = None,
    timeout: float = DEFAULT_CELL_TIMEOUT,
    allow_errors: bool = False,
    parameters: Mapping[str, Any] | None = None,
    progress: bool = False,
    work_dir: str | os.PathLike[str] | None = None,
    output_files: bool = True,
    kernel_name: str | None = None,
    on_output: OutputCallback | None = None,
) -> NotebookNode:
    """Run a notebook's code cells in order and return it with outputs and execution counts.

    ``executor`` is a stateful executor (used, and left open), the name of one (``"kernel"``,
    ``"docker-kernel"``), or None: a local kernel from the notebook's ``kernelspec``, which must
    be installed. The run stops at the first failing cell unless ``allow_errors`` (or the cell is
    tagged ``raises-exception``); a timeout always stops it. How the run ended is in
    ``nb.metadata["kernelexec"]``: ``status`` is ``ok``, ``error`` or ``timeout``. With
    ``output_path`` the notebook is written there (atomically) after every cell. ``parameters``
    are injected papermill-style after the cell tagged ``parameters``. An executor built here
    works in ``work_dir``, by default the notebook's folder (as in Jupyter); the rich outputs it
    saves as files go to a folder named after the output notebook (``report_files/`` for
    ``report.ipynb``), or nowhere with ``output_files=False`` (they are in the notebook anyway).
    ``kernel_name`` runs the local kernel of that kernelspec instead of the notebook's (as
    papermill's ``-k``); ``on_output`` is called with each output as it arrives (an executor
    built here; one you pass keeps its own). A parameter the ``parameters`` cell does not
    assign is warned about (``UserWarning``), as papermill does: it is often a typo.
    """
    nb, source = _prepare(path, parameters)
    run = _Run(nb, output_path, timeout, allow_errors=allow_errors, progress=progress)
    if isinstance(executor, SyncExecutor):
        return _run_on(executor, run)
    folder = files_folder(source, output_path, output_files)
    if kernel_name is not None and executor not in (None, "kernel"):
        raise ValueError(f"kernel_name applies to the local kernel, not to {executor!r}")
    work = Path(work_dir or source.parent)
    options = {"work_dir": work, "timeout": timeout, "outputs_dir": folder, "on_output": on_output}
    owned = _build_executor(executor, nb, options, kernel_name)
    try:
        return _run_on(owned, run)
    finally:
        owned.close()


def _run_on(executor: SyncExecutor[Any], run: _Run) -> NotebookNode:
    _check_stateful(executor.aio)
    # The core belongs to the executor's own event loop, so the whole run goes there.
    return executor.run(run.execute, executor.aio)


def files_folder(
    source: Path, output_path: str | os.PathLike[str] | None, output_files: bool
) -> str | None:
    """Where a run's rich outputs are saved: ``<output notebook's name>_files`` (None: not
    saved, the notebook embeds them)."""
    return f"{Path(output_path or source).stem}_files" if output_files else None


def _kernel_options(
    nb: NotebookNode,
    work_dir: Path,
    timeout: float,
    outputs_dir: str | None,
    kernel_name: str | None = None,
) -> dict[str, Any]:
    name = kernel_name or kernelspec_name(nb)
    options: dict[str, Any] = {
        "work_dir": work_dir,
        "timeout": timeout,
        "outputs_dir": outputs_dir,
    }
    if name is not None:
        check_kernelspec(name, chosen=kernel_name is not None)
        options["kernel_name"] = name
    return options


def _build_executor(
    name: str | None, nb: NotebookNode, options: dict[str, Any], kernel_name: str | None
) -> SyncExecutor[Any]:
    """A local kernel from the notebook's kernelspec (or ``kernel_name``), or the executor
    ``name`` stands for."""
    if name is None or name == "kernel":
        where = (options["work_dir"], options["timeout"], options["outputs_dir"])
        local = _kernel_options(nb, *where, kernel_name)
        return KernelExecutor(**local, on_output=options["on_output"])
    return make_executor(name, **options)
