"""A result shown in a host notebook renders as the cell's own outputs would (run by nbclient in a
real kernel): a plot as image/png, a DataFrame as its table, JSON as JSON, an error as its
traceback; and ``LiveDisplay`` shows outputs in the host cell while the block still runs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

CELLS = [
    "from kernelexec import CommandLineExecutor, KernelExecutor, LiveDisplay\n"
    "ex = KernelExecutor(timeout=60)",
    # a result as the cell's value: each output natively
    "ex.execute('import matplotlib.pyplot as plt\\nprint(\"hi\")\\nplt.plot([1, 2])\\nplt.show()')",
    "ex.execute('import pandas as pd\\npd.DataFrame({\"a\": [1, 2]})')",
    "ex.execute('from IPython.display import JSON\\nJSON({\"k\": 1})')",
    "ex.execute('1/0')",
    "with CommandLineExecutor(timeout=30) as c:\n    r = c.execute('print(6 * 7)')\nr",
    # live: each write of the host cell's stdout is timed; the block prints twice, 1 s apart
    "import sys, time\n"
    "writes = []\n"
    "real_write = sys.stdout.write\n"
    "def timed(text):\n"
    "    writes.append((time.monotonic(), text))\n"
    "    return real_write(text)\n"
    "sys.stdout.write = timed\n"
    "live_ex = KernelExecutor(timeout=60, on_output=LiveDisplay())\n"
    'r = live_ex.execute(\'import time\\nprint("a", flush=True)\\ntime.sleep(1.5)\\nprint("b")\')\n'
    "sys.stdout.write = real_write\n"
    "live_ex.close()\n"
    "stamps = [t for t, text in writes if text.strip() in ('a', 'b')]\n"
    "print('gap', round(stamps[1] - stamps[0], 1) if len(stamps) == 2 else stamps)",
    "ex.close()",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> NotebookNode:
    folder: Path = tmp_path_factory.mktemp("render")
    nb = new_notebook(cells=[new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(folder)}}).execute()
    nbformat.validate(nb)
    return nb


def _kinds(cell: NotebookNode) -> list[str]:
    return [
        o.output_type + ":" + o.get("name", ",".join(sorted(o.get("data", {}))))
        for o in cell.outputs
    ]


def test_a_plot_renders_as_an_image_and_its_print_as_a_stream(executed: NotebookNode) -> None:
    cell = executed.cells[1]
    chart = "application/vnd.kernelexec.chart+json"  # the chart document travels with it
    assert _kinds(cell) == ["stream:stdout", f"display_data:{chart},image/png,text/plain"]
    assert cell.outputs[0].text == "hi\n"
    assert cell.outputs[1].data["image/png"].startswith("iVBOR")  # base64 PNG, no file path


def test_a_dataframe_renders_as_its_table(executed: NotebookNode) -> None:
    (out,) = executed.cells[2].outputs
    assert "<table" in out.data["text/html"] and "outputs/" not in str(out.data)


def test_json_renders_as_json(executed: NotebookNode) -> None:
    (out,) = executed.cells[3].outputs
    assert out.data["application/json"] == {"k": 1}


def test_an_error_renders_as_its_traceback_and_a_status(executed: NotebookNode) -> None:
    text = "".join(o.text for o in executed.cells[4].outputs if o.get("name") == "stderr")
    assert "ZeroDivisionError" in text and text.rstrip().endswith("[failed (exit code 1)]")


def test_a_stateless_result_renders_too(executed: NotebookNode) -> None:
    assert [o.text for o in executed.cells[5].outputs] == ["42\n"]


def test_live_display_shows_output_while_the_block_runs(executed: NotebookNode) -> None:
    stdout = "".join(o.text for o in executed.cells[6].outputs if o.get("name") == "stdout")
    assert stdout.startswith("a\nb\n"), stdout
    gap = float(stdout.split("gap ")[1])
    assert gap >= 1.0, stdout  # shown as printed, not both at the end
