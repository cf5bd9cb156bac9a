"""Docker out of Docker, for real: kernelexec itself runs in a container (the engine's socket
mounted, no network; this project installed there from a wheel built offline, into the test's
interpreter mounted read-only), sees a host folder at another path, and runs blocks in sibling
containers through ``bind_dir``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import pytest

import kernelexec
from kernelexec.backends._docker import DEFAULT_IMAGE, LABEL_HOST

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PROJECT = Path(kernelexec.__file__).resolve().parents[1]
INSIDE = "/data"  # where the application container sees the host folder

APP = r"""
import json, os, sys
import kernelexec
from kernelexec import (
    CommandLineExecutor, DockerCommand, DockerConfigError, DockerKernel, KernelExecutor,
)
host = sys.argv[1]
report = {"installed_at": kernelexec.__file__}
with KernelExecutor(backend=DockerKernel(bind_dir=host), work_dir="/data", timeout=60) as k:
    k.execute("x = 41")
    r = k.execute(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2]); plt.savefig('plot.png'); plt.show()\n"
        "print(x + 1)"
    )
    report["kernel"] = {"ok": r.ok, "output": r.output, "files": [str(f) for f in r.files]}
with CommandLineExecutor(backend=DockerCommand(bind_dir=host), work_dir="/data") as c:
    r = c.execute("head -c 4 plot.png | od -An -c | tr -d ' '; echo made > cmd.txt", "shell")
    report["command"] = {"ok": r.ok, "output": r.output}
report["app_sees"] = sorted(os.listdir("/data"))
for kind, make in (("kernel", DockerKernel), ("command", DockerCommand)):
    executor = KernelExecutor if kind == "kernel" else CommandLineExecutor
    ex = executor(backend=make(), work_dir="/data/nobind")
    try:
        ex.start()
        report["no_bind_" + kind] = "started"
    except DockerConfigError as exc:
        report["no_bind_" + kind] = str(exc)
    finally:
        ex.close()
print(json.dumps(report))
"""

NO_SOCKET = r"""
from kernelexec import CommandLineExecutor, DockerCommand, DockerUnavailable
ex = CommandLineExecutor(backend=DockerCommand(), work_dir="/tmp/w")
try:
    ex.start()
except DockerUnavailable as exc:
    print(exc)
finally:
    ex.close()
"""


def _python_mounts() -> dict[str, dict[str, str]]:
    prefixes = {sys.prefix, sys.base_prefix}
    if any(p in ("/usr", "/usr/local") or p.startswith("/usr/") for p in prefixes):
        reason = "the test interpreter lives in /usr: it cannot be mounted into a container"
        if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":  # as tests/docker/conftest.py
            pytest.fail(f"{reason} (KERNELEXEC_REQUIRE_DOCKER=1, so this is a failure)")
        pytest.skip(reason)
    return {p: {"bind": p, "mode": "ro"} for p in prefixes}


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This project as a wheel, built here without a network (hatchling is in the dev extra)."""
    out = tmp_path_factory.mktemp("wheel")
    build = ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(PROJECT)]
    subprocess.run(
        [sys.executable, "-m", "pip", *build],
        check=True,
        timeout=300,
    )
    assert len(list(out.glob("kernelexec-*.whl"))) == 1
    return out


#: in the application container: install the wheel (no index, no network), then run the app
INSTALL_AND_RUN = (
    '"$KX_PY" -m pip install -q --no-deps --no-index --disable-pip-version-check '
    '--target /tmp/kx /wheels/kernelexec-*.whl && exec "$KX_PY" -c "$0" "$@"'
)


def run_app(
    client: docker.DockerClient,
    code: str,
    args: list[str],
    volumes: Mapping[str, Mapping[str, str]],
    wheels: Path,
) -> tuple[str, Any]:
    """Install this project into a fresh container from its wheel, run ``code`` there with
    this interpreter; its stdout."""
    container = client.containers.run(
        DEFAULT_IMAGE,
        ["/bin/sh", "-c", INSTALL_AND_RUN, code, *args],
        volumes={
            **_python_mounts(),
            str(wheels): {"bind": "/wheels", "mode": "ro"},
            **volumes,
        },
        environment={
            "PYTHONPATH": "/tmp/kx",
            "HOME": "/tmp",
            "KX_PY": sys.executable,
            "PIP_USER": "0",  # the image installs to the user site; --target here
        },
        user="0:0",
        network_mode="none",
        working_dir="/tmp",
        detach=True,
    )
    try:
        status = container.wait(timeout=120)
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
        assert status["StatusCode"] == 0, err
        return out, container
    finally:
        container.remove(force=True)


def test_kernelexec_in_a_container_runs_blocks_in_sibling_containers_through_bind_dir(
    docker_client: docker.DockerClient, tmp_path: Path, wheel_dir: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    socket = {"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"}}
    out, app = run_app(
        docker_client,
        APP,
        [str(shared)],
        {**socket, str(shared): {"bind": INSIDE, "mode": "rw"}},
        wheel_dir,
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert report["installed_at"].startswith("/tmp/kx/kernelexec/"), report  # the wheel's
    kernel, command = report["kernel"], report["command"]
    # The sibling kernel kept its state, and its plot is where the host and the app see it.
    assert kernel["ok"] and kernel["output"].strip().endswith("42"), kernel
    assert any(f.startswith(INSIDE) and f.endswith(".png") for f in kernel["files"]), kernel
    assert (shared / "plot.png").read_bytes().startswith(b"\x89PNG")
    # The sibling command container saw the same folder: the kernel's plot, its own file.
    assert command["ok"] and "PNG" in command["output"], command
    assert (shared / "cmd.txt").read_text() == "made\n"
    assert {"plot.png", "cmd.txt"} <= set(report["app_sees"])
    # Without bind_dir: a clear error that names the option, not a hang or an empty mount.
    for kind in ("kernel", "command"):
        message = report[f"no_bind_{kind}"]
        assert "bind_dir=" in message and "Docker host" in message, message
    # Nothing the application started is left behind.
    siblings = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL_HOST}={app.id[:12]}"}
    )
    assert siblings == []


def test_engine_socket_not_mounted_says_how_to_mount_it(
    docker_client: docker.DockerClient, wheel_dir: Path
) -> None:
    out, _ = run_app(docker_client, NO_SOCKET, [], {}, wheel_dir)
    assert "No Docker engine answers" in out
    assert "-v /var/run/docker.sock:/var/run/docker.sock" in out and "bind_dir" in out
