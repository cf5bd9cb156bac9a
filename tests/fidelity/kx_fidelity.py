"""Back ends of the fidelity tier, by name (a module of its own: tests/fidelity is not a package).

Each name is what ``make_executor`` gets, except ``docker-kernel-runsc`` / ``docker-command-runsc``
(the Docker back ends under gVisor). ``params()`` gives each its tier markers; ``problem()`` says
why a back end cannot run here (with CI's ``KERNELEXEC_REQUIRE_*`` set, the case fails instead).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

KERNELS = ("kernel", "fork-kernel", "sandboxed-kernel", "docker-kernel", "docker-kernel-runsc")
COMMANDS = ("command", "sandboxed-command", "docker-command", "docker-command-runsc")


def _marks(name: str) -> list[Any]:
    marks = []
    if name.startswith("docker"):
        marks.append(pytest.mark.docker)
    if name.endswith("-runsc"):
        marks.append(pytest.mark.gvisor)
    return marks


def params(names: Iterable[str]) -> list[Any]:
    """Parameters for ``@pytest.mark.parametrize("backend", ...)``."""
    return [pytest.param(name, marks=_marks(name), id=name) for name in names]


def _docker_problem(runtime: str | None) -> str | None:
    from kernelexec import DockerUnavailable
    from kernelexec.backends._docker import DEFAULT_IMAGE, DockerOptions, make_client

    try:
        client = make_client(DockerOptions())
    except DockerUnavailable as exc:
        return f"no Docker engine answers: {exc}"
    try:
        if not client.images.list(name=DEFAULT_IMAGE):
            return f"image {DEFAULT_IMAGE} missing: run `kernelexec image build --offline`"
        if runtime is not None and runtime not in (client.info().get("Runtimes") or {}):
            return f"the Docker engine has no runtime {runtime!r} (see .ci/gvisor.sh)"
    finally:
        client.close()
    return None


def problem(name: str) -> str | None:
    """Why ``name`` cannot run here (None: it can); a failure where CI requires it."""
    why, required = None, None
    if name.startswith("docker"):
        runsc = name.endswith("-runsc")
        why = _docker_problem("runsc" if runsc else None)
        required = "KERNELEXEC_REQUIRE_GVISOR" if runsc else "KERNELEXEC_REQUIRE_DOCKER"
    elif name.startswith("sandboxed"):
        from kernelexec import BackendUnavailable
        from kernelexec.backends._sandbox import check_sandbox

        required = "KERNELEXEC_REQUIRE_SANDBOX"
        try:
            check_sandbox()
        except BackendUnavailable as exc:
            why = str(exc)
    if why is not None and required is not None and os.environ.get(required) == "1":
        pytest.fail(f"{why} ({required}=1, so this is a failure)")
    return why


def make(name: str, work_dir: Path, **options: Any) -> Any:
    """A sync executor of back end ``name`` (skips when it cannot run here)."""
    from kernelexec import make_executor

    if (why := problem(name)) is not None:
        pytest.skip(why)
    if name.endswith("-runsc"):
        name, options = name.removesuffix("-runsc"), {"runtime": "runsc", **options}
    return make_executor(name, work_dir=work_dir, **options)
