"""What the Docker back ends share: the client, error translation, labels, the container helper, gc.

Settings (``DockerOptions``) and the names containers carry live in ``_docker_options`` (no Docker
SDK import there); they are re-exported here. Every blocking Docker SDK call made by a back end
runs in a worker thread (``asyncio.to_thread``) so the event loop stays free; errors from the SDK
and from the engine's socket are translated here, once, into the ``KernelExecError`` tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import docker
import docker.errors
import docker.types
import requests.exceptions

from .._door import Door
from .._errors import (
    DockerConfigError,
    DockerUnavailable,
    ImageNotFound,
    KernelExecError,
)
from .._types import NetworkEvent
from .._version import __version__
from .._workdir import INTERNAL_DIR
from ._docker_options import BRANCHES_DIR_PREFIX, LABEL_BRANCHES_DIR, LAUNCHERS_IMAGE
from ._docker_options import DEFAULT_IMAGE as DEFAULT_IMAGE
from ._docker_options import LABEL_HOST as LABEL_HOST
from ._docker_options import LABEL_KIND as LABEL_KIND
from ._docker_options import LABEL_OWNER_PID as LABEL_OWNER_PID
from ._docker_options import LABEL_RUNTIME_DIR as LABEL_RUNTIME_DIR
from ._docker_options import LABEL_SESSION as LABEL_SESSION
from ._docker_options import LABEL_VERSION as LABEL_VERSION
from ._docker_options import RUNTIME_DIR_PREFIX as RUNTIME_DIR_PREFIX
from ._docker_options import UNPRIVILEGED_USER as UNPRIVILEGED_USER
from ._docker_options import WORKSPACE as WORKSPACE
from ._docker_options import DockerOptions as DockerOptions
from ._docker_options import merge_options as merge_options
from ._docker_relay import RELAY_SCRIPT, Relay
from ._egress import (
    DNS_TRAP,
    PROXY_PORT,
    RELAY_USER,
    Egress,
    install_packages,
    proxy_environment,
    relay_refusal,
)
from ._owner import OWNER_ENV, OWNER_LABEL, Owner, State, owner_state, this_process
from ._secrets import CONTAINER_BUNDLE, CONTAINER_BUNDLE_SCRIPT, SessionSecrets
from ._wheels import CONTAINER_WHEELS

_HOW_TO_START = (
    "Start one with `sudo systemctl start docker` (or run `dockerd` as root in the background), "
    "or point DOCKER_HOST at a running engine."
)
_HOW_TO_MOUNT = (
    " This process runs in a container: mount the host engine's socket into it "
    "(`docker run -v /var/run/docker.sock:/var/run/docker.sock ...`) and give the executor "
    "bind_dir= (the work dir's path on the host)."
)
#: the Docker out of Docker advice, for errors about paths the engine cannot find
_BIND_DIR_HINT = (
    "Running kernelexec inside a container (Docker out of Docker)? The engine mounts paths of "
    "its own host: set bind_dir= (DockerOptions) to the work dir's path on the Docker host."
)

log = logging.getLogger("kernelexec.docker")
#: the label Swarm puts on a service's task containers
_SWARM_SERVICE_LABEL = "com.docker.swarm.service.id"


def in_container() -> bool:
    """Whether this process looks like it runs in a Docker (or Podman) container."""
    return Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()


def _no_engine(where: str, exc: BaseException) -> DockerUnavailable:
    hint = _HOW_TO_MOUNT if in_container() else ""
    return DockerUnavailable(f"No Docker engine answers at {where}: {exc}. {_HOW_TO_START}{hint}")


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
        raise _no_engine(where, exc) from exc
    try:
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        client.close()
        raise _no_engine(where, exc) from exc
    return client


def no_engine(options: DockerOptions | None = None) -> DockerUnavailable | None:
    """Why no engine answers at ``options``' address, or None when one does."""
    try:
        make_client(options or DockerOptions()).close()
    except DockerUnavailable as exc:
        return exc
    return None


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
    """How to get ``image``: kernelexec's build command builds only its own two images."""
    missing = f"Docker image {image!r} is not present on this engine."
    if _with_tag(image) == DEFAULT_IMAGE:
        return (
            f"{missing} Build it with `kernelexec image build --offline` (no registry needed) "
            "or `kernelexec image build`."
        )
    if _with_tag(image) == LAUNCHERS_IMAGE:
        return f"{missing} Build it with `kernelexec image build --offline --with-launchers`."
    return (
        f"{missing} Pull it (`docker pull {image}`) or build it from its Dockerfile "
        f"(`docker build -t {image} .`); it needs Python with ipykernel for the kernel "
        "executors."
    )


def _with_tag(image: str) -> str:
    """``name`` as the engine reads it: ``name:latest`` when no tag (nor digest) is given."""
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last or "@" in last else f"{image}:latest"


def check_image(client: docker.DockerClient, image: str) -> None:
    """Raise ``ImageNotFound`` (naming the build command) unless ``image`` exists locally."""
    with translate_errors(image=image):
        client.images.get(image)


def find_image(client: docker.DockerClient, tag: str) -> Any:
    """The local image ``tag``, or None when the engine has none.

    Other SDK errors pass through untranslated: call this through ``call`` (or inside
    ``translate_errors``) with words that say what the caller was doing.
    """
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:  # absent is an answer here, not a failure
        return None


@contextlib.contextmanager
def translate_errors(what: str = "Docker call", *, image: str | None = None) -> Iterator[None]:
    """Turn engine and connection failures into ``DockerUnavailable``.

    A missing image becomes ``ImageNotFound``; naming the ``image`` the block uses makes its
    message say how to build it.
    """
    try:
        yield
    except KernelExecError:
        raise
    except docker.errors.ImageNotFound as exc:
        message = image_missing_message(image) if image is not None else str(exc)
        raise ImageNotFound(message) from exc
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
        OWNER_LABEL: this_process().to_text(),
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
    if not options.full_network:
        kwargs["network_mode"] = "none"
    if options.egress_policy is not None:
        # The resolver is the egress relay's DNS trap (it refuses and logs every query), which
        # binds port 53 as an unprivileged uid; the namespace has loopback only.
        kwargs["dns"] = [DNS_TRAP]
        kwargs["sysctls"] = {"net.ipv4.ip_unprivileged_port_start": "0"}
    if options.read_only:
        kwargs["read_only"] = True
    if options.runtime is not None:
        kwargs["runtime"] = options.runtime
    # A writable /tmp even with a read-only root; HOME points there for caches and history.
    kwargs["tmpfs"] = {"/tmp": f"rw,nosuid,nodev,size={options.tmpfs_size},mode=1777"}
    extra = dict(options.run_kwargs)
    # run_kwargs' labels add to kernelexec's (its owner labels win: ``gc`` relies on them);
    # its environment goes through container_env, which every container and exec uses.
    kwargs["labels"] = {**_as_mapping(extra.pop("labels", None), ""), **labels}
    extra.pop("environment", None)
    kwargs.update(extra)
    return kwargs


def container_env(
    options: DockerOptions, extra: Mapping[str, str] | None = None, egress: Egress | None = None
) -> dict[str, str]:
    """The environment code in the container sees (never the host's): kernelexec's defaults,
    then the caller's (``run_kwargs["environment"]``, then ``environment``), then ``extra``;
    the session's secret placeholders (never values) and CA bundle when ``egress`` has any."""
    # No MPLBACKEND here: a kernel picks its inline back end; command runs set Agg themselves.
    base = {"HOME": "/tmp", "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"}
    given = _as_mapping(options.run_kwargs.get("environment"), None)
    policy = options.egress_policy
    # The proxy's variables win over the caller's: the policy is the one way out.
    proxy = proxy_environment(policy) if policy is not None else {}
    if egress is not None and egress.secrets is not None:
        proxy.update(egress.secrets.environment(CONTAINER_BUNDLE))
    return {**base, **given, **options.environment, **(extra or {}), **proxy}


def _as_mapping(value: Any, bare: str | None) -> dict[str, str]:
    """docker-py's dict-or-list form of labels and environment as a dict: ``"K=V"`` items split;
    a bare ``"K"`` is a label with value ``bare`` (an environment name without ``=`` is
    dropped, as the engine passes no value for it)."""
    if not value:
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    pairs: dict[str, str] = {}
    for item in value:
        name, eq, text = str(item).partition("=")
        if eq:
            pairs[name] = text
        elif bare is not None:
            pairs[name] = bare
    return pairs


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


def prepare_inside(door: Door, path: str, options: DockerOptions) -> None:
    """``prepare_host_dir`` for a folder inside the work dir, made and handed over through its
    door: the code may have planted a link there, whose target root must not give away."""
    door.makedirs(path)
    if not hasattr(os, "getuid") or os.getuid() != 0:
        return
    uid, _, gid = options.resolved_user().partition(":")
    if uid.isdigit() and uid != "0":
        door.chown(path, int(uid), int(gid) if gid.isdigit() else int(uid))


def force_remove(container: Any) -> None:
    """Kill and remove a container at once (no stop grace period); gone already is fine."""
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True)


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """What a back end runs in a container; ``ContainerHandle`` adds the safe defaults, the
    labels and the work dir mount (at ``WORKSPACE``)."""

    command: Sequence[str]
    #: Docker's init (tini) as PID 1, or the command itself
    init: bool
    #: more host folders to bind-mount read-write: host path -> path inside the container
    mounts: Mapping[Path, str] = field(default_factory=dict)
    #: variables on top of ``container_env``'s
    environment: Mapping[str, str] = field(default_factory=dict)
    #: labels on top of ``labels_for``'s
    labels: Mapping[str, str] = field(default_factory=dict)
    #: ``containers.create`` keyword arguments that win over ``DockerOptions.run_kwargs``
    run_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: the step a failure names (in ``DockerUnavailable``'s message)
    what: str = "creating a container"


class ContainerHandle:
    """A Docker back end's engine client and its current container.

    The back end says what to run (``ContainerSpec``); the handle makes the client, checks the
    image, creates, starts, execs in and removes containers, each blocking SDK call in a worker
    thread and every SDK error translated here. ``container`` is the current container (a docker
    SDK ``Container``) or None; ``create`` makes one the handle does not keep (the caller
    removes it).
    """

    def __init__(self, options: DockerOptions, *, kind: str) -> None:
        self.options = options
        self.kind = kind
        self.session = new_session_id()
        self.container: Any = None
        self.work_dir: Path | None = None
        #: the work dir's door (see ``_door``): kernelexec's own files there go through it
        self.door: Door | None = None
        #: where the container ``close()`` kept is (``DockerOptions.auto_remove`` /
        #: ``stop_container``), in words; None when nothing was kept
        self.kept: str | None = None
        #: the session's egress proxy (``network=NetworkPolicy(...)``), made by ``prepare``
        self.egress: Egress | None = None
        self._client: docker.DockerClient | None = None

    async def prepare(self, work_dir: Path) -> None:
        """Connect (once per handle until ``close``), check the image, hand ``work_dir`` (mounted
        at ``WORKSPACE`` in every container) to the container user."""
        self.work_dir = work_dir
        if self.door is None or self.door.root != work_dir.absolute():
            self.door = Door(work_dir)
        if self._client is None:
            self._client = await asyncio.to_thread(make_client, self.options)
        await asyncio.to_thread(check_image, self._client, self.options.image)
        await asyncio.to_thread(prepare_host_dir, work_dir, self.options)
        policy = self.options.egress_policy
        if policy is not None and self.egress is None:
            self.egress = await asyncio.to_thread(Egress, policy)

    async def create(self, spec: ContainerSpec) -> Any:
        """Create and start a container that the handle does not keep."""
        return await asyncio.to_thread(self._create, spec)

    async def start(self, spec: ContainerSpec) -> Any:
        """Create and start the current container, removing the one before (if any) first.

        When that removal or the new container fails, the one before stays current.
        """
        if self.container is not None:
            await self.remove(self.container)
        self.container = await self.create(spec)
        return self.container

    async def remove(self, container: Any = None, *, best_effort: bool = False) -> None:
        """Kill and remove ``container`` at once; by default the current one, forgotten first.

        ``best_effort``: a failing engine is no error (``kernelexec gc``, which finds the
        container by its labels, removes it later).
        """
        if container is None:
            container, self.container = self.container, None
            if container is None:
                return
        try:
            await self.call("removing the container", force_remove, container)
        except DockerUnavailable:
            if not best_effort:
                raise
        finally:
            if self.egress is not None:
                await asyncio.to_thread(self.egress.drop_relay, container.id)

    async def release(self) -> str | None:
        """At ``close()``: remove the current container, or keep it as the options say.

        ``auto_remove=False`` stops it and keeps it; ``stop_container=False`` leaves it running.
        A kept container keeps its labels (``kernelexec gc`` removes it once this process is
        gone); where it is goes to ``kept``, the return value and the ``kernelexec.docker`` log.
        A failing engine is no error here (as with ``remove(best_effort=True)``).
        """
        if not self.options.keeps_container:
            await self.remove(best_effort=True)
            return None
        container, self.container = self.container, None
        if container is None:
            return None
        try:
            if self.options.stop_container:
                await self.call("stopping the container", container.stop, timeout=5)
            await self.call("inspecting the container", container.reload)
        except DockerUnavailable:
            return None
        state = "running" if container.status == "running" else "stopped"
        self.kept = (
            f"container {container.name} ({container.short_id}, {state}) was kept: "
            f"inspect it with `docker logs {container.name}` or `docker exec -it {container.name} "
            f"bash`; remove it with `docker rm -f {container.name}` (or `kernelexec gc` once this "
            "process has exited)"
        )
        log.warning("kernelexec: %s", self.kept)
        return self.kept

    def host_path(self, path: Path) -> str:
        """Where the engine finds ``path`` (a folder this process sees): under ``bind_dir`` when
        it is the work dir or inside it, else ``path`` itself."""
        bind = self.options.bind_dir
        if bind is None or self.work_dir is None:
            return str(path)
        try:
            inside = path.relative_to(self.work_dir)
        except ValueError:
            return str(path)
        return str(PurePosixPath(os.fspath(bind), *inside.parts))

    async def reload(self, container: Any) -> bool:
        """Refresh ``container``'s state; False when the engine no longer has it at all."""
        return await self.call("inspecting the container", _reload, container)

    async def take_network_log(self) -> list[NetworkEvent]:
        """The egress proxy's log since the last call (empty without a policy)."""
        if self.egress is None:
            return []
        return await asyncio.to_thread(self.egress.take_log)

    async def call(self, what: str, func: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        """``func(*args, **kwargs)`` in a worker thread, Docker errors translated."""
        return await asyncio.to_thread(call, what, func, *args, **kwargs)

    async def exec_stream(
        self,
        container: Any,
        argv: Sequence[str],
        environment: Mapping[str, str],
        *,
        stdin: bool = False,
        workdir: str = WORKSPACE,
    ) -> tuple[str, Any]:
        """Start ``argv`` in ``container`` (in ``workdir``, with ``container_env`` plus
        ``environment``): the exec's id and the socket its multiplexed output arrives on (and,
        with ``stdin``, its raw input goes to)."""
        env = container_env(self.options, environment, self.egress)
        return await self.call(
            "docker exec", _exec_start, self._api(), container.id, argv, env, stdin, "", workdir
        )

    async def exec_exit_code(self, exec_id: str) -> int:
        """The exit status of an exec whose output has ended, once the engine has recorded it."""
        return await asyncio.to_thread(_exit_code, self._api(), exec_id)

    async def exec_quiet(self, container: Any, script: str) -> int:
        """Run a shell script in ``container`` (output discarded) and return its exit status."""
        return await asyncio.to_thread(_run_quiet, self._api(), container.id, script)

    def close(self) -> None:
        """Close the client; the current container (if any) is ``remove``'s business."""
        client, self._client = self._client, None
        if client is not None:
            client.close()
        egress, self.egress = self.egress, None
        if egress is not None:
            egress.close()
        if self.door is not None:
            self.door.close()

    def _api(self) -> docker.APIClient:
        assert self._client is not None
        return self._client.api

    def _create(self, spec: ContainerSpec) -> Any:
        """Create and start a container (blocking; runs in a worker thread)."""
        assert self._client is not None and self.work_dir is not None
        opts = self.options
        labels = labels_for(self.kind, self.session, opts, **spec.labels)
        kwargs = container_kwargs(opts, labels=labels)
        kwargs.pop("detach", None)
        # Mounts, not volumes: a bind source the engine's host lacks is an error, not a folder
        # the engine quietly creates (and an empty work dir in the container).
        mounts = list(kwargs.pop("mounts", None) or [])
        for host, inside in {self.work_dir: WORKSPACE, **spec.mounts}.items():
            mounts.append(docker.types.Mount(inside, self.host_path(host), type="bind"))
        if self.egress is not None and self.egress.wheels.is_dir():
            # The session's wheelhouse: read-only, the code cannot change what pip installs
            wheels = str(self.egress.wheels)
            mounts.append(docker.types.Mount(CONTAINER_WHEELS, wheels, type="bind", read_only=True))
        if opts.container_name is not None:
            kwargs["name"] = opts.container_name
        kwargs.update(spec.run_kwargs)
        marker = self._write_marker()
        try:
            with translate_errors(spec.what, image=opts.image):
                try:
                    container = self._client.containers.create(
                        opts.image,
                        command=list(spec.command),
                        mounts=mounts,
                        environment=container_env(opts, spec.environment, self.egress),
                        init=spec.init,
                        **kwargs,
                    )
                except docker.errors.APIError as exc:
                    raise self._config_error(exc) or exc from exc
                try:
                    container.start()
                    self._check_mount(container, marker)
                    self._attach_egress(container)
                except BaseException:
                    force_remove(container)
                    if self.egress is not None:
                        self.egress.drop_relay(str(container.id))
                    raise
        finally:
            assert self.door is not None
            self.door.unlink(marker)
        return container

    def _attach_egress(self, container: Any) -> None:
        """Start the container's egress relay (see ``_egress``) and wait until it listens on
        the container's loopback: the first block may use the proxy at once."""
        if self.egress is None:
            return
        from docker.utils.socket import frames_iter

        limit = str(self.egress.policy.max_connections * 2)
        argv = ["python3", "-I", "-S", "-c", RELAY_SCRIPT, str(PROXY_PORT), limit]
        # Never the code's own uid: the code must not be able to signal or trace the relay.
        code_uid = self.options.resolved_user().partition(":")[0]
        user = RELAY_USER if code_uid != RELAY_USER.partition(":")[0] else "65532:65532"
        _, stream = _exec_start(self._api(), container.id, argv, {}, True, user=user)
        relay = Relay(
            {},
            stream,
            frames_iter,
            connect=self.egress.connect,
            on_dns=self.egress.dns_refused,
            refusal=relay_refusal(),
        )
        self.egress.add_relay(container.id, relay)
        if not relay.wait_listening(30):
            raise DockerUnavailable("the container's egress relay did not start listening")
        if self.egress.secrets is not None:
            self._write_bundle(container, self.egress.secrets, user)
        if self.egress.policy.packages:
            self._install_packages(container, self.egress)

    def _write_bundle(self, container: Any, secrets: SessionSecrets, user: str) -> None:
        """The session CA (and the image's trust store) at ``CONTAINER_BUNDLE``, owned by the
        relay's uid, read-only: the code, another uid, can neither change nor replace it."""
        argv = ["python3", "-I", "-S", "-c", CONTAINER_BUNDLE_SCRIPT]
        argv += [secrets.ca_pem.decode(), CONTAINER_BUNDLE]
        api = self._api()
        with translate_errors("writing the secrets' CA bundle"):
            exec_id = api.exec_create(container.id, argv, user=user)["Id"]
            output = api.exec_start(exec_id)
            code = api.exec_inspect(exec_id).get("ExitCode")
        if code != 0:
            raise DockerUnavailable(
                f"the container could not write the secrets' CA bundle (exit status {code}): "
                f"{output!r:.500}"
            )

    def _install_packages(self, container: Any, egress: Egress) -> None:
        """pip installs the policy's packages into the container user's site: from the host's
        wheel cache (mounted read-only) when it has them, else through the proxy (see
        ``install_packages``). Its connections are in the next block's ``network_log``."""
        env = container_env(self.options)

        def run(args: list[str]) -> tuple[int, str]:
            argv = ["python3", "-m", "pip", "install", "-q", *args]
            created = self._api().exec_create(
                container.id, argv, environment=env, workdir=WORKSPACE
            )
            output = self._api().exec_start(created["Id"])
            code = self._api().exec_inspect(created["Id"]).get("ExitCode")
            text = output.decode("utf-8", "replace") if isinstance(output, bytes) else str(output)
            return (code if isinstance(code, int) else -1), text

        install_packages(egress, run, CONTAINER_WHEELS)

    def _write_marker(self) -> Path:
        """A file in the work dir the new container must see (else its mount is the wrong one)."""
        assert self.work_dir is not None and self.door is not None
        marker = self.work_dir / INTERNAL_DIR / f"mount-check-{self.session}-{uuid.uuid4().hex[:8]}"
        self.door.write_bytes(marker, b"kernelexec\n")
        return marker

    def _check_mount(self, container: Any, marker: Path) -> None:
        """``DockerConfigError`` unless the container sees ``marker`` in its ``WORKSPACE``."""
        assert self.work_dir is not None
        try:
            chunks, _ = container.get_archive(f"{WORKSPACE}/{INTERNAL_DIR}/{marker.name}")
            for _ in chunks:  # drain the stream (it holds a connection)
                pass
            return
        except docker.errors.NotFound:
            pass
        source = self.host_path(self.work_dir)
        if self.options.bind_dir is None:
            raise DockerConfigError(
                f"The container does not see the work dir {self.work_dir}: the engine mounted "
                f"{source} of its own host, which is another folder. {_BIND_DIR_HINT}"
            )
        raise DockerConfigError(
            f"bind_dir {source} on the Docker host is not the work dir {self.work_dir} this "
            "process sees (the container does not find kernelexec's files there): set bind_dir= "
            f"to the host path that is mounted at {self.work_dir}."
        )

    def _config_error(self, exc: docker.errors.APIError) -> DockerConfigError | None:
        """The engine's refusals that are option mistakes, in the options' words."""
        text = str(exc.explanation or exc)
        name = self.options.container_name
        runtime = self.options.runtime
        if runtime is not None and "unknown runtime" in text.lower():
            return DockerConfigError(
                f"runtime {runtime!r} is not registered with the Docker engine ({text}). "
                f"Register it in /etc/docker/daemon.json, e.g. for gVisor "
                '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": '
                '["--platform=ptrace", "--network=none"]}}}, then reload the engine '
                "(`kill -HUP $(pidof dockerd)` or `systemctl reload docker`); `docker info` "
                "lists the runtimes it knows."
            )
        if exc.status_code == 409 and name is not None:
            return DockerConfigError(
                f"container_name {name!r} is already in use by another container: remove it "
                f"(`docker rm -f {name}`) or choose another container_name ({text})"
            )
        if "bind source path does not exist" in text:
            missing = text.rsplit(":", 1)[-1].strip()
            bind = self.options.bind_dir
            if bind is not None and missing == os.fspath(bind):
                return DockerConfigError(
                    f"bind_dir {missing!r} does not exist on the Docker host: give the work "
                    f"dir's path on the host ({text})"
                )
            if bind is not None:
                return DockerConfigError(
                    f"bind_dir {os.fspath(bind)!r} on the Docker host is not the work dir "
                    f"{self.work_dir} this process sees (the host has no {missing}): set "
                    f"bind_dir= to the host path that is mounted at {self.work_dir} ({text})"
                )
            return DockerConfigError(
                f"The Docker host has no {missing} to mount (this process sees it, the engine "
                f"does not). {_BIND_DIR_HINT} ({text})"
            )
        return None


def _reload(container: Any) -> bool:
    try:
        container.reload()
    except docker.errors.NotFound:
        return False
    return True


def _exec_start(
    api: docker.APIClient,
    container_id: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: bool = False,
    user: str = "",
    workdir: str = WORKSPACE,
) -> tuple[str, Any]:
    created = api.exec_create(
        container_id,
        list(argv),
        stdout=True,
        stderr=True,
        stdin=stdin,
        environment=dict(env),
        workdir=workdir,
        user=user,
    )
    exec_id = created["Id"]
    return exec_id, api.exec_start(exec_id, socket=True)


def _exit_code(api: docker.APIClient, exec_id: str) -> int:
    for _ in range(20):
        info = call("docker exec", api.exec_inspect, exec_id)
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        time.sleep(0.05)
    raise DockerUnavailable(
        "the Docker engine ended the exec's output stream but says the block is still running"
    )


def _run_quiet(api: docker.APIClient, container_id: str, script: str) -> int:
    with translate_errors("docker exec"):
        exec_id = api.exec_create(container_id, ["sh", "-c", script], stdout=True, stderr=True)[
            "Id"
        ]
        api.exec_start(exec_id)
        code = api.exec_inspect(exec_id).get("ExitCode")
    return -1 if code is None else int(code)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def container_owner_state(labels: Mapping[str, str]) -> State:
    """Whether the process that made a container (its labels say which) is gone."""
    owner = Owner.from_text(labels.get(OWNER_LABEL, ""))
    if owner is not None:
        return owner_state(owner)
    # An older kernelexec's container: its owner's pid, on its host, is all there is.
    pid = labels.get(LABEL_OWNER_PID, "")
    if labels.get(LABEL_HOST) != socket.gethostname() or not pid.isdigit():
        return "unknown"
    return "alive" if _pid_alive(int(pid)) else "gone"


def env_owner(env: Sequence[str] | None) -> Owner | None:
    """The owner record in a container's or service's environment (``KEY=VALUE`` strings)."""
    for item in env or ():
        key, _, value = item.partition("=")
        if key == OWNER_ENV:
            return Owner.from_text(value)
    return None


def gc(options: DockerOptions | None = None, *, dry_run: bool = False) -> list[str]:
    """Remove kernelexec containers whose owner process is gone.

    Those the Docker back ends made (their labels name the owner) and those a provisioner's
    launcher made for a provisioned kernel outside Swarm (their environment does). Returns the
    short ids of the containers removed (or that would be, with ``dry_run``).
    """
    options = options or DockerOptions()
    client = make_client(options)
    try:
        removed: list[str] = []
        for container, state in _our_containers(client):
            if state != "gone":
                continue
            removed.append(container.short_id)
            if not dry_run:
                with translate_errors("removing a container"):
                    force_remove(container)
                _remove_runtime_dir(container.labels.get(LABEL_RUNTIME_DIR))
                _remove_runtime_dir(container.labels.get(LABEL_BRANCHES_DIR), BRANCHES_DIR_PREFIX)
        return removed
    finally:
        client.close()


def _our_containers(client: docker.DockerClient) -> list[tuple[Any, State]]:
    with translate_errors("listing containers"):
        # A container removed between the engine's list and its inspect (another session
        # ending, another sweep) is skipped, not a failure of the whole sweep.
        found = client.containers.list(
            all=True, filters={"label": LABEL_SESSION}, ignore_removed=True
        )
        launched = client.containers.list(
            all=True, filters={"label": "kernel_id"}, ignore_removed=True
        )
    pairs = [(c, container_owner_state(c.labels)) for c in found]
    for container in launched:
        if _SWARM_SERVICE_LABEL in container.labels or LABEL_SESSION in container.labels:
            continue  # a service's task (its service is removed instead), or listed above
        owner = env_owner((container.attrs.get("Config") or {}).get("Env"))
        if owner is not None:
            pairs.append((container, owner_state(owner)))
    return pairs


def gc_services(options: DockerOptions | None = None, *, dry_run: bool = False) -> list[str]:
    """Remove the Swarm services of provisioned kernels whose owner process is gone.

    A service is ours when its environment holds kernelexec's owner record (the provisioner's
    launcher copied it there); any other service is left alone. Returns the names of the
    services removed (or that would be, with ``dry_run``); none when the engine is no Swarm
    manager.
    """
    options = options or DockerOptions()
    client = make_client(options)
    try:
        with translate_errors("docker info"):
            swarm = (client.info() or {}).get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
            return []
        with translate_errors("listing services"):
            found = client.services.list(filters={"label": "kernel_id"})
        removed: list[str] = []
        for service in found:
            spec = (service.attrs.get("Spec") or {}).get("TaskTemplate") or {}
            owner = env_owner((spec.get("ContainerSpec") or {}).get("Env"))
            if owner is None or owner_state(owner) != "gone":
                continue
            removed.append(service.name)
            if not dry_run:
                call("removing a service", _remove_service, service)
        return removed
    finally:
        client.close()


def _remove_service(service: Any) -> None:
    with contextlib.suppress(docker.errors.NotFound):  # gone already is fine
        service.remove()


def _remove_runtime_dir(label: str | None, prefix: str = RUNTIME_DIR_PREFIX) -> None:
    """Remove a runtime dir (or a live forks' folder, ``prefix``) named by a label, but only
    one kernelexec could have made.

    Anyone who can create containers can write labels: never delete an arbitrary path for them.
    """
    if not label:
        return
    path = Path(label)
    if path.name.startswith(prefix) and path.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(path, ignore_errors=True)
