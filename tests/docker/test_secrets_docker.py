"""Secrets the code never sees, in containers: docker-kernel under runc and docker-command under
gVisor (loopback only; the servers and their CA are made by ``kx_secrets``).

The code's environment holds a placeholder; a block sends it with urllib (and requests, when the
image has it) to the secret's own HTTPS server, which receives the value (the proxy terminates
TLS with the session CA, whose bundle the container trusts), and to a plain server that is
allowed but carries no secret, which receives the placeholder (logged as withheld). The value
appears in no output, no notebook and no file of the work dir.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from kx_docker_helpers import require_runtime
from kx_secrets import NAME, VALUE, World, check_end_to_end, client_code, served

from kernelexec import NetworkPolicy, Secret, make_executor

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with served(tmp_path_factory.mktemp("secrets-world")) as w:
        yield w


PAIRS = [
    pytest.param(("docker-kernel", "runc"), id="docker-kernel-runc"),
    pytest.param(("docker-command", "runsc"), id="docker-command-runsc", marks=pytest.mark.gvisor),
]


@pytest.fixture(scope="module", params=PAIRS)
def executor(
    request: pytest.FixtureRequest,
    docker_client: docker.DockerClient,
    world: World,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    kind, runtime = request.param
    require_runtime(docker_client, runtime)
    policy = NetworkPolicy(
        allow=[f"127.0.0.1:{world.secret_port}", f"127.0.0.1:{world.plain_port}"],
        secrets={NAME: Secret(VALUE, hosts=[f"127.0.0.1:{world.secret_port}"])},
        upstream_ca=str(world.ca_file),
    )
    work = tmp_path_factory.mktemp(f"secrets-{kind}-{runtime}")
    runtime_option = None if runtime == "runc" else runtime
    with make_executor(
        kind, work_dir=work, timeout=90, network=policy, runtime=runtime_option
    ) as ex:
        yield ex


def test_a_secret_reaches_its_host_only(executor: Any, world: World) -> None:
    result = executor.execute(client_code(world))
    check_end_to_end(executor, result, world)


def test_no_container_holds_the_value(executor: Any, docker_client: docker.DockerClient) -> None:
    # its environment, command and labels: the placeholder only (every container, all helpers')
    configs = [c.attrs["Config"] for c in docker_client.containers.list(sparse=False)]
    assert configs and not [c for c in configs if VALUE in json.dumps(c)]
    assert any(f"{NAME}=kx-secret-{NAME}-" in " ".join(c.get("Env") or []) for c in configs)


def test_the_code_cannot_replace_the_trusted_bundle(executor: Any) -> None:
    attack = (
        "import os\n"
        "path = os.environ['SSL_CERT_FILE']\n"
        "print('bundle', path, oct(os.stat(path).st_mode & 0o777))\n"
        "for act in (lambda: open(path, 'a'), lambda: os.unlink(path),"
        " lambda: os.rename(path, path + '.x')):\n"
        "    try:\n"
        "        act()\n"
        "        print('CHANGED')\n"
        "    except OSError as exc:\n"
        "        print('refused', type(exc).__name__)\n"
    )
    result = executor.execute(attack)
    assert "CHANGED" not in result.output and result.output.count("refused") == 3, result.output
    assert "bundle /tmp/kernelexec-ca.pem 0o444" in result.output
