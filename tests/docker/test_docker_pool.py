"""Pooled Docker kernels keep the Docker kernel's promises: the host's environment stays out."""

from __future__ import annotations

import os

import docker
import pytest

from kernelexec import KernelPool, PoolOptions
from kernelexec.backends.docker_kernel import DockerKernel


def test_a_pooled_docker_kernel_gets_no_host_environment(
    docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool wraps each back end; the wrapper once said "inherits the host's environment"
    for every kernel, so a pooled (or MCP) Docker kernel got all of the host's variables."""
    monkeypatch.setenv("KX_HOST_SECRET", "do-not-copy")
    code = "import os; print(os.environ.get('KX_HOST_SECRET'), os.environ.get('KX_MINE'))"
    options = PoolOptions(min_size=1, max_size=1)
    pool = KernelPool(DockerKernel, options=options, env={"KX_MINE": "given"})
    with pool, pool.acquire() as ex:
        result = ex.execute(code)
    assert result.output.split() == ["None", "given"], result.output
    assert os.environ["KX_HOST_SECRET"] == "do-not-copy"
