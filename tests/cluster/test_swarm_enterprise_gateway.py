"""Enterprise Gateway on the same Swarm: EG's Docker Swarm process proxy starts each kernel as a
service from the launcher image, and ``GatewayKernel`` runs a session through it.

EG runs as a container on the tests' overlay network (its kernels' network; it reaches their
ports there), from the ``.venv-eg`` virtualenv that ``.ci/gateway.sh`` makes, mounted
read-only with its interpreter; its HTTP port is published on 127.0.0.1 only, which is how
this host's ``GatewayKernel`` reaches it. The kernelspec is the Swarm one ``kernelexec cluster
spec --swarm`` makes, with EG's process proxy named instead of the provisioner.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kx_cluster import LABEL, PROJECT, USER, Swarm, unavailable

from kernelexec import GatewayKernel, KernelExecutor
from kernelexec.backends._docker_options import DEFAULT_IMAGE, LAUNCHERS_IMAGE

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

EG_VENV = PROJECT / ".venv-eg"
KERNEL = "kx_eg_swarm_python"
PROXY = "enterprise_gateway.services.processproxies.docker_swarm.DockerSwarmProcessProxy"


def _eg_kernelspec(swarm: Swarm) -> Path:
    """The Swarm kernelspec, for EG: its process proxy instead of the provisioner, and without
    the transport-encryption argument EG 3 does not fill in."""
    swarm.install_spec(KERNEL, LAUNCHERS_IMAGE)
    path = swarm.prefix / "share" / "jupyter" / "kernels" / KERNEL / "kernel.json"
    spec = json.loads(path.read_text())
    config = spec["metadata"].pop("kernel_provisioner")["config"]
    spec["metadata"]["process_proxy"] = {"class_name": PROXY, "config": config}
    argv = spec["argv"]
    at = argv.index("--transport-encryption")
    spec["argv"] = argv[:at] + argv[at + 2 :]
    path.write_text(json.dumps(spec, indent=1))
    return path


def _python_home(venv: Path) -> str:
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return str(Path(value.strip()).parent)
    raise AssertionError(f"no home in {venv}/pyvenv.cfg")


@pytest.fixture(scope="module")
def enterprise_gateway(swarm: Swarm) -> Iterator[tuple[str, str]]:
    if not (EG_VENV / "bin" / "jupyter-enterprisegateway").exists():
        unavailable(f"{EG_VENV} missing: bash -c 'source .ci/gateway.sh; gateway_install'")
    _eg_kernelspec(swarm)
    token = secrets.token_hex(16)
    home = _python_home(EG_VENV)
    if home in ("/usr", "/usr/local"):
        unavailable(f"EG's interpreter lives in {home}: it cannot be mounted into a container")
    volumes = {p: {"bind": p, "mode": "ro"} for p in {str(EG_VENV), home, str(swarm.prefix)}}
    volumes["/var/run/docker.sock"] = {"bind": "/var/run/docker.sock", "mode": "rw"}
    app = "EnterpriseGatewayApp"
    container = swarm.client.containers.run(
        DEFAULT_IMAGE,
        [
            str(EG_VENV / "bin" / "python"),
            str(EG_VENV / "bin" / "jupyter-enterprisegateway"),
            f"--{app}.ip=0.0.0.0",
            f"--{app}.port=8888",
            f"--{app}.port_retries=0",
            f"--{app}.auth_token={token}",
            "--KernelSpecManager.ensure_native_kernel=False",
        ],
        volumes=volumes,
        environment={
            "JUPYTER_PATH": swarm.jupyter_path,
            "HOME": "/tmp",
            "PATH": f"{EG_VENV / 'bin'}:/usr/bin:/bin",
            "EG_DOCKER_NETWORK": swarm.network,  # where the process proxy puts the kernels
            "EG_INHERITED_ENVS": "PATH",  # the launcher (a local process) needs it
            # The published port adds Swarm's egress bridge, whose containers cannot reach
            # each other: EG must tell the launchers its overlay address, not that one.
            "EG_PROHIBITED_LOCAL_IPS": _egress_bridge_pattern(swarm),
        },
        user="0:0",  # the engine's socket is root's
        network=swarm.network,
        ports={"8888/tcp": ("127.0.0.1", None)},
        labels={LABEL: "enterprise-gateway"},
        detach=True,
    )
    try:
        url = _wait_for(container, token)
        yield url, token
    finally:
        # EG's log, for a failure's report (pytest shows captured output of failed tests)
        print(container.logs().decode(errors="replace")[-4000:])
        container.remove(force=True)


def _egress_bridge_pattern(swarm: Swarm) -> str:
    """A regular expression matching the addresses of Swarm's egress bridge (docker_gwbridge)."""
    bridge = swarm.client.networks.get("docker_gwbridge")
    subnet = ipaddress.ip_network(bridge.attrs["IPAM"]["Config"][0]["Subnet"])
    octets = subnet.network_address.exploded.split(".")[: subnet.prefixlen // 8]
    return r"\.".join(octets) + r"\..*"


def _wait_for(container: object, token: str) -> str:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        container.reload()  # type: ignore[attr-defined]
        ports = container.attrs["NetworkSettings"]["Ports"].get("8888/tcp")  # type: ignore[attr-defined]
        if ports:
            url = f"http://127.0.0.1:{ports[0]['HostPort']}"
            request = urllib.request.Request(
                f"{url}/api/kernelspecs", headers={"Authorization": f"token {token}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=2) as answer:
                    if KERNEL in json.loads(answer.read())["kernelspecs"]:
                        return url
            except OSError:
                pass
        if container.status == "exited":  # type: ignore[attr-defined]
            break
        time.sleep(0.5)
    logs = container.logs().decode()[-3000:]  # type: ignore[attr-defined]
    raise AssertionError(f"Enterprise Gateway did not come up:\n{logs}")


def test_a_gateway_session_through_enterprise_gateway_on_swarm(
    swarm: Swarm, enterprise_gateway: tuple[str, str], tmp_path: Path
) -> None:
    url, token = enterprise_gateway
    before = set(swarm.services())
    backend = GatewayKernel(
        url, token=token, kernel_name=KERNEL, username=USER, working_dir="/tmp/kx-work"
    )
    with KernelExecutor(backend, work_dir=tmp_path, timeout=30, startup_timeout=120) as ex:
        ex.execute("x = 41")
        r = ex.execute("import socket; print(socket.gethostname()); x + 1")
        during = sorted(set(swarm.services()) - before)
        kernel_id = backend.kernel_id
        r2 = ex.execute("import time\nx += 1\ntime.sleep(60)", timeout=3)
        after_timeout = ex.execute("x").output
    assert r.output.endswith("42")
    assert during == [f"{USER}-{kernel_id}"]  # a Swarm service, made by the launcher for EG
    assert r.stdout.strip() == during[0]  # the kernel ran in it
    assert r2.timed_out and not r2.state_lost and after_timeout == "42"
    deadline = time.monotonic() + 20
    while set(swarm.services()) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(swarm.services()) - before == set()
