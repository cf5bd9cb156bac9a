"""The sync API inside a live Jupyter kernel, where an event loop is already running."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_notebook

CELLS = [
    # In an ipykernel cell a loop is running: asyncio.run() would refuse to start here.
    "import asyncio\nprint('loop running:', asyncio.get_running_loop().is_running())",
    "from kernelexec import CommandLineExecutor, KernelExecutor\n"
    "with CommandLineExecutor(timeout=30) as stateless:\n"
    "    stateless.execute('x = 1')\n"
    "    forgot = stateless.execute('print(x)')\n"
    "print('stateless:', forgot.exit_code, forgot.error.ename)",
    "kernel = KernelExecutor(timeout=60)\n"
    "kernel.execute('x = 1')\n"
    "print('stateful:', kernel.execute('print(x + 1)').output.strip())",
    "kernel.execute(\n"
    "    'import matplotlib.pyplot as plt\\n'\n"
    "    'plt.plot([1, 4, 9])\\n'\n"
    "    'print(\"plotted\")\\n'\n"
    "    'plt.show()'\n"
    ")",
    "kernel.close()\nprint('closed:', kernel.closed)",
    "from kernelexec import AsyncCommandLineExecutor\n"
    "async with AsyncCommandLineExecutor(timeout=30) as ex:\n"
    "    awaited = await ex.execute('print(6 * 7)')\n"
    "print('async:', awaited.output.strip())",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> NotebookNode:
    folder: Path = tmp_path_factory.mktemp("embedded")
    nb = new_notebook(cells=[new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(folder)}}).execute()
    nbformat.validate(nb)
    return nb


def _stdout(cell: NotebookNode) -> str:
    return "".join(o.text for o in cell.outputs if o.get("name") == "stdout")


@pytest.mark.slow
def test_both_executors_work_from_a_notebook_cell(executed: NotebookNode) -> None:
    loop, stateless, stateful, _, closed, awaited = executed.cells
    assert _stdout(loop) == "loop running: True\n"
    assert _stdout(stateless) == "stateless: 1 NameError\n"
    assert _stdout(stateful) == "stateful: 2\n"
    assert _stdout(closed) == "closed: True\n"
    assert _stdout(awaited) == "async: 42\n"


@pytest.mark.slow
def test_a_result_shown_in_a_cell_renders_its_text_and_image(executed: NotebookNode) -> None:
    # as the cell's own outputs would be: the print as a stream, the plot as the PNG itself
    stream, image = executed.cells[3].outputs
    assert (stream.output_type, stream.name, stream.text) == ("stream", "stdout", "plotted\n")
    assert image.output_type == "display_data"
    assert image.data["image/png"].startswith("iVBORw0KGgo")
