"""Running a notebook: papermill-style parameters, its code cells in order, outputs written back.

``run_notebook`` reads a notebook, injects parameters after the cell tagged ``parameters``, runs
its code cells in order on a stateful executor (given, named through the registry, or a local
kernel from the notebook's kernelspec) and writes each cell's outputs back as it finishes.
"""

from __future__ import annotations

import ast
import keyword
import os
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbformat import NotebookNode

from ._door import Door
from ._errors import NotebookError
from ._executor import AsyncExecutor, SyncExecutor, check_timeout, executor_label
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


def inject_parameters(nb: NotebookNode, parameters: Mapping[str, Any]) -> NotebookNode:
    """Insert a cell tagged ``injected-parameters`` after the ``parameters`` cell (papermill's way).

    Without a ``parameters`` cell it goes first, with a warning (papermill's behaviour: the
    notebook's own assignments may then overwrite the values); a cell injected by an earlier run
    is replaced.
    """
    cell = new_code_cell(source=parameters_source(parameters))
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


def check_kernelspec(name: str) -> None:
    """Raise a ``NotebookError`` naming ``name`` when no such kernelspec is installed."""
    manager = KernelSpecManager()
    try:
        manager.get_kernel_spec(name)
    except NoSuchKernel:
        installed = ", ".join(sorted(manager.find_kernel_specs())) or "none"
        raise NotebookError(
            f"the notebook's kernelspec {name!r} is not installed (installed: {installed}); "
            "install it, or choose an executor with --executor"
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
) -> NotebookNode:
    """The async form of ``run_notebook``; ``executor`` None means a local kernel."""
    nb, source = _prepare(path, parameters)
    run = _Run(nb, output_path, timeout, allow_errors=allow_errors, progress=progress)
    if executor is not None:
        _check_stateful(executor)
        return await run.execute(executor)
    folder = files_folder(source, output_path, output_files)
    async with AsyncKernelExecutor(
        **_kernel_options(nb, Path(work_dir or source.parent), timeout, folder)
    ) as owned:
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
    """
    nb, source = _prepare(path, parameters)
    run = _Run(nb, output_path, timeout, allow_errors=allow_errors, progress=progress)
    if isinstance(executor, SyncExecutor):
        return _run_on(executor, run)
    folder = files_folder(source, output_path, output_files)
    owned = _build_executor(executor, nb, Path(work_dir or source.parent), timeout, folder)
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
    nb: NotebookNode, work_dir: Path, timeout: float, outputs_dir: str | None
) -> dict[str, Any]:
    name = kernelspec_name(nb)
    options: dict[str, Any] = {
        "work_dir": work_dir,
        "timeout": timeout,
        "outputs_dir": outputs_dir,
    }
    if name is not None:
        check_kernelspec(name)
        options["kernel_name"] = name
    return options


def _build_executor(
    name: str | None, nb: NotebookNode, work_dir: Path, timeout: float, outputs_dir: str | None
) -> SyncExecutor[Any]:
    """A local kernel from the notebook's kernelspec, or the executor ``name`` stands for."""
    if name is None or name == "kernel":
        return KernelExecutor(**_kernel_options(nb, work_dir, timeout, outputs_dir))
    return make_executor(name, work_dir=work_dir, timeout=timeout, outputs_dir=outputs_dir)
