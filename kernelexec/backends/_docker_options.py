"""Docker settings: ``DockerOptions`` with the safe defaults, and the names containers carry.

Kept apart from the Docker SDK: configuring a Docker executor (and ``kernelexec --help``) must
not pay for importing ``docker``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any

from .._network import NetworkPolicy, NetworkSetting, check_network

DEFAULT_IMAGE = "kernelexec/python:latest"
#: the same image plus gateway_provisioners' kernel launchers (``image build --with-launchers``)
LAUNCHERS_IMAGE = "kernelexec/python:launchers"
#: the same image plus other languages' kernels (``image build --languages r,js,bash``)
LANGUAGES_IMAGE = "kernelexec/python:langs"
#: on an image made with the launchers: the gateway_provisioners version they came from
LABEL_LAUNCHERS = "kernelexec.launchers"
#: on every image kernelexec builds: the hash of its recipe
LABEL_RECIPE = "kernelexec.recipe"
#: on an image made with ``image build --languages``: the languages whose kernels it has
LABEL_LANGUAGES = "kernelexec.languages"
#: where the work dir is mounted in every kernelexec container
WORKSPACE = "/workspace"
#: the uid:gid used when the caller is root (containers never run as root by default)
UNPRIVILEGED_USER = "1000:1000"

LABEL_SESSION = "kernelexec.session"
LABEL_OWNER_PID = "kernelexec.owner_pid"
LABEL_HOST = "kernelexec.host"
LABEL_VERSION = "kernelexec.version"
LABEL_KIND = "kernelexec.kind"
#: a host folder the container's owner created for it (removed by ``gc`` too)
LABEL_RUNTIME_DIR = "kernelexec.runtime_dir"
RUNTIME_DIR_PREFIX = "kernelexec-run-"
#: a Docker kernel's host folder for its live forks' work dirs, mounted at ``BRANCHES``
LABEL_BRANCHES_DIR = "kernelexec.branches_dir"
BRANCHES_DIR_PREFIX = "kernelexec-branches-"
#: where a Docker kernel's live forks work (each in a folder of its own below it)
BRANCHES = "/kx-branches"
#: OCI runtimes whose containers run on the host's kernel (namespaces and cgroups only)
HOST_KERNEL_RUNTIMES = frozenset({"runc", "crun", "io.containerd.runc.v2"})


@dataclass(frozen=True, kw_only=True)
class DockerOptions(NetworkSetting):
    """How containers are created. The defaults are the safe ones; loosen them deliberately.

    ``user=None`` means the caller's uid:gid (so work-dir files belong to the caller), except
    when the caller is root: then ``UNPRIVILEGED_USER``, and the work dir is handed to that user.
    """

    image: str = DEFAULT_IMAGE
    user: str | None = None
    #: ``"none"`` (no network, the default), ``"all"`` (the engine's bridge: an explicit opt-in)
    #: or a ``NetworkPolicy``: still no network, and a host-side proxy reached on the
    #: container's loopback opens only what it allows (see ``backends/_egress``). ``False`` and
    #: ``True`` are the old spellings of ``"none"`` and ``"all"``.
    network: bool | str | NetworkPolicy = False
    memory: str | None = "2g"
    cpus: float | None = 1.0
    pids_limit: int | None = 256
    read_only: bool = False
    tmpfs_size: str = "512m"
    cap_drop: Sequence[str] = ("ALL",)
    security_opt: Sequence[str] = ("no-new-privileges",)
    environment: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    #: extra keyword arguments for ``containers.run`` (volumes, devices, ...)
    run_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: engine address; None reads DOCKER_HOST & co. when the client is built
    base_url: str | None = None
    #: seconds an engine API call may take before it counts as a dead engine
    api_timeout: float = 30.0
    #: the work dir's path on the engine's host, when this process sees it elsewhere (Docker out
    #: of Docker: kernelexec in a container with the engine's socket mounted). None: the work
    #: dir's own path. The Docker kernel's runtime folder (its ipc sockets) then goes under the
    #: work dir's ``.kernelexec/`` too, so the engine finds it the same way.
    bind_dir: str | os.PathLike[str] | None = None
    #: remove the container when the executor closes; False keeps it (stopped, or running with
    #: ``stop_container=False``) for inspection. ``kernelexec gc`` removes it once its owner exits.
    auto_remove: bool = True
    #: stop the container when the executor closes; False leaves it running (and kept)
    stop_container: bool = True
    #: the container's name (None: the engine picks one); a name already in use is an error
    container_name: str | None = None
    #: the OCI runtime the engine runs containers with, by the name it is registered under in
    #: the engine's ``daemon.json`` (None: the engine's default, normally ``runc``).
    #: ``"runsc"`` is gVisor: the container's syscalls go to a kernel in user space instead of
    #: the host's. The image and every other setting stay as they are.
    runtime: str | None = None

    def __post_init__(self) -> None:
        check_network(self.network)
        if self.bind_dir is not None and not PurePosixPath(os.fspath(self.bind_dir)).is_absolute():
            raise ValueError(
                f"bind_dir must be an absolute path on the Docker host: {self.bind_dir!r}"
            )
        if self.container_name is not None and not self.container_name.strip():
            raise ValueError("container_name must not be empty")
        if self.runtime is not None and not self.runtime.strip():
            raise ValueError("runtime must not be empty (None: the engine's default)")

    @property
    def shares_host_kernel(self) -> bool:
        """Whether the container's processes run on the host's kernel (runc and its kin).

        Only then are sockets the container creates in a bind-mounted folder sockets the host
        can connect to: under gVisor (``runsc``) or a VM runtime they live in the sandbox's own
        kernel, and the Docker kernel needs another way in (see ``_docker_relay``).
        """
        return self.runtime is None or self.runtime in HOST_KERNEL_RUNTIMES

    @property
    def keeps_container(self) -> bool:
        """Whether ``close()`` leaves the container in place (stopped or running)."""
        return not (self.auto_remove and self.stop_container)

    def resolved_user(self) -> str:
        """The ``uid:gid`` containers run as."""
        if self.user is not None:
            return self.user
        if not hasattr(os, "getuid") or os.getuid() == 0:
            return UNPRIVILEGED_USER
        return f"{os.getuid()}:{os.getgid()}"


def merge_options(
    options: DockerOptions | None, image: str | None, overrides: Mapping[str, Any]
) -> DockerOptions:
    """The options a Docker back end runs with: ``options`` (or the defaults), then ``image`` and
    the keyword ``overrides`` (``DockerOptions`` fields; an unknown name raises ``TypeError``)."""
    if image is not None:
        overrides = {**overrides, "image": image}
    return replace(options or DockerOptions(), **overrides)
