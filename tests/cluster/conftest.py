"""Cluster tier fixtures (the helpers and why the client runs on the overlay: ``kx_cluster``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from kx_cluster import LABEL, Swarm, unavailable

from kernelexec._errors import DockerUnavailable
from kernelexec.backends._docker import make_client
from kernelexec.backends._docker_options import DEFAULT_IMAGE, LAUNCHERS_IMAGE, DockerOptions


@pytest.fixture(scope="session")
def engine() -> Iterator[docker.DockerClient]:
    try:
        import gateway_provisioners  # noqa: F401
    except ImportError:
        unavailable("gateway_provisioners is not installed: pip install -e '.[cluster]'")
    try:
        client = make_client(DockerOptions())
    except DockerUnavailable as exc:
        unavailable(f"no Docker engine answers: {exc}")
    swarm = client.info().get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
        client.close()
        unavailable(
            "the engine is not a Swarm manager: docker swarm init --advertise-addr 127.0.0.1"
        )
    for image in (DEFAULT_IMAGE, LAUNCHERS_IMAGE):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            client.close()
            unavailable(f"{image} missing: kernelexec image build --offline --with-launchers")
    yield client
    client.close()


@pytest.fixture(scope="session")
def swarm(engine: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    name = f"kx-cluster-{uuid.uuid4().hex[:8]}"
    network = engine.networks.create(
        name, driver="overlay", attachable=True, labels={LABEL: "network"}
    )
    prefix = tmp_path_factory.mktemp("kernelspecs")
    prefix.chmod(0o755)
    here = Swarm(client=engine, network=name, prefix=prefix, kernel="kx_swarm_python")
    before = set(here.services())
    try:
        here.install_spec(here.kernel, LAUNCHERS_IMAGE)
        yield here
    finally:
        leftovers = set(here.services()) - before
        for service in engine.services.list(filters={"label": "app=gateway-provisioners"}):
            if service.name in leftovers:
                service.remove()
        for container in engine.containers.list(
            all=True, ignore_removed=True, filters={"label": LABEL}
        ):
            container.remove(force=True)
        _remove_network(network)
        assert not leftovers, f"kernel services left behind: {sorted(leftovers)}"


def _remove_network(network: Any) -> None:
    """Remove the network once the engine has let go of the last task on it."""
    import time

    deadline = time.monotonic() + 60  # a loaded engine lets go of removed tasks slowly
    while time.monotonic() < deadline:
        try:
            network.remove()
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            time.sleep(0.5)
    network.remove()


@pytest.fixture
def use_specs(swarm: Swarm, monkeypatch: pytest.MonkeyPatch) -> Swarm:
    """Make the tests' kernelspecs visible to this process too (for the host-side tests)."""
    monkeypatch.setenv("JUPYTER_PATH", swarm.jupyter_path)
    return swarm
