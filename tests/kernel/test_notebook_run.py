"""Running notebooks with a real kernel: outputs, errors, timeouts, parameters, the command line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from kernelexec import NotebookError, run_notebook, run_notebook_async
from kernelexec._notebook import INJECTED_TAG
from kernelexec._session import META_KEY

DETERMINISTIC = [
    "n = 4",
    'print("sum", sum(range(n)))\nprint("squares", [i * i for i in range(n)])',
    'import sys\nprint("a warning", file=sys.stderr)',
    '{"n": n, "half": n / 2}',
    "%%bash\necho from bash",
    "from IPython.display import Markdown, display\ndisplay(Markdown('**bold**'))\n'last'",
    "",
]


def _notebook(*sources: str, params: str | None = None, kernel: str | None = "python3") -> Any:
    cells = [new_markdown_cell("# A test notebook")]
    if params is not None:
        cell = new_code_cell(params)
        cell.metadata["tags"] = ["parameters"]
        cells.append(cell)
    cells.extend(new_code_cell(s) for s in sources)
    nb = new_notebook(cells=cells)
    if kernel is not None:
        nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    return nb


def _write(nb: NotebookNode, path: Path) -> Path:
    nbformat.write(nb, path)
    return path


def _text_view(cell: NotebookNode) -> tuple[Any, ...]:
    """What a reader sees of a cell: streams by name, then each rich output's text."""
    streams = {
        name: "".join(o.text for o in cell.outputs if o.get("name") == name)
        for name in ("stdout", "stderr")
    }
    rich = [
        (o.output_type, o.get("data", {}).get("text/plain"), o.get("data", {}).get("text/markdown"))
        for o in cell.outputs
        if o.output_type != "stream"
    ]
    return streams["stdout"], streams["stderr"], rich, cell.execution_count


@pytest.fixture(scope="module")
def shared_kernel() -> Iterator[Any]:
    from kernelexec import KernelExecutor

    with KernelExecutor(timeout=30) as ex:
        yield ex


@pytest.mark.slow
def test_outputs_match_nbclient_on_a_deterministic_notebook(tmp_path: Path) -> None:
    source = _write(_notebook(*DETERMINISTIC), tmp_path / "det.ipynb")
    ours = run_notebook(source, output_path=tmp_path / "ours.ipynb", timeout=60)
    theirs = nbformat.read(source, as_version=4)
    NotebookClient(theirs, timeout=60, resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert ours.metadata[META_KEY]["status"] == "ok"
    code = [i for i, c in enumerate(ours.cells) if c.cell_type == "code"]
    for i in code:
        assert _text_view(ours.cells[i]) == _text_view(theirs.cells[i]), ours.cells[i].source
    assert ours.cells[code[1]].outputs[0].text.startswith("sum 6\n")
    assert ours.cells[code[-1]].execution_count is None  # an empty cell is not run
    on_disk = nbformat.read(tmp_path / "ours.ipynb", as_version=4)
    nbformat.validate(on_disk)
    assert on_disk == ours


def test_the_run_stops_at_the_first_error(shared_kernel: Any, tmp_path: Path) -> None:
    source = _write(_notebook("print('before')", "1 / 0", "print('after')"), tmp_path / "err.ipynb")
    nb = run_notebook(source, output_path=tmp_path / "out.ipynb", executor=shared_kernel)
    status = nb.metadata[META_KEY]
    assert status["status"] == "error" and status["failed_cell"] == 2
    assert status["error"].startswith("ZeroDivisionError")
    assert nb.cells[2].outputs[-1].ename == "ZeroDivisionError"
    assert nb.cells[3].execution_count is None and nb.cells[3].outputs == []
    assert nbformat.read(tmp_path / "out.ipynb", as_version=4) == nb


def test_allow_errors_and_raises_exception_tags_keep_going(
    shared_kernel: Any, tmp_path: Path
) -> None:
    tagged = _notebook("raise KeyError('k')", "print('after')")
    tagged.cells[1].metadata["tags"] = ["raises-exception"]
    nb = run_notebook(_write(tagged, tmp_path / "tagged.ipynb"), executor=shared_kernel)
    assert nb.cells[2].outputs[0].text == "after\n"
    plain = _write(_notebook("1 / 0", "print('after')"), tmp_path / "plain.ipynb")
    nb = run_notebook(plain, allow_errors=True, executor=shared_kernel)
    status = nb.metadata[META_KEY]
    assert status["status"] == "ok" and status["failed_cells"] == [1]
    assert nb.cells[2].outputs[0].text == "after\n"


@pytest.mark.slow
def test_a_hanging_cell_times_out_and_the_output_records_it(tmp_path: Path) -> None:
    source = _write(
        _notebook("print('start')", "import time\ntime.sleep(120)", "print('never')"),
        tmp_path / "hang.ipynb",
    )
    out = tmp_path / "out.ipynb"
    started = time.monotonic()
    nb = run_notebook(source, output_path=out, timeout=2)
    assert time.monotonic() - started < 30
    saved = nbformat.read(out, as_version=4)
    assert saved == nb
    status = saved.metadata[META_KEY]
    assert status["status"] == "timeout" and status["failed_cell"] == 2
    hung = saved.cells[2]
    assert hung.metadata[META_KEY]["timed_out"] is True
    assert hung.metadata[META_KEY]["exit_code"] == 124
    assert hung.outputs[-1].output_type == "error"
    assert saved.cells[3].execution_count is None


def test_a_corrupt_notebook_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "corrupt.ipynb"
    source.write_text('{"cells": [{"cell_type": "code", "source": "1"')  # cut off mid-write
    out = tmp_path / "out.ipynb"
    with pytest.raises(NotebookError, match=r"corrupt\.ipynb is not a notebook: invalid JSON"):
        run_notebook(source, output_path=out)
    assert not out.exists()


def test_a_missing_kernelspec_is_named_and_writes_nothing(tmp_path: Path) -> None:
    source = _write(_notebook("print(1)", kernel="no-such-kernel-42"), tmp_path / "k.ipynb")
    out = tmp_path / "out.ipynb"
    with pytest.raises(NotebookError, match="'no-such-kernel-42' is not installed") as info:
        run_notebook(source, output_path=out)
    assert "python3" in str(info.value)  # it lists what is installed
    assert not out.exists()


def test_a_given_executor_is_used_and_left_open(shared_kernel: Any, tmp_path: Path) -> None:
    # The kernelspec is not installed, but an executor was given, so it is not consulted.
    source = _write(
        _notebook("shared_value = 41 + 1", kernel="not-installed"), tmp_path / "g.ipynb"
    )
    nb = run_notebook(source, executor=shared_kernel)
    assert nb.metadata[META_KEY]["status"] == "ok"
    assert shared_kernel.execute("shared_value").output.strip() == "42"


def test_parameters_are_injected_and_used(shared_kernel: Any, tmp_path: Path) -> None:
    source = _write(
        _notebook("print(n * 2, label)", params="n = 1\nlabel = 'default'"),
        tmp_path / "p.ipynb",
    )
    nb = run_notebook(source, executor=shared_kernel, parameters={"n": 21, "label": "x"})
    injected = nb.cells[2]
    assert injected.metadata["tags"] == [INJECTED_TAG]
    assert nb.cells[3].outputs[0].text == "42 x\n"


def test_the_async_form_starts_a_kernel_in_the_notebook_folder(tmp_path: Path) -> None:
    source = _write(_notebook("import os\nprint(os.getcwd())"), tmp_path / "cwd.ipynb")

    async def main() -> NotebookNode:
        # No executor: a local kernel from the notebook's kernelspec, closed afterwards.
        return await run_notebook_async(source, timeout=60)

    nb = asyncio.run(main())
    assert nb.metadata[META_KEY]["status"] == "ok"
    assert nb.cells[1].outputs[0].text == f"{tmp_path}\n"  # relative paths resolve as in Jupyter


# -- the command line ---------------------------------------------------------------------------
def _cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelexec", "notebook", "run", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
    )


@pytest.mark.slow
def test_cli_runs_a_notebook_with_parameters_and_a_progress_bar(tmp_path: Path) -> None:
    source = _write(
        _notebook("print(n + 1, name, flag)", "print(type(n).__name__)", params="n = 0"),
        tmp_path / "in.ipynb",
    )
    done = _cli(source, "-o", "out.ipynb", "-p", "n", "41", "-p", "name", "bob", "-p", "flag",
                "True", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "4/4" in done.stderr  # the bar's last state: 4 code cells (one injected) ran
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert nb.cells[2].source == "# Parameters\nn = 41\nname = 'bob'\nflag = True\n"
    assert [c.outputs[0].text for c in nb.cells[3:]] == ["42 bob True\n", "int\n"]
    assert nbformat.read(source, as_version=4).cells[2].source.startswith("print")  # untouched


@pytest.mark.slow
def test_cli_reports_errors_with_the_exit_status(tmp_path: Path) -> None:
    failing = _write(_notebook("1 / 0"), tmp_path / "fail.ipynb")
    done = _cli(failing, "--no-progress", cwd=tmp_path)  # no -o: written back in place
    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr
    in_place = nbformat.read(failing, as_version=4)
    assert in_place.cells[1].outputs[-1].ename == "ZeroDivisionError"
    corrupt = tmp_path / "corrupt.ipynb"
    corrupt.write_text("not json at all")
    done = _cli(corrupt, "-o", "never.ipynb", cwd=tmp_path)
    assert done.returncode == 2 and "invalid JSON" in done.stderr
    assert not (tmp_path / "never.ipynb").exists()


def test_cli_warns_when_parameters_have_no_parameters_cell(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "plain.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(x)")]), path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelexec",
            "notebook",
            "run",
            str(path),
            "-p",
            "x",
            "5",
            "--no-progress",
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "kernelexec: warning: the notebook has no cell tagged 'parameters'" in proc.stderr
    assert "Traceback" not in proc.stderr
    out = nbformat.read(path, as_version=4)
    assert out.cells[1].outputs[0]["text"] == "5\n"  # injected first, then the cell ran


PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"


def test_rich_outputs_go_to_a_folder_named_after_the_output_notebook(tmp_path: Path) -> None:
    source = _write(_notebook(PLOT), tmp_path / "in.ipynb")
    nb = run_notebook(source, output_path=tmp_path / "report.ipynb", timeout=60)
    assert (tmp_path / "report_files" / "cell1-1.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "outputs").exists()
    assert "image/png" in nb.cells[1].outputs[0]["data"]  # and the notebook embeds it


def test_cli_no_output_files_saves_nothing_beside_the_notebook(tmp_path: Path) -> None:
    source = _write(_notebook(PLOT), tmp_path / "in.ipynb")
    done = _cli(source, "-o", "out.ipynb", "--no-output-files", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.ipynb", "out.ipynb"]
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert "image/png" in nb.cells[1].outputs[0]["data"]
