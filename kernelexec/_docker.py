"""What the Docker back ends share: options with safe defaults, the client, labels, gc.

Every blocking Docker SDK call made by a back end runs in a worker thread (``asyncio.to_thread``)
so the event loop stays free; errors from the SDK and from the engine's socket are translated
here, once, into the ``KernelExecError`` tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from ._errors import DockerUnavailable, ImageNotFound, KernelExecError
from ._version import __version__

DEFAULT_IMAGE = "kernelexec/python:latest"
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

_HOW_TO_START = (
    "Start one with `sudo systemctl start docker` (or run `dockerd` as root in the background), "
    "or point DOCKER_HOST at a running engine."
)


@dataclass(frozen=True, kw_only=True)
class DockerOptions:
    """How containers are created. The defaults are the safe ones; loosen them deliberately.

    ``user=None`` means the caller's uid:gid (so work-dir files belong to the caller), except
    when the caller is root: then ``UNPRIVILEGED_USER``, and the work dir is handed to that user.
    """

    image: str = DEFAULT_IMAGE
    user: str | None = None
    network: bool = False
    memory: str | None = "2g"
    cpus: float | None = 1.0
    pids_limit: int | None = 256
    read_only: bool = False
    tmpfs_size: str = "512m"
    cap_drop: Sequence[str] = ("ALL",)
    security_opt: Sequence[str] = ("no-new-privileges",)
    environment: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    #: extra keyword arguments for ``containers.run`` (volumes, devices, runtime, ...)
    run_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: engine address; None reads DOCKER_HOST & co. when the client is built
    base_url: str | None = None
    #: seconds an engine API call may take before it counts as a dead engine
    api_timeout: float = 30.0

    def resolved_user(self) -> str:
        """The ``uid:gid`` containers run as."""
        if self.user is not None:
            return self.user
        if not hasattr(os, "getuid") or os.getuid() == 0:
            return UNPRIVILEGED_USER
        return f"{os.getuid()}:{os.getgid()}"


def make_client(options: DockerOptions) -> docker.DockerClient:
    """A client that has answered a ping; ``DockerUnavailable`` otherwise."""
    timeout = int(options.api_timeout)
    where = options.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        _probe_unix_socket(where, options.api_timeout)
        if options.base_url is not None:
            client = docker.DockerClient(base_url=options.base_url, timeout=timeout)
        else:
            client = docker.DockerClient.from_env(timeout=timeout)
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise DockerUnavailable(
            f"No Docker engine answers at {where}: {exc}. {_HOW_TO_START}"
        ) from exc
    try:
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        client.close()
        raise DockerUnavailable(
            f"No Docker engine answers at {where}: {exc}. {_HOW_TO_START}"
        ) from exc
    return client


def _probe_unix_socket(url: str, timeout: float) -> None:
    """Connect once to a unix-socket engine address, closing the socket whatever happens.

    The SDK leaks its socket when a unix-socket connect fails; probing first avoids that.
    """
    for prefix in ("unix://", "http+unix://"):
        if url.startswith(prefix):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(timeout)
                probe.connect(url[len(prefix) :])
            return


def image_missing_message(image: str) -> str:
    return (
        f"Docker image {image!r} is not present on this engine. Build it with "
        "`kernelexec image build --offline` (no registry needed) or `kernelexec image build`."
    )


def check_image(client: docker.DockerClient, image: str) -> None:
    """Raise ``ImageNotFound`` (naming the build command) unless ``image`` exists locally."""
    with translate_errors():
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound as exc:
            raise ImageNotFound(image_missing_message(image)) from exc


@contextlib.contextmanager
def translate_errors(what: str = "Docker call") -> Iterator[None]:
    """Turn engine and connection failures into ``DockerUnavailable``."""
    try:
        yield
    except KernelExecError:
        raise
    except docker.errors.ImageNotFound as exc:
        raise ImageNotFound(str(exc)) from exc
    except (requests.exceptions.RequestException, ConnectionError) as exc:
        raise DockerUnavailable(
            f"{what} failed: the Docker engine stopped answering ({exc})"
        ) from exc
    except docker.errors.APIError as exc:
        raise DockerUnavailable(f"{what} failed: {exc.explanation or exc}") from exc
    except docker.errors.DockerException as exc:
        raise DockerUnavailable(f"{what} failed: {exc}") from exc


_T = TypeVar("_T")


def call(what: str, func: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """``func(*args, **kwargs)`` with Docker errors translated (meant for worker threads)."""
    with translate_errors(what):
        return func(*args, **kwargs)


def new_session_id() -> str:
    return uuid.uuid4().hex[:12]


def labels_for(kind: str, session: str, options: DockerOptions, **extra: str) -> dict[str, str]:
    """The labels every container kernelexec creates carries (``gc`` relies on them)."""
    return {
        **options.labels,
        LABEL_SESSION: session,
        LABEL_OWNER_PID: str(os.getpid()),
        LABEL_HOST: socket.gethostname(),
        LABEL_VERSION: __version__,
        LABEL_KIND: kind,
        **extra,
    }


def container_kwargs(options: DockerOptions, *, labels: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for ``containers.run`` that apply the safe defaults."""
    kwargs: dict[str, Any] = {
        "user": options.resolved_user(),
        "cap_drop": list(options.cap_drop),
        "security_opt": list(options.security_opt),
        "labels": dict(labels),
        "detach": True,
        "stdin_open": False,
        "tty": False,
        "working_dir": WORKSPACE,
    }
    if options.pids_limit is not None:
        kwargs["pids_limit"] = options.pids_limit
    if options.memory is not None:
        # Same value for memory+swap: no swap, so a memory hog is killed instead of thrashing.
        kwargs["mem_limit"] = options.memory
        kwargs["memswap_limit"] = options.memory
    if options.cpus is not None:
        kwargs["nano_cpus"] = int(options.cpus * 1e9)
    if not options.network:
        kwargs["network_mode"] = "none"
    if options.read_only:
        kwargs["read_only"] = True
    # A writable /tmp even with a read-only root; HOME points there for caches and history.
    kwargs["tmpfs"] = {"/tmp": f"rw,nosuid,nodev,size={options.tmpfs_size},mode=1777"}
    kwargs.update(options.run_kwargs)
    return kwargs


def container_env(options: DockerOptions, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment code in the container sees (never the host's)."""
    # No MPLBACKEND here: a kernel picks its inline back end; command runs set Agg themselves.
    base = {"HOME": "/tmp", "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"}
    return {**base, **options.environment, **(extra or {})}


def prepare_host_dir(path: Path, options: DockerOptions) -> None:
    """Let the container user write to ``path`` when we are root and it is not.

    Only the folder itself changes owner; files already inside keep theirs (readable as before).
    """
    if not hasattr(os, "getuid") or os.getuid() != 0:
        return
    uid, _, gid = options.resolved_user().partition(":")
    if not uid.isdigit() or uid == "0":
        return
    os.chown(path, int(uid), int(gid) if gid.isdigit() else int(uid))


def force_remove(container: Any) -> None:
    """Kill and remove a container at once (no stop grace period); gone already is fine."""
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gc(options: DockerOptions | None = None, *, dry_run: bool = False) -> list[str]:
    """Remove kernelexec containers on this host whose owner process is gone.

    Returns the short ids of the containers removed (or that would be, with ``dry_run``).
    """
    options = options or DockerOptions()
    client = make_client(options)
    try:
        with translate_errors("listing containers"):
            found = client.containers.list(all=True, filters={"label": LABEL_SESSION})
        removed: list[str] = []
        for container in found:
            labels = container.labels
            if labels.get(LABEL_HOST) != socket.gethostname():
                continue
            pid = labels.get(LABEL_OWNER_PID, "")
            if pid.isdigit() and _pid_alive(int(pid)):
                continue
            removed.append(container.short_id)
            if not dry_run:
                with translate_errors("removing a container"):
                    force_remove(container)
                _remove_runtime_dir(labels.get(LABEL_RUNTIME_DIR))
        return removed
    finally:
        client.close()


def _remove_runtime_dir(label: str | None) -> None:
    """Remove a runtime dir named by a label, but only one kernelexec could have made.

    Anyone who can create containers can write labels: never delete an arbitrary path for them.
    """
    if not label:
        return
    path = Path(label)
    if path.name.startswith(RUNTIME_DIR_PREFIX) and path.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(path, ignore_errors=True)
