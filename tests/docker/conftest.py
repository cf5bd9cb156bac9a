"""Docker tier set-up: a real engine and the kernelexec image, or a clear skip.

With ``KERNELEXEC_REQUIRE_DOCKER=1`` (set by ``.ci/run``) a missing engine or image fails the
tests instead of skipping them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import docker
import pytest

from kernelexec._errors import DockerUnavailable
from kernelexec.backends._docker import DEFAULT_IMAGE, DockerOptions, make_client


def _unavailable(reason: str) -> None:
    if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (KERNELEXEC_REQUIRE_DOCKER=1, so this is a failure)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = make_client(DockerOptions())
    except DockerUnavailable as exc:
        _unavailable(f"no Docker engine answers: {exc}")
    try:
        client.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        client.close()
        _unavailable(f"image {DEFAULT_IMAGE} missing: run `kernelexec image build --offline`")
    yield client
    client.close()
