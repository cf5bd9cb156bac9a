"""Kernels on a cluster engine beside the local Docker kernel, measured in one run.

    python benchmarks/cluster.py [--starts 5] [--blocks 50] [--json]

* start to first result (``start()`` + ``1 + 1``) and a trivial round trip (``1 + 1``), p50 /
  p90: ``docker-kernel`` (a container on this engine), ``provisioned-kernel`` through
  gateway_provisioners' Docker Swarm provisioner (a Swarm service per kernel), and ``gateway``
  through Enterprise Gateway on the same Swarm (its Docker Swarm process proxy; from
  ``.venv-eg``);
* per-kernel memory (the container's cgroup usage) idle after start and after importing numpy,
  pandas and matplotlib, and the CPU an idle kernel uses, for the Swarm kernel: the inputs of
  the capacity model in docs/scale.md.

Needs a Swarm manager (``docker swarm init --advertise-addr 127.0.0.1``), the launcher image
(``kernelexec image build --offline --with-launchers``) and the cluster extra. The Swarm kernels'
client runs in a container on an overlay network of this script's own (the host cannot reach
overlay addresses; see tests/cluster), with this interpreter and checkout mounted read-only;
the network is removed at the end. The machine's load is printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker

import kernelexec
from kernelexec import DockerKernel, GatewayKernel, KernelExecutor, ProvisionedKernel
from kernelexec._cluster import SwarmSpec, install_kernelspec

PROJECT = Path(kernelexec.__file__).resolve().parents[1]
KERNEL = "kx_bench_swarm"
EG_KERNEL = "kx_bench_eg_swarm"
EG_PROXY = "enterprise_gateway.services.processproxies.docker_swarm.DockerSwarmProcessProxy"
HEAVY = "import numpy, pandas, matplotlib.pyplot"


def _pcts(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50": statistics.median(ordered), "p90": at(0.9), "n": len(ordered)}


def measure(make: Any, starts: int, blocks: int, probe: Any = None) -> dict[str, Any]:
    """Start-to-first-result over ``starts`` kernels; round trips and probes on the last."""
    firsts: list[float] = []
    trips: list[float] = []
    extra: dict[str, Any] = {}
    for i in range(starts):
        started = time.perf_counter()
        ex = KernelExecutor(make(), timeout=60, startup_timeout=120)
        try:
            assert ex.execute("1 + 1").output == "2"
            firsts.append(time.perf_counter() - started)
            if i == starts - 1:
                for _ in range(blocks):
                    t = time.perf_counter()
                    ex.execute("1 + 1")
                    trips.append(time.perf_counter() - t)
                if probe is not None:
                    extra = probe(ex)
        finally:
            ex.close()
    return {"start_to_first_result_s": _pcts(firsts), "round_trip_s": _pcts(trips), **extra}


def _container_of(engine: docker.DockerClient, kernel_id: str) -> Any:
    for _ in range(50):
        found = engine.containers.list(filters={"label": f"kernel_id={kernel_id}"})
        if found:
            return found[0]
        time.sleep(0.1)
    raise RuntimeError(f"no container for kernel {kernel_id}")


def _memory_mib(container: Any) -> float:
    stats = container.stats(stream=False)
    memory = stats["memory_stats"]
    # cgroup usage without the page cache, as `docker stats` shows it
    cache = memory.get("stats", {}).get(
        "total_inactive_file", memory.get("stats", {}).get("cache", 0)
    )
    return float(memory["usage"] - cache) / 2**20


def _cpu_seconds(container: Any) -> float:
    return float(container.stats(stream=False)["cpu_stats"]["cpu_usage"]["total_usage"]) / 1e9


def swarm_probe(ex: KernelExecutor) -> dict[str, Any]:
    engine = docker.from_env()
    container = _container_of(engine, str(ex.backend.kernel_id))  # type: ignore[attr-defined]
    idle = _memory_mib(container)
    before = _cpu_seconds(container)
    time.sleep(10)
    idle_cpu = (_cpu_seconds(container) - before) / 10
    ex.execute(HEAVY)
    heavy = _memory_mib(container)
    return {
        "memory_idle_mib": round(idle, 1),
        "memory_after_numpy_pandas_matplotlib_mib": round(heavy, 1),
        "cpu_idle_cores": round(idle_cpu, 4),
    }


def inside(starts: int, blocks: int) -> None:
    """The Swarm half, run in the client container on the overlay network."""
    result = measure(
        lambda: ProvisionedKernel(KERNEL, username="kx"), starts, blocks, probe=swarm_probe
    )
    print("KX-BENCH " + json.dumps(result), flush=True)


@contextlib.contextmanager
def overlay(engine: docker.DockerClient) -> Iterator[tuple[str, Path]]:
    """An attachable overlay network and a kernelspec folder, both removed at the end."""
    network_name = f"kx-bench-{uuid.uuid4().hex[:8]}"
    network = engine.networks.create(network_name, driver="overlay", attachable=True)
    prefix = Path(tempfile.mkdtemp(prefix="kx-bench-specs-"))
    try:
        install_kernelspec(SwarmSpec(kernel_name=KERNEL, network=network_name), prefix)
        yield network_name, prefix
    finally:
        for _ in range(50):
            try:
                network.remove()
                break
            except docker.errors.APIError:
                time.sleep(0.2)
        shutil.rmtree(prefix, ignore_errors=True)


def _sock() -> dict[str, dict[str, str]]:
    return {"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"}}


def swarm_half(
    engine: docker.DockerClient, network: str, prefix: Path, starts: int, blocks: int
) -> dict[str, Any]:
    paths = {str(PROJECT), sys.prefix, sys.base_prefix, str(prefix)}
    volumes = {p: {"bind": p, "mode": "ro"} for p in paths}
    script = str(Path(__file__).resolve())
    container = engine.containers.run(
        kernelexec.DockerOptions().image,
        [sys.executable, script, "--inside", f"--starts={starts}", f"--blocks={blocks}"],
        volumes={**volumes, **_sock()},
        environment={
            "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
            "HOME": "/tmp",
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        },
        user="0:0",
        network=network,
        detach=True,
    )
    try:
        status = container.wait(timeout=1800)
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)
    lines = [line for line in out.splitlines() if line.startswith("KX-BENCH ")]
    if status["StatusCode"] != 0 or not lines:
        raise RuntimeError(f"the Swarm half failed:\n{out[-2000:]}\n{err[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("KX-BENCH ") :])
    return result


def eg_half(
    engine: docker.DockerClient, network: str, prefix: Path, starts: int, blocks: int
) -> dict[str, Any]:
    """Enterprise Gateway (from .venv-eg) on the overlay with its Docker Swarm process proxy,
    reached from here through a port published on 127.0.0.1 (as tests/cluster does)."""
    venv = PROJECT / ".venv-eg"
    if not (venv / "bin" / "jupyter-enterprisegateway").exists():
        return {"skipped": f"{venv} missing (.ci/gateway.sh: gateway_install)"}
    folder = prefix / "share" / "jupyter" / "kernels" / KERNEL
    eg_folder = folder.with_name(EG_KERNEL)
    shutil.copytree(folder, eg_folder)
    spec = json.loads((eg_folder / "kernel.json").read_text())
    config = spec["metadata"].pop("kernel_provisioner")["config"]
    spec["metadata"]["process_proxy"] = {"class_name": EG_PROXY, "config": config}
    at = spec["argv"].index("--transport-encryption")
    spec["argv"] = spec["argv"][:at] + spec["argv"][at + 2 :]
    spec["argv"][1] = str(eg_folder / "scripts" / "launch_docker.py")
    (eg_folder / "kernel.json").write_text(json.dumps(spec))
    home = next(
        str(Path(line.split("=", 1)[1].strip()).parent)
        for line in (venv / "pyvenv.cfg").read_text().splitlines()
        if line.split("=")[0].strip() == "home"
    )
    token = uuid.uuid4().hex
    gw = engine.networks.get("docker_gwbridge").attrs["IPAM"]["Config"][0]["Subnet"]
    prefix_octets = gw.split(".")[:2]
    volumes = {p: {"bind": p, "mode": "ro"} for p in {str(venv), home, str(prefix)}}
    container = engine.containers.run(
        kernelexec.DockerOptions().image,
        [
            str(venv / "bin" / "python"),
            str(venv / "bin" / "jupyter-enterprisegateway"),
            "--EnterpriseGatewayApp.ip=0.0.0.0",
            "--EnterpriseGatewayApp.port=8888",
            f"--EnterpriseGatewayApp.auth_token={token}",
        ],
        volumes={**volumes, **_sock()},
        environment={
            "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
            "HOME": "/tmp",
            "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
            "EG_DOCKER_NETWORK": network,
            "EG_INHERITED_ENVS": "PATH",
            "EG_PROHIBITED_LOCAL_IPS": r"\.".join(prefix_octets) + r"\..*",
        },
        user="0:0",
        network=network,
        ports={"8888/tcp": ("127.0.0.1", None)},
        detach=True,
    )
    try:
        url = ""
        for _ in range(180):
            container.reload()
            ports = container.attrs["NetworkSettings"]["Ports"].get("8888/tcp")
            if ports:
                url = f"http://127.0.0.1:{ports[0]['HostPort']}"
                try:
                    with urllib.request.urlopen(f"{url}/api", timeout=2):
                        break
                except OSError:
                    pass
            time.sleep(0.5)
        return measure(
            lambda: GatewayKernel(
                url, token=token, kernel_name=EG_KERNEL, username="kx", working_dir="/tmp/kx"
            ),
            starts,
            blocks,
        )
    finally:
        container.remove(force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.starts, args.blocks)
        return
    engine = docker.from_env()
    load_before = os.getloadavg()
    results: dict[str, Any] = {"docker-kernel": measure(DockerKernel, args.starts, args.blocks)}
    with overlay(engine) as (network, prefix):
        swarm = swarm_half(engine, network, prefix, args.starts, args.blocks)
        results["provisioned-kernel (Docker Swarm)"] = swarm
        eg = eg_half(engine, network, prefix, args.starts, args.blocks)
        results["gateway (Enterprise Gateway on Docker Swarm)"] = eg
    results["load_before_after"] = [load_before, os.getloadavg()]
    results["cpus"] = os.cpu_count()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, figures in results.items():
        if not isinstance(figures, dict):
            print(f"{name}: {figures}")
            continue
        if "skipped" in figures:
            print(f"{name}: skipped ({figures['skipped']})")
            continue
        first, trip = figures["start_to_first_result_s"], figures["round_trip_s"]
        print(
            f"{name}: start to first result p50 {first['p50'] * 1000:.0f} ms "
            f"(p90 {first['p90'] * 1000:.0f}, n={first['n']}); round trip p50 "
            f"{trip['p50'] * 1000:.1f} ms (p90 {trip['p90'] * 1000:.1f}, n={trip['n']})"
        )
        rest = {k: v for k, v in figures.items() if not k.endswith("_s")}
        if rest:
            print(f"    {rest}")


if __name__ == "__main__":
    main()
