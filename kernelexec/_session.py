"""The session recorder: every executor's session kept as an nbformat v4 notebook.

A session notebook has one code cell per block that ran, built from the block's nbformat v4
outputs (the one output model), so opening it in Jupyter shows what the agent saw. Shell blocks
become ``%%bash`` cells so the notebook re-runs in an IPython kernel. With a path set the notebook
is rewritten after every block through a temporary file in the same folder and ``os.replace``: a
crash of the host process leaves either the previous or the new file, never half of one.

Reading and writing notebook files lives here too (the notebook runner, ``_notebook.py``, uses it).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import stat
import tempfile
import textwrap
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import nbformat
import nbformat.corpus.words
import nbformat.reader
import nbformat.v4
import nbformat.v4.rwbase
from nbformat import NotebookNode

from ._door import Door
from ._errors import InvalidPath, InvalidWorkDir, NotebookError
from ._types import ExecutionResult, NbOutput

# nbformat's functions carry no annotations; these typed names keep mypy --strict meaningful.
new_output: Callable[..., NotebookNode] = nbformat.v4.new_output
new_code_cell: Callable[..., NotebookNode] = nbformat.v4.new_code_cell
new_notebook: Callable[..., NotebookNode] = nbformat.v4.new_notebook
new_markdown_cell: Callable[..., NotebookNode] = nbformat.v4.new_markdown_cell
from_dict: Callable[[Any], NotebookNode] = nbformat.from_dict
random_cell_id: Callable[[], str] = nbformat.corpus.words.generate_corpus_id
_writes: Callable[[NotebookNode], str] = nbformat.writes
_split_lines: Callable[[NotebookNode], NotebookNode] = nbformat.v4.rwbase.split_lines
_reader_reads: Callable[[str], NotebookNode] = nbformat.reader.reads
_convert: Callable[[NotebookNode, int], NotebookNode] = nbformat.convert

#: the key kernelexec's own cell and notebook metadata live under
META_KEY = "kernelexec"

# How a non-Python block is written so that an IPython kernel runs it the same way.
_CELL_MAGICS = {"shell": "%%bash", "powershell": "%%script pwsh"}
_KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
_OUTPUT_TYPES = {"stream", "display_data", "execute_result", "error"}


# -- outputs and cells ------------------------------------------------------------------------
def cell_source(code: str, language: str) -> str:
    """The cell source that re-runs ``code`` in an IPython kernel."""
    magic = _CELL_MAGICS.get(language)
    if magic is None or code.lstrip().startswith("%%"):
        return code
    return f"{magic}\n{code}"


_node: Callable[..., NotebookNode] = NotebookNode  # nbformat's constructor, typed


def to_nb_output(output: Mapping[str, Any], execution_count: int | None) -> NotebookNode | None:
    """A schema-valid nbformat output from an executor's output dict (None: not a cell output).

    Keys the schema does not allow (``transient``, back-end extras) are dropped; binary MIME
    payloads are base64-encoded, as Jupyter stores them.
    """
    kind = output.get("output_type")
    if kind not in _OUTPUT_TYPES:
        return None
    if kind == "stream":
        name = output.get("name", "stdout")
        if not isinstance(name, str):
            return new_output("stream", name=name, text=_text(output))  # the schema says why
        # Valid by construction (two strings): no schema run, which cost more than the rest
        # of a trivial block's handling on the host.
        return _node(output_type="stream", name=name, text=_text(output))
    if kind == "error":
        return _node(  # strings and a list of strings: valid by construction
            output_type="error",
            ename=str(output.get("ename", "Error")),
            evalue=str(output.get("evalue", "")),
            traceback=[str(line) for line in output.get("traceback") or []],
        )
    data = {mime: _mime_value(value) for mime, value in (output.get("data") or {}).items()}
    fields: dict[str, Any] = {"metadata": dict(output.get("metadata") or {})}
    if kind == "execute_result":
        fields["execution_count"] = output.get("execution_count", execution_count)
    return new_output(kind, data=data, **fields)


def _text(output: Mapping[str, Any]) -> str:
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else str(text)


def _mime_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def _safe_output(output: Mapping[str, Any], execution_count: int | None) -> NotebookNode | None:
    """``to_nb_output``, but an output the schema rejects becomes a note, never a lost session."""
    try:
        return to_nb_output(output, execution_count)
    except nbformat.ValidationError as exc:
        note = f"[kernelexec: a {output.get('output_type')} output was not valid nbformat: "
        return new_output("stream", name="stderr", text=f"{note}{exc.message}]\n")


def cell_outputs(result: ExecutionResult, execution_count: int | None) -> list[NotebookNode]:
    """A result's outputs as notebook outputs; a failure with no error output gets one."""
    outputs = [
        converted
        for out in result.outputs
        if (converted := _safe_output(out, execution_count)) is not None
    ]
    has_error = any(out.output_type == "error" for out in outputs)
    if not result.ok and not has_error and result.error is not None:
        # e.g. a timeout or a dead kernel reported only in the result: the notebook must show it
        outputs.append(
            new_output(
                "error",
                ename=result.error.ename,
                evalue=result.error.evalue,
                traceback=list(result.error.traceback),
            )
        )
    return outputs


def result_metadata(result: ExecutionResult, executor: str) -> dict[str, Any]:
    """What kernelexec records about one block in its cell's metadata."""
    meta: dict[str, Any] = {
        "language": result.language,
        "exit_code": result.exit_code,
        "duration_s": round(result.duration_s, 6),
        "executor": executor,
    }
    for flag in ("timed_out", "truncated", "kernel_died", "state_lost", "not_run"):
        if getattr(result, flag):
            meta[flag] = True
    return meta


def session_cell(
    code: str, language: str, result: ExecutionResult, *, executor: str, count: int
) -> NotebookNode:
    """One session block as a code cell."""
    execution_count = result.execution_count if result.execution_count is not None else count
    # Built as a plain dict: ``new_code_cell`` validates against the schema on every call,
    # about 0.3 ms per block on the hot path; whole notebooks are validated when written.
    cell: NotebookNode = from_dict(
        {
            "cell_type": "code",
            "id": random_cell_id(),
            "metadata": {META_KEY: result_metadata(result, executor)},
            "source": cell_source(code, language),
            "execution_count": execution_count,
            "outputs": cell_outputs(result, execution_count),
        }
    )
    return cell


def empty_session_notebook() -> NotebookNode:
    return new_notebook(
        metadata={"kernelspec": dict(_KERNELSPEC), "language_info": {"name": "python"}}
    )


# -- reading and writing ----------------------------------------------------------------------
def write_notebook(
    nb: NotebookNode, path: str | os.PathLike[str], *, door: Door | None = None
) -> Path:
    """Write ``nb`` atomically: a temp file in the same folder, flushed, then ``os.replace``.

    Readers (and a host process killed mid-write) see the old file or the new one, never a mix.
    """
    return write_text_atomic(_writes(nb) + "\n", path, door=door)


def write_text_atomic(text: str, path: str | os.PathLike[str], *, door: Door | None = None) -> Path:
    """Replace ``path`` with ``text`` so that no reader ever sees a partial file.

    A path inside ``door``'s work dir is written through the door: the code there may have
    planted a link on the way, which a path-based write would follow out of it.
    """
    target = Path(path).absolute()
    inside = _inside(door, target)
    if door is not None and inside is not None:
        try:
            old = door.lstat(inside)
            regular = old is not None and stat.S_ISREG(old.st_mode)
            mode = old.st_mode & 0o7777 if old is not None and regular else 0o666 & ~_umask()
            door.write_bytes(inside, text.encode("utf-8"), mode=mode)
        except (OSError, InvalidPath, InvalidWorkDir) as exc:
            raise NotebookError(f"cannot write notebook {target}: {exc}") from exc
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = _file_mode(target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            if hasattr(os, "fchmod"):  # mkstemp makes 0600 files; a notebook is an ordinary file
                os.fchmod(fd, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise NotebookError(f"cannot write notebook {target}: {exc}") from exc
    return target


def _inside(door: Door | None, target: Path) -> str | None:
    if door is None:
        return None
    try:
        return door.relative(target) or None
    except InvalidPath:
        return None


def _file_mode(target: Path) -> int:
    """The replaced file's permissions, or what ``open()`` would give a new file (umask applied)."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    # Reading it from /proc avoids os.umask's set-and-restore, which races with other threads.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def read_notebook(path: str | os.PathLike[str]) -> NotebookNode:
    """Read and validate a notebook as nbformat v4; any problem is a ``NotebookError``."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NotebookError(f"cannot read notebook {source}: {exc}") from exc
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise NotebookError(f"{source} is not a notebook: invalid JSON ({exc})") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("nbformat"), int):
        raise NotebookError(f"{source} is not a notebook: no 'nbformat' version field")
    try:
        # nbformat's reader joins line lists into strings (``source`` may be either on disk).
        nb = _convert(_reader_reads(text), 4)
        _add_missing_ids(nb)
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        raise NotebookError(f"{source} is not a valid notebook: {exc.message}") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise NotebookError(f"{source} is not a valid notebook: {exc}") from exc
    return nb


def _add_missing_ids(nb: NotebookNode) -> None:
    """Hand-made 4.5 notebooks often lack cell ids; nbformat only warns about it, so add them."""
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) < (4, 5):
        return
    for cell in nb.get("cells", []):
        if isinstance(cell, dict) and "id" not in cell:
            cell["id"] = uuid.uuid4().hex[:8]


class SessionNotebook:
    """The notebook an executor keeps of its session; optionally mirrored to a file."""

    def __init__(
        self, *, path: str | os.PathLike[str] | None = None, door: Door | None = None
    ) -> None:
        self.path = None if path is None else Path(path).absolute()
        self._door = door  # the work dir's: a notebook path inside it is written through it
        self._nb = empty_session_notebook()
        # Cells never change once recorded, so each is serialized once: rewriting the file after
        # every block then costs the write, not re-encoding (and re-validating) the whole session.
        self._cell_texts: list[str] = []
        self._count = 0
        # The executor records on its event-loop thread; callers read from theirs.
        self._guard = threading.Lock()

    def record(
        self, code: str, language: str, result: ExecutionResult, *, executor: str
    ) -> NotebookNode:
        """Append the block as a cell and, with a path set, rewrite the file. A block of which
        nothing ran gets a note, not a code cell (no error it never raised, no count)."""
        with self._guard:
            if result.not_run:
                cells = [new_markdown_cell(_not_run_note(code, language, result))]
                if result.state_lost:
                    cells.append(new_markdown_cell(_STATE_LOST_NOTE))
                self._append(cells)
                return cells[0]
            self._count += 1
            cell = session_cell(code, language, result, executor=executor, count=self._count)
            self._nb.metadata[META_KEY] = {"executor": executor}
            cells = [cell]
            if result.state_lost:  # re-running the notebook must not assume the old state
                cells.append(new_markdown_cell(_STATE_LOST_NOTE))
            self._append(cells)
        return cell

    def begin_job(self, code: str, language: str, *, executor: str, job: str) -> int:
        """A job's cell, shown as running (its outputs are filled in by ``job_progress`` as
        they come, and it is replaced by the finished cell): if the host dies meanwhile, the
        file says which job was running and what it had printed. Returns the cell's index."""
        with self._guard:
            meta = {"language": language, "executor": executor, "job": job, "status": "running"}
            cell: NotebookNode = from_dict(
                {
                    "cell_type": "code",
                    "id": random_cell_id(),
                    "metadata": {META_KEY: meta},
                    "source": cell_source(code, language),
                    "execution_count": None,
                    "outputs": [],
                }
            )
            self._append([cell])
            return len(self._nb.cells) - 1

    def job_progress(self, index: int, outputs: list[NbOutput]) -> None:
        """The running job's outputs so far into its cell (and the file, with a path set)."""
        with self._guard:
            cell = self._nb.cells[index]
            cell.outputs = [o for out in outputs if (o := _safe_output(out, None)) is not None]
            self._changed(index)

    def finish_job(
        self,
        index: int,
        code: str,
        language: str,
        result: ExecutionResult,
        *,
        executor: str,
        job: str,
        status: str,
    ) -> None:
        """Replace a job's running cell with its finished one (saying how it ended)."""
        with self._guard:
            self._count += 1
            cell = session_cell(code, language, result, executor=executor, count=self._count)
            cell.metadata[META_KEY].update(job=job, status=status)
            self._nb.cells[index] = cell
            self._nb.metadata[META_KEY] = {"executor": executor}
            if result.state_lost:
                self._nb.cells.insert(index + 1, new_markdown_cell(_STATE_LOST_NOTE))
            self._changed(index)

    def _changed(self, index: int) -> None:
        del self._cell_texts[index:]  # serialized again from that cell on
        if self.path is not None:
            write_text_atomic(self._text(), self.path, door=self._door)

    def record_restart(self) -> None:
        """Mark a restart: cells below it ran in a fresh kernel."""
        with self._guard:
            self._append([new_markdown_cell(_RESTART_NOTE)])

    def _append(self, cells: list[NotebookNode]) -> None:
        self._nb.cells.extend(cells)
        if self.path is not None:
            write_text_atomic(self._text(), self.path, door=self._door)

    def _text(self) -> str:
        """The notebook as ``nbformat.write`` would write it, from the cached cell texts."""
        # Cells are serialized when first written, not when recorded: a session with no file
        # does not pay for JSON it never writes (about a millisecond a block).
        self._cell_texts.extend(_cell_text(c) for c in self._nb.cells[len(self._cell_texts) :])
        header = copy.copy(self._nb)
        header.cells = [_CELLS_MARK] if self._cell_texts else []
        text = _dumps(header).replace(f'  "{_CELLS_MARK}"', ",\n".join(self._cell_texts), 1)
        return text + "\n"

    def copy(self) -> NotebookNode:
        """A deep copy, safe to change and to keep while the session goes on."""
        with self._guard:
            return copy.deepcopy(self._nb)

    def save(self, path: str | os.PathLike[str], *, door: Door | None = None) -> Path:
        with self._guard:
            return write_text_atomic(self._text(), path, door=door or self._door)


_CELLS_MARK = "__kernelexec_cells__"
_RESTART_NOTE = "*kernelexec: restarted here; cells below ran in a fresh kernel.*"
_STATE_LOST_NOTE = "*kernelexec: the kernel was replaced after the cell above; its state is gone.*"


def _not_run_note(code: str, language: str, result: ExecutionResult) -> str:
    why = result.error.evalue if result.error is not None else "Not run."
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall("`+", code))])
    return f"*kernelexec: a block was not run here.* {why}\n\n{fence}{language}\n{code}\n{fence}"


def _dumps(obj: Any) -> str:
    # nbformat's own JSON layout, so files match what Jupyter and nbformat.write produce
    return json.dumps(obj, indent=1, sort_keys=True, separators=(",", ": "), ensure_ascii=False)


def _cell_text(cell: NotebookNode) -> str:
    """One cell's JSON with multi-line strings split into lines, indented to sit in ``cells``."""
    holder = _split_lines(new_notebook(cells=[copy.deepcopy(cell)]))
    return textwrap.indent(_dumps(holder.cells[0]), "  ")
