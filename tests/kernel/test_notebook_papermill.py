"""``kernelexec notebook run`` with papermill's options (issue 34, item 9): a warning for a
parameter the notebook does not declare (listing those it does), ``--help-notebook``,
``-f`` / ``-y`` YAML, ``-r`` raw strings, ``-k`` kernel name and ``--log-output``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from kernelexec._notebook import Parameter, declared_parameters, inject_parameters

PARAMETERS = 'label = "south"  # which region\nn: int = 2\nratio = 0.5\ncode = "x"'
BODY = 'import sys\nprint(label, n, ratio, repr(code))\nprint("to stderr", file=sys.stderr)'


def _notebook(path: Path) -> Path:
    cell = new_code_cell(PARAMETERS)
    cell.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[cell, new_code_cell(BODY)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "P", "language": "python"}
    nbformat.write(nb, path)
    return path


def _cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelexec", "notebook", "run", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.unit
def test_declared_parameters_are_read_as_papermill_reads_them(tmp_path: Path) -> None:
    nb = nbformat.read(_notebook(tmp_path / "in.ipynb"), as_version=4)
    assert declared_parameters(nb) == [
        Parameter(name="label", type="str", default='"south"', help="which region"),
        Parameter(name="n", type="int", default="2", help=""),
        Parameter(name="ratio", type="float", default="0.5", help=""),
        Parameter(name="code", type="str", default='"x"', help=""),
    ]
    with pytest.warns(UserWarning, match="unknown parameter 'lable'.* label, n, ratio, code"):
        inject_parameters(nb, {"lable": "north", "n": 3})
    assert declared_parameters(new_notebook(cells=[new_code_cell("x = 1")])) is None


@pytest.mark.kernel
def test_yaml_raw_and_typed_parameters_a_typo_warning_and_live_output(tmp_path: Path) -> None:
    source = _notebook(tmp_path / "in.ipynb")
    (tmp_path / "params.yaml").write_text("n: 5\nratio: 0.25\nlabel: from-file\n")
    done = _cli(source, "-o", "out.ipynb", "-f", "params.yaml", "-y", "{label: west, n: 6}",
                "-p", "n", "7", "-r", "code", "007", "-p", "lable", "north", "-k", "python3",
                "--log-output", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # -f, then -y, then -p, then -r (papermill's order); -r keeps "007" a string
    assert done.stdout.startswith("west 7 0.25 '007'\n")  # --log-output: the cell's stdout
    assert "to stderr" in done.stderr and "to stderr" not in done.stdout
    assert (
        "kernelexec: warning: unknown parameter 'lable': the notebook's parameters cell "
        "declares label, n, ratio, code"
    ) in done.stderr
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert out.cells[2].outputs[0].text == "west 7 0.25 '007'\n"


def test_help_notebook_lists_the_parameters_and_their_defaults(tmp_path: Path) -> None:
    source = _notebook(tmp_path / "in.ipynb")
    done = _cli(source, "--help-notebook", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"Parameters inferred for notebook '{source}':",
        '  label: str (default "south")    which region',
        "  n: int (default 2)",
        "  ratio: float (default 0.5)",
        '  code: str (default "x")',
    ]
    assert not (tmp_path / "in_files").exists()  # nothing ran
    plain = tmp_path / "plain.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), plain)
    done = _cli(plain, "--help-notebook", cwd=tmp_path)
    assert done.returncode == 1 and "No cell tagged 'parameters'" in done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-k", "no-such-kernel"], "kernelspec 'no-such-kernel' is not installed"),
        (["-k", "python3", "--executor", "docker-kernel"], "-k/--kernel"),
        (["-y", "[1, 2]"], "-y: expected a mapping"),
        (["-y", "{a: [1"], "-y: not valid YAML"),
        (["-f", "missing.yaml"], "-f missing.yaml: cannot read it"),
    ],
)
def test_bad_notebook_options_are_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    source = _notebook(tmp_path / "in.ipynb")
    done = _cli(source, "-o", "out.ipynb", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert not (tmp_path / "out.ipynb").exists()
