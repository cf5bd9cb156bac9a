"""What goes wrong on a real Swarm, and what the caller is told. These start from this host: the
kernel never answers in either case, so nothing needs to reach the overlay network."""

from __future__ import annotations

import io
import random
import time
import uuid
from collections.abc import Iterator

import docker
import pytest
from kx_cluster import Swarm

from kernelexec import BackendUnavailable, KernelExecutor, KernelStartFailed, ProvisionedKernel
from kernelexec.backends._docker_options import DEFAULT_IMAGE, LAUNCHERS_IMAGE

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _created(swarm: Swarm, since: set[str]) -> list[str]:
    return sorted(set(swarm.services()) - since)


def test_an_image_without_launchers_is_refused_before_any_service(use_specs: Swarm) -> None:
    name = use_specs.install_spec("kx_no_launchers", DEFAULT_IMAGE)
    before = set(use_specs.services())
    ex = KernelExecutor(ProvisionedKernel(name, username="kx"), startup_timeout=30)
    try:
        with pytest.raises(BackendUnavailable, match="--with-launchers"):
            ex.start()
    finally:
        ex.close()
    assert _created(use_specs, before) == []


@pytest.fixture
def silent_image(swarm: Swarm) -> Iterator[str]:
    """The launcher image whose kernel never starts (it only sleeps): a service that runs but
    never reports back."""
    tag = f"kx-test/silent:{uuid.uuid4().hex[:8]}"
    recipe = f'FROM {LAUNCHERS_IMAGE}\nCMD ["sleep", "600"]\n'.encode()
    swarm.client.images.build(fileobj=io.BytesIO(recipe), tag=tag, rm=True, forcerm=True)
    yield tag
    for _ in range(50):  # the removed service's container may hold the image a moment
        try:
            swarm.client.images.remove(tag)
            return
        except docker.errors.APIError:
            time.sleep(0.2)


def test_a_service_that_never_reports_back_times_out_and_is_removed(
    use_specs: Swarm, silent_image: str
) -> None:
    name = use_specs.install_spec("kx_silent", silent_image)
    before = set(use_specs.services())
    ex = KernelExecutor(ProvisionedKernel(name, username="kx"), startup_timeout=6)
    started = time.monotonic()
    try:
        with pytest.raises(KernelStartFailed, match="did not report back within 6 s"):
            ex.start()
    finally:
        ex.close()
    assert time.monotonic() - started < 40
    assert _created(use_specs, before) == []  # the provisioner removed the service it made
    # The provisioner's response manager outlives the launch (a process-wide poller): it must
    # not draw from the caller's global random generator (a seeded sequence stays the same).
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    time.sleep(0.5)  # tens of the poller's ticks
    assert [random.random() for _ in range(3)] == expected
