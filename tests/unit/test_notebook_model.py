"""The notebook model without processes: cells from results, atomic writes, reading, parameters."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernelexec import ErrorInfo, ExecutionResult, NotebookError
from kernelexec._notebook import INJECTED_TAG, inject_parameters, parse_parameter
from kernelexec._session import (
    META_KEY,
    SessionNotebook,
    cell_outputs,
    cell_source,
    read_notebook,
    session_cell,
    to_nb_output,
    write_notebook,
)
from kernelexec.cli import build_parser

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake-image-bytes").decode()


def _result(**changes: Any) -> ExecutionResult:
    fields: dict[str, Any] = {"exit_code": 0, "output": "hi\n", "duration_s": 0.25}
    fields.update(changes)
    return ExecutionResult(**fields)


# -- cells ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "language", "expected"),
    [
        ("print(1)", "python", "print(1)"),
        ("echo hi", "shell", "%%bash\necho hi"),
        ("Write-Output 1", "powershell", "%%script pwsh\nWrite-Output 1"),
        ("%%bash\necho hi", "shell", "%%bash\necho hi"),
    ],
)
def test_cell_source_rewrites_non_python_blocks_as_cell_magics(
    code: str, language: str, expected: str
) -> None:
    assert cell_source(code, language) == expected


def test_outputs_are_made_schema_valid() -> None:
    raw = {
        "output_type": "display_data",
        "data": {"image/png": base64.b64decode(PNG), "text/plain": ["<Fig", "ure>"]},
        "transient": {"display_id": "x"},
    }
    out = to_nb_output(raw, 3)
    assert out is not None
    assert "transient" not in out and out.metadata == {}
    assert out.data["image/png"] == PNG  # bytes become base64 text, as Jupyter stores images
    stream = to_nb_output({"output_type": "stream", "name": "stderr", "text": ["a", "b"]}, 1)
    assert stream is not None and stream.text == "ab"
    result = to_nb_output({"output_type": "execute_result", "data": {"text/plain": "2"}}, 7)
    assert result is not None and result.execution_count == 7
    assert to_nb_output({"output_type": "clear_output", "wait": False}, 1) is None


@pytest.mark.parametrize(
    "raw",
    [
        {"output_type": "stream", "name": "stdout", "text": "1\n"},
        {"output_type": "stream", "name": "stderr", "text": ["a", "b"], "extra": 1},
        {"output_type": "stream", "text": 5},
        {"output_type": "stream", "name": "stdlog", "text": "x"},
        {"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["t1", 2]},
        {"output_type": "error", "traceback": None},
    ],
)
def test_streams_and_errors_built_without_the_schema_are_what_it_would_accept(
    raw: dict[str, Any],
) -> None:
    """Streams and errors skip the schema run (it cost more than the rest of a trivial block):
    each is the node nbformat's own constructor makes, and valid."""
    out = to_nb_output(raw, 1)
    assert out is not None
    kind = raw["output_type"]
    fields = {k: v for k, v in out.items() if k != "output_type"}
    assert out == nbformat.v4.new_output(kind, **fields)
    assert list(out) == list(nbformat.v4.new_output(kind, **fields))  # same key order on disk
    nbformat.validate(out, ref=kind, version=4)


def test_a_stream_whose_name_is_not_text_is_still_checked() -> None:
    with pytest.raises(nbformat.ValidationError):
        to_nb_output({"output_type": "stream", "name": 3, "text": "x"}, 1)


def test_an_output_the_schema_rejects_becomes_a_note() -> None:
    odd = _result(outputs=[{"output_type": "display_data", "data": {"text/plain": 42}}])
    (note,) = cell_outputs(odd, 1)
    assert note.output_type == "stream" and "not valid nbformat" in note.text
    nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[note])]))


def test_a_failure_reported_only_in_the_result_still_shows_in_the_cell() -> None:
    timed_out = _result(
        exit_code=124,
        timed_out=True,
        error=ErrorInfo(ename="Timeout", evalue="ran longer than 1 s"),
        outputs=[{"output_type": "stream", "name": "stdout", "text": "started\n"}],
    )
    outputs = cell_outputs(timed_out, 1)
    assert [o.output_type for o in outputs] == ["stream", "error"]
    assert outputs[1].ename == "Timeout"
    # An error output already present is not duplicated.
    failed = _result(
        exit_code=1,
        error=ErrorInfo(ename="ValueError", evalue="x"),
        outputs=[{"output_type": "error", "ename": "ValueError", "evalue": "x", "traceback": []}],
    )
    assert [o.output_type for o in cell_outputs(failed, 2)] == ["error"]


def test_session_cell_carries_source_outputs_count_and_metadata() -> None:
    result = _result(
        outputs=[
            {"output_type": "stream", "name": "stdout", "text": "hi\n"},
            {"output_type": "display_data", "data": {"image/png": PNG}, "metadata": {}},
        ],
        execution_count=5,
        language="shell",
    )
    cell = session_cell("echo hi", "shell", result, executor="local-kernel", count=1)
    assert cell.source == "%%bash\necho hi"
    assert cell.execution_count == 5  # the kernel's count wins over the session's own
    assert cell.outputs[1].data["image/png"] == PNG
    assert cell.metadata[META_KEY] == {
        "language": "shell",
        "exit_code": 0,
        "duration_s": 0.25,
        "executor": "local-kernel",
    }
    nb = nbformat.v4.new_notebook(cells=[cell])
    nbformat.validate(nb)


# -- session notebook and atomic writes ---------------------------------------------------------
def test_session_notebook_rewrites_its_file_after_every_block(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "session.ipynb"
    session = SessionNotebook(path=path)
    for i in range(3):
        session.record(f"print({i})", "python", _result(output=f"{i}\n"), executor="command")
        on_disk = nbformat.read(path, as_version=4)
        nbformat.validate(on_disk)
        assert [c.source for c in on_disk.cells] == [f"print({j})" for j in range(i + 1)]
        assert [c.execution_count for c in on_disk.cells] == list(range(1, i + 2))
    assert sorted(p.name for p in path.parent.iterdir()) == ["session.ipynb"]  # no temp files
    assert on_disk.metadata[META_KEY] == {"executor": "command"}


def test_the_session_file_is_byte_identical_to_nbformat_write(tmp_path: Path) -> None:
    # The session file is spliced from per-cell JSON; it must be exactly what nbformat writes.
    session = SessionNotebook(path=tmp_path / "s.ipynb")
    session.save(tmp_path / "empty.ipynb")
    assert (tmp_path / "empty.ipynb").read_text() == nbformat.writes(session.copy()) + "\n"
    multi = _result(
        outputs=[
            {"output_type": "stream", "name": "stdout", "text": "a\nb\n"},
            {"output_type": "display_data", "metadata": {},
             "data": {"image/png": PNG, "text/plain": "x\ny", "application/json": {"k": [1]}}},
        ]
    )  # fmt: skip
    session.record("for i in range(2):\n    print(i)", "python", multi, executor="kernel")
    session.record("echo é", "shell", _result(output="é\n"), executor="kernel")
    session.record_restart()
    assert (tmp_path / "s.ipynb").read_text() == nbformat.writes(session.copy()) + "\n"


def test_lost_state_is_marked_in_the_notebook() -> None:
    session = SessionNotebook()
    session.record("import os; os._exit(1)", "python", _result(exit_code=1, kernel_died=True,
                   state_lost=True), executor="kernel")  # fmt: skip
    session.record_restart()
    died, lost, restarted = session.copy().cells
    assert died.metadata[META_KEY]["kernel_died"] is died.metadata[META_KEY]["state_lost"] is True
    assert lost.cell_type == restarted.cell_type == "markdown"
    assert "state is gone" in lost.source and "restarted" in restarted.source


def test_session_copy_is_independent(tmp_path: Path) -> None:
    session = SessionNotebook()
    session.record("x = 1", "python", _result(), executor="kernel")
    snapshot = session.copy()
    snapshot.cells.clear()
    assert len(session.copy().cells) == 1
    saved = session.save(tmp_path / "out.ipynb")
    assert saved.is_absolute()
    assert len(nbformat.read(saved, as_version=4).cells) == 1


def test_a_failed_write_leaves_the_previous_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "nb.ipynb"
    write_notebook(nbformat.v4.new_notebook(), path)
    before = path.read_text()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    with pytest.raises(NotebookError, match="No space left"):
        write_notebook(nb, path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["nb.ipynb"]


def test_written_notebooks_get_ordinary_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    fresh = write_notebook(nbformat.v4.new_notebook(), tmp_path / "fresh.ipynb")
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    fresh.chmod(0o640)
    write_notebook(nbformat.v4.new_notebook(), fresh)
    assert fresh.stat().st_mode & 0o777 == 0o640  # a replaced file keeps its mode


# -- reading ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"cells": [', "invalid JSON"),
        ("[1, 2]", "no 'nbformat'"),
        ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "not a valid notebook"),
        (
            '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "x"}]}',
            "not a valid notebook",
        ),
    ],
)
def test_corrupt_notebooks_raise_a_clear_notebook_error(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.ipynb"
    path.write_text(content)
    with pytest.raises(NotebookError, match=message) as info:
        read_notebook(path)
    assert "bad.ipynb" in str(info.value)


def test_missing_and_binary_files_raise_notebook_error(tmp_path: Path) -> None:
    with pytest.raises(NotebookError, match="cannot read"):
        read_notebook(tmp_path / "absent.ipynb")
    binary = tmp_path / "binary.ipynb"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(NotebookError):
        read_notebook(binary)


def test_an_older_v4_notebook_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.ipynb"
    old = {
        "nbformat": 4,
        "nbformat_minor": 2,
        "metadata": {},
        "cells": [{"cell_type": "code", "source": ["x = 1\n", "x"], "metadata": {},
                   "outputs": [], "execution_count": None}],
    }  # fmt: skip
    path.write_text(json.dumps(old))
    assert read_notebook(path).cells[0].source == "x = 1\nx"  # line lists are joined


def test_cells_without_ids_get_them_silently(tmp_path: Path) -> None:
    path = tmp_path / "no-ids.ipynb"
    cell = {"cell_type": "markdown", "source": "hi", "metadata": {}}
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                                "cells": [cell]}))  # fmt: skip
    nb = read_notebook(path)  # filterwarnings=error: nbformat's missing-id warning would fail
    assert len(nb.cells[0].id) == 8


# -- parameters -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [("3", 3), ("2.5", 2.5), ("True", True), ("None", None), ("[1, 2]", [1, 2]),
     ("'quoted'", "quoted"), ("hello", "hello"), ("data/in.csv", "data/in.csv"), ("", "")],
)  # fmt: skip
def test_parameter_values_are_literals_when_they_parse(text: str, value: Any) -> None:
    assert parse_parameter(text) == value


def _nb_with(*cells: Any, minor: int = 5) -> Any:
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.nbformat_minor = minor
    return nb


def test_parameters_are_injected_after_the_parameters_cell() -> None:
    params = nbformat.v4.new_code_cell("n = 1\nname = 'a'")
    params.metadata["tags"] = ["parameters"]
    nb = _nb_with(nbformat.v4.new_markdown_cell("# t"), params, nbformat.v4.new_code_cell("n"))
    inject_parameters(nb, {"n": 5, "name": "b"})
    injected = nb.cells[2]
    assert injected.metadata["tags"] == [INJECTED_TAG]
    assert injected.source == "# Parameters\nn = 5\nname = 'b'\n"
    nbformat.validate(nb)
    # A second run replaces the first injection instead of stacking another.
    inject_parameters(nb, {"n": 6})
    assert [INJECTED_TAG in c.metadata.get("tags", []) for c in nb.cells].count(True) == 1
    assert nb.cells[2].source.endswith("n = 6\n")


def test_without_a_parameters_cell_injection_goes_first_and_respects_old_formats() -> None:
    nb = _nb_with(nbformat.v4.new_code_cell("x"), minor=4)
    for cell in nb.cells:
        del cell["id"]
    with pytest.warns(UserWarning, match="no cell tagged 'parameters'"):
        inject_parameters(nb, {"x": 1})
    assert nb.cells[0].source.endswith("x = 1\n")
    assert "id" not in nb.cells[0]
    nbformat.validate(nb)


@pytest.mark.parametrize(
    ("params", "message"),
    [({"not valid": 1}, "identifier"), ({"class": 1}, "identifier"), ({"f": object()}, "literal")],
)
def test_bad_parameters_are_refused(params: dict[str, Any], message: str) -> None:
    params_cell = nbformat.v4.new_code_cell("x = 0")
    params_cell.metadata["tags"] = ["parameters"]
    with pytest.raises(ValueError, match=message):
        inject_parameters(_nb_with(params_cell), params)


# -- the command line and result display ------------------------------------------------------
def test_notebook_run_arguments_parse() -> None:
    args = build_parser().parse_args(
        ["notebook", "run", "in.ipynb", "-o", "out.ipynb", "--executor", "docker-kernel",
         "--timeout", "5", "--allow-errors", "-p", "n", "3", "-p", "name", "x"]
    )  # fmt: skip
    assert (args.notebook, args.output, args.executor) == ("in.ipynb", "out.ipynb", "docker-kernel")
    assert args.timeout == 5.0 and args.allow_errors
    assert args.parameter == [["n", "3"], ["name", "x"]]


def test_a_result_displays_its_text_and_images() -> None:
    result = _result(
        output="total: 42\n",
        outputs=[
            {"output_type": "stream", "name": "stdout", "text": "total: 42\n"},
            {"output_type": "display_data", "data": {"image/png": PNG}, "metadata": {}},
        ],
    )
    bundle = result._repr_mimebundle_()
    assert "total: 42" in bundle["text/plain"]
    assert "total: 42" in bundle["text/html"]
    assert f'<img src="data:image/png;base64,{PNG}"' in bundle["text/html"]
    failed = _result(exit_code=1, output="<boom> & more")
    assert "&lt;boom&gt; &amp; more" in failed._repr_html_()


# -- run_notebook's argument checks (they fail before any kernel starts) ---------------------------
@pytest.fixture
def tiny_notebook(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), path)
    return path


def test_a_stateless_executor_is_refused_for_notebooks(tiny_notebook: Path) -> None:
    from kernelexec import CommandLineExecutor, run_notebook

    with CommandLineExecutor() as ex, pytest.raises(ValueError, match="stateful"):
        run_notebook(tiny_notebook, executor=ex)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"executor": "no-such-executor"}, "unknown executor"), ({"timeout": 0}, "positive")],
)
def test_bad_run_options_are_refused(
    tiny_notebook: Path, options: dict[str, Any], message: str
) -> None:
    from kernelexec import run_notebook

    out = tiny_notebook.with_name("out.ipynb")
    with pytest.raises(ValueError, match=message):
        run_notebook(tiny_notebook, output_path=out, **options)
    assert not out.exists()
