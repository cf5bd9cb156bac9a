"""Running notebooks in a Docker kernel: the same runner, a container back end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import docker
import nbformat
import pytest
from kx_docker_helpers import containers_of
from nbformat.v4 import new_code_cell, new_notebook

from kernelexec import KernelExecutor, run_notebook
from kernelexec._session import META_KEY
from kernelexec.backends.docker_kernel import DockerKernel

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"


def _notebook(path: Path) -> Path:
    params = new_code_cell("n = 1")
    params.metadata["tags"] = ["parameters"]
    cells = [params, new_code_cell("import os\nprint(os.getcwd(), n * 2)"), new_code_cell(PLOT)]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_a_notebook_runs_in_a_docker_kernel_and_leaves_no_container(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    backend = DockerKernel()
    with KernelExecutor(backend=backend, work_dir=tmp_path / "work", timeout=60) as ex:
        nb = run_notebook(_notebook(tmp_path / "in.ipynb"), executor=ex, parameters={"n": 21})
        assert containers_of(docker_client, backend.session)  # it really ran in a container
    assert containers_of(docker_client, backend.session) == []
    assert nb.metadata[META_KEY]["status"] == "ok"
    assert nb.metadata[META_KEY]["executor"] == "docker-kernel"
    printed = nb.cells[2].outputs[0].text.split()
    assert printed[1] == "42" and printed[0] != str(tmp_path / "work")  # the container's path
    assert any("image/png" in o.get("data", {}) for o in nb.cells[3].outputs)
    nbformat.validate(nb)


@pytest.mark.slow
def test_cli_runs_a_notebook_with_the_docker_kernel(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    source = _notebook(tmp_path / "in.ipynb")
    done = subprocess.run(
        [sys.executable, "-m", "kernelexec", "notebook", "run", str(source), "-o", "out.ipynb",
         "--executor", "docker-kernel", "-p", "n", "5", "--no-progress"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert nb.metadata[META_KEY]["executor"] == "docker-kernel"
    assert nb.cells[2].outputs[0].text.split()[1] == "10"
