"""The provisioned-kernel back end before anything starts: which kernelspecs it lists, what it
changes in them, and the errors that say what to do (no engine, no process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from kernelexec import BackendUnavailable, KernelExecutor, KernelStartFailed, ProvisionedKernel
from kernelexec.backends import provisioned_kernel as pk


def _spec(root: Path, name: str, provisioner: str | None, **config: Any) -> None:
    folder = root / "kernels" / name
    folder.mkdir(parents=True)
    metadata: dict[str, Any] = {}
    if provisioner is not None:
        metadata["kernel_provisioner"] = {"provisioner_name": provisioner, "config": config}
    body = {
        "argv": ["python", "launch.py", "--kernel-id", "{kernel_id}"],
        "display_name": name,
        "language": "python",
        "metadata": metadata,
    }
    (folder / "kernel.json").write_text(json.dumps(body))


@pytest.fixture
def specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    _spec(
        tmp_path, "swarm_py", "docker-swarm-provisioner", image_name="kernelexec/python:launchers"
    )
    _spec(tmp_path, "plain_py", None)
    _spec(tmp_path, "local_py", "local-provisioner")
    return tmp_path


def test_available_kernels_lists_only_the_provisioned_ones(specs: Path) -> None:
    pytest.importorskip("gateway_provisioners")  # jupyter_client hides specs it cannot load
    found = ProvisionedKernel.available_kernels()
    assert found.get("swarm_py") == "docker-swarm-provisioner"
    assert "plain_py" not in found and "local_py" not in found


def test_the_launch_timeout_and_the_interpreter_become_the_executors(specs: Path) -> None:
    pytest.importorskip("gateway_provisioners")  # the provisioner's traits are read
    spec = pk._Specs(KernelSpecManager(), 7.5).get_kernel_spec("swarm_py")
    config = spec.metadata["kernel_provisioner"]["config"]
    assert config == {"image_name": "kernelexec/python:launchers", "launch_timeout": 7}
    assert spec.argv[0] == sys.executable  # the provisioners build the command themselves


def _start_error(name: str, raises: type[BaseException]) -> pytest.ExceptionInfo[BaseException]:
    """Start an executor on ``ProvisionedKernel(name)``; what it raised."""
    ex = KernelExecutor(ProvisionedKernel(name, username="kx"), startup_timeout=5)
    try:
        with pytest.raises(raises) as info:
            ex.start()
    finally:
        ex.close()
    return info


def test_unknown_kernelspec_names_the_provisioned_ones(specs: Path) -> None:
    pytest.importorskip("gateway_provisioners")  # jupyter_client hides specs it cannot load
    error = _start_error("nope", KernelStartFailed)
    assert "no kernelspec named 'nope'" in str(error.value) and "swarm_py" in str(error.value)


def test_missing_provisioner_package_names_the_extra(
    specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in an environment without gateway_provisioners: no entry point has that name.
    monkeypatch.setattr(pk.metadata, "entry_points", lambda **_: [])
    error = _start_error("swarm_py", BackendUnavailable)
    assert "'docker-swarm-provisioner'" in str(error.value)
    assert "pip install 'kernelexec[cluster]'" in str(error.value)


class _Engine:
    """A Docker client's answers, for the checks made before a launch."""

    def __init__(self, swarm: str, labels: dict[str, str] | None) -> None:
        self.swarm, self.labels = swarm, labels
        self.images = self

    def info(self) -> dict[str, Any]:
        return {"Swarm": {"LocalNodeState": self.swarm, "ControlAvailable": True}}

    def get(self, tag: str) -> Any:
        import docker.errors

        if self.labels is None:
            raise docker.errors.ImageNotFound(tag)
        return type("Image", (), {"labels": self.labels})()

    def close(self) -> None:
        pass


def _engine(monkeypatch: pytest.MonkeyPatch, swarm: str, labels: dict[str, str] | None) -> None:
    from kernelexec.backends import _docker

    monkeypatch.setattr(_docker, "make_client", lambda options: _Engine(swarm, labels))


def test_an_engine_not_in_swarm_mode_says_how_to_make_one(
    specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("gateway_provisioners")  # its provisioner passes the first check
    _engine(monkeypatch, "inactive", {})
    error = _start_error("swarm_py", BackendUnavailable)
    assert "not in Swarm mode" in str(error.value)
    assert "docker swarm init --advertise-addr 127.0.0.1" in str(error.value)


def test_a_kernelexec_image_without_launchers_names_the_build_flag(
    specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("gateway_provisioners")  # its provisioner passes the first check
    _engine(monkeypatch, "active", {"kernelexec.recipe": "abc"})
    error = _start_error("swarm_py", BackendUnavailable)
    assert "no kernel launchers" in str(error.value) and "--with-launchers" in str(error.value)


def test_a_missing_kernelexec_image_names_the_build_flag(
    specs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("gateway_provisioners")  # its provisioner passes the first check
    _engine(monkeypatch, "active", None)
    error = _start_error("swarm_py", BackendUnavailable)
    assert "is not built" in str(error.value) and "--with-launchers" in str(error.value)
