"""Cluster tier set-up: a real single-node Docker Swarm, the launcher image, an overlay network
of the tests' own, and a kernelspec for gateway_provisioners' Docker Swarm provisioner.

The kernels run as Swarm services on that overlay network, and this host cannot reach it: an
overlay address is not routed here (tried: the connection went to the default gateway, off
this machine). So the client side of the sessions runs where these provisioners are deployed
in practice, on the same overlay network: ``Swarm.run`` starts a container attached to it, with
this test interpreter and this checkout mounted read-only and the engine's socket, runs a
script there and returns what it reported. Traffic stays on the tests' own network.

With ``KERNELEXEC_REQUIRE_CLUSTER=1`` (set by ``.ci/run``) a missing engine, Swarm, image or
provisioner package fails the tests instead of skipping them.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

import kernelexec
from kernelexec._cluster import SwarmSpec, install_kernelspec
from kernelexec.backends._docker_options import DEFAULT_IMAGE

PROJECT = Path(kernelexec.__file__).resolve().parents[1]
#: every object the tests create carries it, so the clean-up checks count only theirs
LABEL = "kernelexec.test-cluster"
#: the user the kernels run for (gateway_provisioners refuses root, the driver's user)
USER = "kx"
#: the prefix of the report line a driver script prints
REPORT = "KX-REPORT "


def unavailable(reason: str) -> None:
    if os.environ.get("KERNELEXEC_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"{reason} (KERNELEXEC_REQUIRE_CLUSTER=1, so this is a failure)")
    pytest.skip(reason)


@dataclass
class Swarm:
    """The tests' overlay network and kernelspecs, and a way to run a session's client there."""

    client: docker.DockerClient
    network: str
    prefix: Path  # holds share/jupyter/kernels
    kernel: str  # the Docker Swarm kernelspec on the launcher image

    @property
    def jupyter_path(self) -> str:
        return str(self.prefix / "share" / "jupyter")

    def install_spec(self, name: str, image: str) -> str:
        """A Swarm kernelspec for ``image`` on our network, as ``kernelexec cluster spec
        --swarm`` makes it (gateway_provisioners' own installer, plus DOCKER_NETWORK: without
        it the launcher puts services on ``bridge``, which Swarm refuses)."""
        install_kernelspec(
            SwarmSpec(kernel_name=name, image=image, network=self.network), self.prefix
        )
        return name

    def services(self) -> list[str]:
        """Names of the kernel services gateway_provisioners' launcher made (its labels)."""
        found = self.client.services.list(filters={"label": "app=gateway-provisioners"})
        return sorted(s.name for s in found)

    def run(self, script: str, timeout: float = 240) -> dict[str, Any]:
        """Run ``script`` as a session's client on the overlay network; what it ``report``-ed.

        The script sees ``KERNEL`` (the kernelspec), ``session(**options)`` (a
        ``KernelExecutor`` on a ``ProvisionedKernel``), ``services()`` and ``report(**items)``.
        """
        code = _PRELUDE + textwrap.dedent(script) + _EPILOGUE
        container = self.client.containers.create(
            DEFAULT_IMAGE,
            [sys.executable, "-c", code],
            volumes={**_mounts(), str(self.prefix): {"bind": str(self.prefix), "mode": "ro"}},
            environment={
                "KX_KERNEL": self.kernel,
                "KX_USER": USER,
                "JUPYTER_PATH": self.jupyter_path,
                "HOME": "/tmp",
                "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                "PYTHONDONTWRITEBYTECODE": "1",
                # This checkout, not the one the virtualenv's editable install names (another
                # worktree's, not mounted here).
                "PYTHONPATH": str(PROJECT),
            },
            user="0:0",  # the engine's socket is root's
            network=self.network,
            labels={LABEL: "driver"},
        )
        try:
            _start(container)
            status = container.wait(timeout=timeout)
            out = container.logs(stdout=True, stderr=False).decode()
            err = container.logs(stdout=False, stderr=True).decode()
        finally:
            container.remove(force=True)
        lines = [line for line in out.splitlines() if line.startswith(REPORT)]
        assert status["StatusCode"] == 0 and lines, f"driver failed:\n{out[-3000:]}\n{err[-3000:]}"
        result: dict[str, Any] = json.loads(lines[-1][len(REPORT) :])
        return result


def _start(container: Any) -> None:
    """Start ``container`` on the overlay network. The engine can answer "network … not found"
    for an attachable overlay network that exists, when the node is tearing down its local
    instance as the network's last task on the node leaves (seen on a loaded engine):
    start again."""
    for _ in range(5):
        try:
            container.start()
            return
        except docker.errors.NotFound as exc:
            if "network" not in str(exc):
                raise
            time.sleep(1)
    container.start()


_PRELUDE = """
import json, os, sys, time
import docker
from kernelexec import KernelExecutor, ProvisionedKernel
KERNEL = os.environ["KX_KERNEL"]
_REPORT = {}
_engine = docker.from_env()
def session(kernel=None, **options):
    options = {"timeout": 30, "startup_timeout": 90, **options}
    backend = ProvisionedKernel(kernel or KERNEL, username=os.environ["KX_USER"])
    return KernelExecutor(backend, **options)
def services(kernel_id=None):
    label = "app=gateway-provisioners" if kernel_id is None else "kernel_id=" + kernel_id
    return sorted(s.name for s in _engine.services.list(filters={"label": label}))
def containers(kernel_id, within=20.0):
    # Swarm removes a removed service's container on its own, shortly after: wait for that.
    deadline = time.monotonic() + within
    while True:
        # the low-level listing: the high-level one inspects each container it lists, which
        # fails (404) for one Swarm removes in between
        found = _engine.api.containers(all=True, filters={"label": "kernel_id=" + kernel_id})
        if not found or time.monotonic() > deadline:
            return [c["Names"][0].lstrip("/") for c in found]
        time.sleep(0.2)
def report(**items):
    _REPORT.update(items)
"""

_EPILOGUE = """
print("KX-REPORT " + json.dumps(_REPORT, default=str), flush=True)
"""


def _mounts() -> dict[str, dict[str, str]]:
    """This checkout (its virtualenv inside) and this interpreter, read-only; the socket."""
    paths = {str(PROJECT), sys.prefix, sys.base_prefix}
    if any(p in ("/usr", "/usr/local") for p in paths):
        unavailable("the test interpreter lives in /usr: it cannot be mounted into a container")
    mounts = {p: {"bind": p, "mode": "ro"} for p in paths}
    mounts["/var/run/docker.sock"] = {"bind": "/var/run/docker.sock", "mode": "rw"}
    return mounts
