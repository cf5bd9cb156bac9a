"""Executor names mapped to executors: the one place a name like ``"docker-kernel"`` is resolved.

The CLI's ``--executor``, the notebook runner, the agent loop, the framework adapters and the
benchmark all build executors through ``make_executor`` / ``make_async_executor``; an unknown
name fails the same way everywhere (``UnknownExecutor``, a ``ValueError`` naming the valid ones).

Options are the executor's keyword arguments. Back-end options ride along: a Docker name takes
``DockerOptions`` fields (``image=``, ``memory=``, ...) and a gateway takes ``url``, ``token``,
``user``; they are split off and given to the back end. The executor and back-end modules are
imported only when a name is used (start-up time: ``kernelexec --help`` must not load
jupyter_client or the Docker SDK).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import UnknownExecutor

if TYPE_CHECKING:
    from ._executor import AsyncExecutor, SyncExecutor

#: the name used when none is given: the embedded default, a local kernel
DEFAULT_EXECUTOR = "kernel"


@dataclass(frozen=True, kw_only=True)
class ExecutorEntry:
    """One registered name: what it is, and how to build its async core."""

    name: str
    stateful: bool
    summary: str
    build: Callable[..., AsyncExecutor]


def _command(**options: Any) -> AsyncExecutor:
    from ._command import AsyncCommandLineExecutor

    return AsyncCommandLineExecutor(**options)


def _warm_command(**options: Any) -> AsyncExecutor:
    from ._command import AsyncCommandLineExecutor
    from .backends.warm_command import WarmCommand

    names = ("warm_up", "python", "containment", "sandbox")
    extra = {k: options.pop(k) for k in names if k in options}
    return AsyncCommandLineExecutor(WarmCommand(**extra), **options)


def _kernel(**options: Any) -> AsyncExecutor:
    from ._kernel import AsyncKernelExecutor

    return AsyncKernelExecutor(**options)


def _fork_kernel(**options: Any) -> AsyncExecutor:
    from ._kernel import AsyncKernelExecutor
    from .backends.fork_kernel import ForkKernel

    extra = {k: options.pop(k) for k in ("warm_up", "python") if k in options}
    return AsyncKernelExecutor(ForkKernel(**extra), **options)


def _sandboxed_kernel(**options: Any) -> AsyncExecutor:
    from ._kernel import AsyncKernelExecutor
    from .backends.sandboxed import SandboxedKernel

    extra = {k: options.pop(k) for k in ("sandbox", "python", "kernel_name") if k in options}
    return AsyncKernelExecutor(SandboxedKernel(**extra), **options)


def _sandboxed_command(**options: Any) -> AsyncExecutor:
    from ._command import AsyncCommandLineExecutor
    from .backends.sandboxed import SandboxedCommand

    extra = {k: options.pop(k) for k in ("sandbox", "python", "kill_grace") if k in options}
    return AsyncCommandLineExecutor(SandboxedCommand(**extra), **options)


def _docker_backend_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the ``DockerOptions`` fields (and ``options=``) out of ``options``."""
    from .backends._docker_options import DockerOptions

    names = {f.name for f in dataclasses.fields(DockerOptions)} | {"options"}
    return {name: options.pop(name) for name in list(options) if name in names}


def _docker_command(**options: Any) -> AsyncExecutor:
    from ._command import AsyncCommandLineExecutor
    from .backends.docker_command import DockerCommand

    extra = {k: options.pop(k) for k in ("fresh_container", "kill_grace") if k in options}
    backend = DockerCommand(**_docker_backend_options(options), **extra)
    return AsyncCommandLineExecutor(backend, **options)


def _docker_kernel(**options: Any) -> AsyncExecutor:
    from ._kernel import AsyncKernelExecutor
    from .backends.docker_kernel import DockerKernel

    backend = DockerKernel(**_docker_backend_options(options))
    return AsyncKernelExecutor(backend, **options)


def _gateway(
    *, url: str, token: str | None = None, user: str | None = None, **options: Any
) -> AsyncExecutor:
    from ._kernel import AsyncKernelExecutor
    from .backends.gateway_kernel import GatewayKernel

    backend_keys = ("kernel_name", "working_dir", "gateway_options")
    extra = {k: options.pop(k) for k in backend_keys if k in options}
    if "gateway_options" in extra:
        extra["options"] = extra.pop("gateway_options")
    backend = GatewayKernel(url, token=token, username=user, **extra)
    return AsyncKernelExecutor(backend, **options)


def _provisioned_kernel(
    *, kernel_name: str | None = None, user: str | None = None, **options: Any
) -> AsyncExecutor:
    from ._kernel import AsyncKernelExecutor
    from .backends.provisioned_kernel import ProvisionedKernel

    if not kernel_name:
        raise ValueError(
            "provisioned-kernel needs kernel_name= (an installed kernelspec with a provisioner; "
            "ProvisionedKernel.available_kernels() lists them)"
        )

    backend_keys = ("working_dir", "provisioned_options", "kernel_spec_manager")
    extra = {k: options.pop(k) for k in backend_keys if k in options}
    if "provisioned_options" in extra:
        extra["options"] = extra.pop("provisioned_options")
    backend = ProvisionedKernel(kernel_name, username=user, **extra)
    return AsyncKernelExecutor(backend, **options)


_ENTRIES = (
    ExecutorEntry(name="kernel", stateful=True, summary="a local IPython kernel", build=_kernel),
    ExecutorEntry(
        name="command", stateful=False, summary="a local process per block", build=_command
    ),
    ExecutorEntry(
        name="warm-command",
        stateful=False,
        summary="a process per block forked from a warm interpreter (numpy, pandas preloaded)",
        build=_warm_command,
    ),
    ExecutorEntry(
        name="fork-kernel",
        stateful=True,
        summary="a local kernel forked from a warm server (starts in tens of ms)",
        build=_fork_kernel,
    ),
    ExecutorEntry(
        name="sandboxed-kernel",
        stateful=True,
        summary="a local kernel in a bubblewrap sandbox (no network, read-only host)",
        build=_sandboxed_kernel,
    ),
    ExecutorEntry(
        name="sandboxed-command",
        stateful=False,
        summary="a local process per block in a bubblewrap sandbox",
        build=_sandboxed_command,
    ),
    ExecutorEntry(
        name="docker-kernel",
        stateful=True,
        summary="an IPython kernel in a locked-down container",
        build=_docker_kernel,
    ),
    ExecutorEntry(
        name="docker-command",
        stateful=False,
        summary="a process per block in a locked-down container",
        build=_docker_command,
    ),
    ExecutorEntry(
        name="gateway",
        stateful=True,
        summary="a kernel on a Jupyter Kernel / Enterprise Gateway",
        build=_gateway,
    ),
    ExecutorEntry(
        name="provisioned-kernel",
        stateful=True,
        summary="a kernel started by its kernelspec's provisioner (Docker Swarm, Kubernetes, ...)",
        build=_provisioned_kernel,
    ),
)

#: every registered name, in the order they are listed to users
EXECUTORS: dict[str, ExecutorEntry] = {entry.name: entry for entry in _ENTRIES}
EXECUTOR_NAMES: tuple[str, ...] = tuple(EXECUTORS)


def executor_entry(name: str) -> ExecutorEntry:
    """The entry for ``name``; ``UnknownExecutor`` (a ``ValueError``) lists the valid names."""
    try:
        return EXECUTORS[name]
    except (KeyError, TypeError):
        valid = ", ".join(EXECUTOR_NAMES)
        raise UnknownExecutor(f"unknown executor {name!r} (valid: {valid})") from None


def make_async_executor(name: str, **options: Any) -> AsyncExecutor:
    """The async executor ``name`` stands for, built with ``options``."""
    return executor_entry(name).build(**options)


def make_executor(name: str, **options: Any) -> SyncExecutor[Any]:
    """The synchronous executor ``name`` stands for, built with ``options``."""
    from ._executor import SyncExecutor  # start-up time: nbformat comes with it

    return SyncExecutor.wrap(make_async_executor(name, **options))
