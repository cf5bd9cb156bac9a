"""Adversarial tier set-up: one executor per back end per module, built through the registry.

``backend`` is parametrised indirectly by each case (``kx_adversarial.backends``); ``ex`` is a
module-scoped executor of that back end for the cases where state does not matter;
``nothing_left`` checks, after a case, that it left nothing running. A Docker back end needs a
real engine and the image: missing, the case skips (fails with ``KERNELEXEC_REQUIRE_DOCKER=1``,
as CI sets).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_adversarial import DOCKER, Running, kill_all, new_token

from kernelexec import make_executor
from kernelexec._errors import DockerUnavailable


def _docker_problem() -> str | None:
    import docker

    from kernelexec.backends._docker import DEFAULT_IMAGE, DockerOptions, make_client

    try:
        client = make_client(DockerOptions())
    except DockerUnavailable as exc:
        return f"no Docker engine answers: {exc}"
    try:
        client.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        return f"image {DEFAULT_IMAGE} missing: run `kernelexec image build --offline`"
    finally:
        client.close()
    return None


@pytest.fixture(scope="session")
def docker_problem() -> str | None:
    return _docker_problem()


def require(name: str, problem: str | None) -> None:
    if name in DOCKER and problem is not None:
        if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":
            pytest.fail(f"{problem} (KERNELEXEC_REQUIRE_DOCKER=1, so this is a failure)")
        pytest.skip(problem)


@pytest.fixture
def backend(request: pytest.FixtureRequest, docker_problem: str | None) -> str:
    name: str = request.param
    require(name, docker_problem)
    return name


class Executors:
    """Executors by back end name, built on first use and closed together.

    A cache of our own rather than a parametrised module fixture: pytest keys those by the
    parameter's position in each case's list, so cases with different back end lists would
    start the same back end again.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._open: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name not in self._open:
            work = self._root / name
            self._open[name] = make_executor(name, work_dir=work, timeout=30)
        return self._open[name]

    def open(self) -> list[Any]:
        return list(self._open.values())

    def close(self) -> None:
        for executor in self._open.values():
            executor.close()
        self._open.clear()


@pytest.fixture(scope="module")
def executors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executors]:
    cache = Executors(tmp_path_factory.mktemp("adv"))
    yield cache
    cache.close()


@pytest.fixture
def ex(backend: str, executors: Executors) -> Any:
    """The module's executor of ``backend``, shared by its cases (30 s default timeout)."""
    return executors.get(backend)


@pytest.fixture
def token() -> Iterator[str]:
    """A marker for the command lines of the processes a case starts; whatever still carries
    it after the case is killed (the case itself asserts; this only cleans up)."""
    value = new_token()
    yield value
    kill_all(value)


@pytest.fixture(scope="session")
def docker_client(docker_problem: str | None) -> Iterator[Any]:
    """One engine client for the checks (None without an engine)."""
    if docker_problem is not None:
        yield None
        return
    from kernelexec.backends._docker import DockerOptions, make_client

    client = make_client(DockerOptions())
    yield client
    client.close()


class NothingLeft:
    """The "nothing left running" check of a case (``kx_adversarial.Running``): ``check()``
    asserts it, with executors the case opened itself as ``also``; it also runs after the case."""

    def __init__(self, executors: Executors, running: Running) -> None:
        self._executors = executors
        self._running = running

    def check(self, also: tuple[Any, ...] = ()) -> None:
        left = self._running.left([*self._executors.open(), *also])
        assert left == [], f"left running: {left}"


@pytest.fixture
def nothing_left(
    backend: str, executors: Executors, token: str, docker_client: Any
) -> Iterator[NothingLeft]:
    """Asserts after the case that it left nothing running (see ``Running``). The engine is
    asked only on a Docker case: a local one starts no container."""
    client = docker_client if backend in DOCKER else None
    check = NothingLeft(executors, Running.now(executors.open(), token, client))
    yield check
    check.check()
