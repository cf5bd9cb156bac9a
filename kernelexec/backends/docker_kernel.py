"""Stateful back end in Docker: a container runs ipykernel; the host talks to it over ZMQ.

With the default ``network=False`` the container has no network at all: the kernel's sockets are
ZMQ ``ipc`` sockets in a runtime folder bind-mounted into the container. Two connection files
describe the one kernel: the container's (``ip`` = the path inside the container) and the host's
(``ip`` = the same folder's host path). ``network=True`` puts the container on the bridge and
uses TCP instead, with the kernel's ports published on 127.0.0.1 only.

Docker's init (tini) is PID 1, so the kernel gets SIGINT for an interrupt (tini forwards it),
orphans are reaped, and removal with ``force`` is immediate. A fresh container per restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient

from .._errors import DockerUnavailable, KernelStartFailed
from ._docker import (
    LABEL_RUNTIME_DIR,
    RUNTIME_DIR_PREFIX,
    WORKSPACE,
    ContainerHandle,
    ContainerSpec,
    DockerOptions,
    merge_options,
    prepare_host_dir,
)
from .base import KernelBackend, KernelClientLike

RUNTIME = "/run/kernelexec"
_CHANNELS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
# Fixed ports inside the container (network mode only); the host side gets random ones.
_CONTAINER_PORTS = dict(zip(_CHANNELS, range(50001, 50006), strict=True))


class DockerKernel(KernelBackend):
    """An IPython kernel in a container (``kernelexec/python`` by default).

    >>> backend = DockerKernel(image="kernelexec/python:latest", memory="1g")

    Keyword overrides are ``DockerOptions`` fields.
    """

    kind = "docker-kernel"
    inherits_host_env = False

    def __init__(
        self, *, image: str | None = None, options: DockerOptions | None = None, **overrides: Any
    ) -> None:
        self._docker = ContainerHandle(merge_options(options, image, overrides), kind=self.kind)
        self.session = self._docker.session
        self._client: AsyncKernelClient | None = None
        self._runtime: Path | None = None
        self._env: dict[str, str] = {}
        self._death: str | None = None

    @property
    def options(self) -> DockerOptions:
        return self._docker.options

    @options.setter
    def options(self, value: DockerOptions) -> None:
        self._docker.options = value

    @property
    def workspace(self) -> str:
        return WORKSPACE

    @property
    def container(self) -> Any:
        """The current container (a docker SDK ``Container``), or None."""
        return self._docker.container

    @property
    def runtime_dir(self) -> Path | None:
        """The host folder holding the connection file (and the ipc sockets)."""
        return self._runtime

    @property
    def client(self) -> KernelClientLike:
        if self._client is None:
            raise KernelStartFailed("the Docker kernel is not running")
        return self._client

    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        self._env = dict(env)  # only the executor's own variables (inherits_host_env is False)
        await self._docker.prepare(work_dir)
        await self._launch(timeout)

    async def interrupt(self) -> None:
        container = self._docker.container
        if container is not None:
            await self._docker.call("interrupting", container.kill, signal="SIGINT")
            # As a local kernel's interrupt reaches its whole process group, the block's child
            # processes (a %%bash script and its commands) get SIGINT too: kill -1 reaches
            # every process of the container's user but the kernel (PID 1) and itself.
            with contextlib.suppress(DockerUnavailable):
                await self._docker.exec_quiet(container, "kill -INT -1 2>/dev/null; true")

    async def restart(self, *, timeout: float) -> None:
        await self._stop_kernel()
        await self._launch(timeout)

    async def is_alive(self) -> bool:
        container = self._docker.container
        if container is None:
            return False
        await self._docker.call("inspecting the kernel container", container.reload)
        if container.status == "running":
            return True
        state = container.attrs.get("State", {})
        if state.get("OOMKilled"):
            self._death = "out of memory"
        else:
            self._death = f"the kernel's container exited (status {state.get('ExitCode')})"
        return False

    def death_reason(self) -> str | None:
        return self._death

    async def shutdown(self) -> None:
        try:
            await self._stop_kernel()
        finally:
            self._docker.close()

    # -- internals ----------------------------------------------------------------------------
    async def _launch(self, timeout: float) -> None:
        self._death = None
        deadline = asyncio.get_running_loop().time() + timeout
        self._runtime = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX))
        await asyncio.to_thread(prepare_host_dir, self._runtime, self.options)
        info = _connection_info(network=self.options.network)
        _write_private(self._runtime / "kernel.json", self._container_view(info), self.options)
        try:
            await self._docker.start(self._spec())
            host_info = await self._host_view(info)
            self._client = AsyncKernelClient()
            self._client.load_connection_info(host_info)  # type: ignore[arg-type]
            self._client.start_channels(hb=False)
            await self._wait_ready(deadline)
        except BaseException:
            await self._stop_kernel()
            raise

    def _container_view(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.options.network:
            return {**info, "ip": "0.0.0.0", **_CONTAINER_PORTS}
        return {**info, "ip": f"{RUNTIME}/kernel"}

    async def _host_view(self, info: dict[str, Any]) -> dict[str, Any]:
        """The host's connection info: the mount's host path, or the published ports."""
        assert self._runtime is not None
        if not self.options.network:
            return {**info, "ip": str(self._runtime / "kernel")}
        container = self._docker.container
        await self._docker.call("inspecting the kernel container", container.reload)
        ports = {}
        for name, port in _CONTAINER_PORTS.items():
            bound = (container.ports.get(f"{port}/tcp") or [{}])[0].get("HostPort")
            if not bound:
                raise KernelStartFailed(f"Docker did not publish the kernel's {name}")
            ports[name] = int(bound)
        return {**info, "ip": "127.0.0.1", **ports}

    def _spec(self) -> ContainerSpec:
        """The kernel's container: ipykernel on the connection file in the runtime folder."""
        assert self._runtime is not None
        run_kwargs: dict[str, Any] = {}
        if self.options.network:
            ports = {f"{p}/tcp": ("127.0.0.1", None) for p in _CONTAINER_PORTS.values()}
            run_kwargs["ports"] = ports
        return ContainerSpec(
            command=["python3", "-m", "ipykernel_launcher", "-f", f"{RUNTIME}/kernel.json"],
            init=True,
            mounts={self._runtime: RUNTIME},
            environment=self._env,
            labels={LABEL_RUNTIME_DIR: str(self._runtime)},
            run_kwargs=run_kwargs,
            what="creating the kernel container",
        )

    async def _wait_ready(self, deadline: float) -> None:
        """Until the kernel answers kernel_info on shell and we hear it on iopub."""
        loop = asyncio.get_running_loop()
        client = self._client
        assert client is not None
        while (remaining := deadline - loop.time()) > 0:
            if not await self.is_alive():
                logs = await asyncio.to_thread(self._logs)
                raise KernelStartFailed(f"the kernel's container stopped while starting:\n{logs}")
            client.kernel_info()
            try:
                await client.get_shell_msg(timeout=min(1.0, remaining))
                # A reply on shell is not enough: iopub must be subscribed too, or the first
                # block's output could be lost. kernel_info makes the kernel publish a status.
                await client.get_iopub_msg(timeout=min(1.0, max(remaining, 0.1)))
            except queue.Empty:
                continue
            with contextlib.suppress(queue.Empty):
                while True:
                    await client.get_iopub_msg(timeout=0.05)
            return
        raise KernelStartFailed("the kernel in the container did not answer in time")

    def _logs(self) -> str:
        with contextlib.suppress(Exception):
            raw = self._docker.container.logs(tail=20)
            return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        return "(no logs)"

    async def _stop_kernel(self) -> None:
        client, self._client = self._client, None
        container, self._docker.container = self._docker.container, None
        runtime, self._runtime = self._runtime, None
        try:
            if client is not None:
                client.stop_channels()
            if container is not None:
                # Best effort: with the engine gone this fails fast (`kernelexec gc` removes it).
                await self._docker.remove(container, best_effort=True)
        finally:
            if runtime is not None:
                shutil.rmtree(runtime, ignore_errors=True)


def _connection_info(*, network: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "transport": "tcp" if network else "ipc",
        "key": uuid.uuid4().hex,
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }
    # With ipc the "ports" are only suffixes of the socket paths.
    info.update({name: i for i, name in enumerate(_CHANNELS, start=1)})
    return info


def _write_private(path: Path, info: dict[str, Any], options: DockerOptions) -> None:
    """Write the connection file readable only by its owner (the container user)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(info, f)
    prepare_host_dir(path, options)
