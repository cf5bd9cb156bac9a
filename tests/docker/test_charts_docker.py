"""Charts and tables as data in the Docker image's kernel (older matplotlib, pandas, IPython)."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from kx_docker_helpers import require_runtime

from kernelexec import CommandLineExecutor, DockerCommand, DockerKernel, KernelExecutor
from kernelexec._charts import CHART_MIME, TABLE_MIME

pytestmark = pytest.mark.docker


@pytest.mark.parametrize(
    "runtime", [None, pytest.param("runsc", marks=pytest.mark.gvisor)], ids=["runc", "runsc"]
)
def test_the_docker_kernel_gives_chart_and_table_documents(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: str | None
) -> None:
    require_runtime(docker_client, runtime)
    backend = DockerKernel(runtime=runtime)
    with KernelExecutor(backend=backend, work_dir=tmp_path, timeout=120) as ex:
        r = ex.execute(
            "import matplotlib.pyplot as plt, pandas as pd\n"
            "fig, (a, b) = plt.subplots(1, 2)\n"
            "a.hist([1, 2, 2, 3, 3, 3], bins=3); b.boxplot([[1, 2, 3, 4, 5]]); plt.show()\n"
            "pd.DataFrame({'k': ['a', 'b', None]})"
        )
    assert r.ok, r.output
    (chart,) = [o["data"][CHART_MIME] for o in r.outputs if CHART_MIME in o.get("data", {})]
    (table,) = [o["data"][TABLE_MIME] for o in r.outputs if TABLE_MIME in o.get("data", {})]
    hist, box = chart["axes"]
    assert hist["type"] == "histogram" and hist["series"][0]["y"] == [1.0, 2.0, 3.0]
    assert box["type"] == "box" and box["series"][0]["boxes"][0]["med"] == 3
    assert table["shape"] == [3, 1] and table["columns"][0]["nulls"] == 1
    assert "[chart: 2 axes: histogram: x 1-3 (3 bins, 6 values), y count 1-3 | box: 1 box" in (
        r.output
    )
    assert "[table: 3 rows x 1 columns: k object (1 null) top a/b]" in r.output


@pytest.mark.parametrize(
    "runtime", [None, pytest.param("runsc", marks=pytest.mark.gvisor)], ids=["runc", "runsc"]
)
def test_the_docker_command_executor_gives_chart_documents(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: str | None
) -> None:
    # the document is made in the container, written beside the figure, read by the host
    require_runtime(docker_client, runtime)
    backend = DockerCommand(runtime=runtime)
    with CommandLineExecutor(backend=backend, work_dir=tmp_path, timeout=120) as ex:
        r = ex.execute(
            "import matplotlib.pyplot as plt\n"
            "fig, (a, b) = plt.subplots(1, 2)\n"
            "a.hist([1, 2, 2, 3, 3, 3], bins=3); b.boxplot([[1, 2, 3, 4, 5]])\n"
        )
    assert r.ok, r.output
    (chart,) = [o["data"][CHART_MIME] for o in r.outputs if CHART_MIME in o.get("data", {})]
    hist, box = chart["axes"]
    assert hist["type"] == "histogram" and hist["series"][0]["y"] == [1.0, 2.0, 3.0]
    assert box["type"] == "box" and box["series"][0]["boxes"][0]["med"] == 3
    assert r.output.startswith(
        "[chart: 2 axes: histogram: x 1-3 (3 bins, 6 values), y count 1-3 | box: 1 box"
    )
    assert r.output.rstrip().endswith("saved to outputs/cell1-1.png]")
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["cell1-1.png"]
