"""Fixtures for the framework adapters and the built-in loop: executors of both kinds, and the
throwaway venv + local wheel the "missing module" flow installs from (no network)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kernelexec import SyncExecutor, make_executor

from ._fixtures import build_demo_wheel, make_venv

KINDS = ["command", "kernel"]


def sync_executor(kind: str, **options: Any) -> SyncExecutor[Any]:
    return make_executor(kind, **options)


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def shared_executor(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One executor per kind for a module's tests where leftover state does not matter."""
    work = tmp_path_factory.mktemp(f"work-{kind}")
    with sync_executor(kind, work_dir=work, timeout=60) as executor:
        yield executor


@dataclass(frozen=True)
class PipSetup:
    """A venv the executor's Python installs into, and the wheel to install."""

    python: Path
    wheel: Path
    env: dict[str, str]


@pytest.fixture
def pip_setup(tmp_path: Path) -> PipSetup:
    python = make_venv(tmp_path / "venv")
    wheel = build_demo_wheel(tmp_path)
    path = f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {"PATH": path, "VIRTUAL_ENV": str(python.parent.parent), "PIP_NO_INDEX": "1"}
    return PipSetup(python=python, wheel=wheel, env=env)


def venv_executor(kind: str, setup: PipSetup, work_dir: Path) -> SyncExecutor[Any]:
    """An executor whose Python (process or kernel) is the throwaway venv's."""
    return sync_executor(kind, python=setup.python, env=setup.env, work_dir=work_dir, timeout=90)


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """A Docker engine and the kernelexec image, or a clear skip (a failure under
    ``KERNELEXEC_REQUIRE_DOCKER=1``, as in the Docker tier)."""
    from kernelexec._errors import DockerUnavailable
    from kernelexec.backends._docker import DEFAULT_IMAGE, DockerOptions, make_client

    def unavailable(reason: str) -> None:
        if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":
            pytest.fail(f"{reason} (KERNELEXEC_REQUIRE_DOCKER=1, so this is a failure)")
        pytest.skip(reason)

    try:
        client = make_client(DockerOptions())
    except DockerUnavailable as exc:
        unavailable(f"no Docker engine answers: {exc}")
    try:
        client.images.get(DEFAULT_IMAGE)
    except Exception:  # docker.errors.ImageNotFound, without importing docker at collection
        unavailable(f"image {DEFAULT_IMAGE} missing: run `kernelexec image build --offline`")
    finally:
        client.close()
