"""A kernel forked inside a Docker kernel's container: live snapshots, restores, checkpoints.

The container's kernel forks itself as any kernel does (``_fork_child``, asked by the executor):
the fork is a process of the same container (its limits, user, no network; runc or gVisor),
with its own session and process group, ``oom_score_adj`` 1000 (the OOM killer takes it before
the session's kernel) and fresh sockets on the container's loopback, reached from the host
through a relay as the other languages' kernels are (``DockerLanguageKernel``). The container
has no cgroups of its own to make, so the host signals a fork by its process group, through the
container's reaper (``_LAUNCHER``): ``stop``/``cont`` pause a snapshot, ``kill`` ends a fork,
``alive`` tells whether it still runs (its pid and start time, so a reused pid is not taken for
it). Its pages count toward the container's memory limit as the session's own do when written.

Once a restore (or the first ``checkpoint="block"``) makes a fork the session's kernel, the
container's first kernel retires (``DockerKernel.retire``): the container stays up for its
forks, and a block that kills the session's kernel costs only that process.

A live fork (``fork()``) works in a folder of its own, ``/kx-branches/<random>``: the container
gets that host folder as a mount when it is made (a running container's mounts cannot change),
and each fork's work dir is a new folder in it (``DockerKernel.branch_home``). The container
lives as long as the session or any live kernel forked in it (``DockerKernel.attach``).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

from .._errors import ForkUnsupported, KernelStartFailed
from ._docker import WORKSPACE
from .docker_kernel import (
    _CHANNELS,
    DockerKernel,
    DockerLanguageKernel,
    _connection_info,
    container_owner,
)

#: the least ``pids_limit`` a fork or snapshot under gVisor (``runsc``) is made with
GVISOR_PIDS = 1024
#: in the fork: the OOM killer takes it (or a snapshot) before the session's kernel
_FIRST_TO_GO = (
    "\ntry:\n    open('/proc/self/oom_score_adj', 'w').write('1000')\nexcept OSError:\n    pass\n"
)


def _prelude(path: str, info: dict[str, Any]) -> str:
    """Run in the kernel just before it forks: the fork's connection file, written new (never
    through a link planted at its name), 0600, in the container's private /tmp. Run in a
    namespace of its own: no name is left in the session's."""
    source = (
        "import os\n"
        f"fd = os.open({path!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)\n"
        f"os.write(fd, {json.dumps(info).encode()!r})\n"
        "os.close(fd)\n"
    )
    return f"__import__('builtins').exec({source!r}, {{}})\n"


class DockerForkedKernel(DockerLanguageKernel):
    """A fork of a Docker kernel, in its container (see the module's text). The container
    stays up while it runs, even once the session that made it is closed; a restart of that
    session (a new container) ends it. It cannot restart on its own (its state is gone)."""

    kind = "docker-forked-kernel"
    # Not /workspace: once the session is closed its host folder is gone, and the engine
    # refuses an exec whose working folder is a removed mount ("outside of the container").
    _exec_dir = "/"
    #: where the fork's executor works (None: a fresh host folder of its own)
    work_home: Path | None = None

    def __init__(self, parent: DockerKernel) -> None:
        options = parent.options
        if not options.shares_host_kernel and (options.pids_limit or GVISOR_PIDS) < GVISOR_PIDS:
            # Seen: a fork and a snapshot under pids_limit=256 ended the whole sandbox (exit
            # status 2, "fork rejected by pids controller"): gVisor's threads count too.
            raise ForkUnsupported(
                f"a fork or live snapshot under gVisor needs pids_limit={GVISOR_PIDS} or more"
                f" (it is {options.pids_limit}): every thread of the sandbox counts against it;"
                " fork(via='snapshot') forks into a container of its own instead"
            )
        super().__init__(parent, "python3", slot=parent.next_slot())
        self.origin_kind = "docker-kernel"
        self._setup: str | None = None
        self._info: dict[str, Any] | None = None
        self._adopt: dict[str, Any] | None = None
        #: the fork's pid in the container and its start time (``/proc/<pid>/stat``)
        self.container_pid: int | None = None
        self._started_at: str | None = None
        self._gone: str | None = None
        self._workspace = WORKSPACE  # its working folder in the container (``prepare``)

    @property
    def workspace(self) -> str:
        return self._workspace

    @property
    def forks_live(self) -> bool:
        return self.parent.forks_live

    def branch(self) -> None:
        """Make it a live fork: its work dir a new folder under ``/kx-branches`` (a snapshot's
        copy stays in a host folder the container does not see)."""
        self.work_home = self.parent.branch_home()

    @property
    def owner(self) -> tuple[int, int] | None:
        return container_owner(self.parent.options)

    def run_at_start(self, code: str) -> bool:
        self._setup = code
        return True

    def fresh_copy(self) -> DockerKernel:
        """A ``fork(via="snapshot")``: a new container from the session's options."""
        return self.parent.fresh_copy()

    def fork_backend(self) -> DockerForkedKernel:
        """A fork of this fork lives in the same container."""
        return DockerForkedKernel(self.parent)

    def prepare(self, *, work_dir: Path, cwd: str | None = None) -> dict[str, Any]:
        """The request the kernel forks into: its connection file (written by the prelude, in
        the container), log, working folder (``work_dir`` as the container sees it: a live
        fork's ``/kx-branches/<name>``, else ``/workspace``: a snapshot's process never runs
        code, a restored one is its session's)."""
        name = uuid.uuid4().hex
        self._info = info = {**_connection_info(network=True), "kernel_name": "python3"}
        ports = dict(zip(_CHANNELS, self._ports, strict=True))
        inside = {**info, "ip": "127.0.0.1", **ports}
        path = f"/tmp/kx-fork-{name}.json"
        self._workspace = cwd or self.parent.container_path(work_dir)
        request = {
            "connection_file": path,
            "cwd": self._workspace,
            "log": f"/tmp/kx-fork-{name}.log",
            "ports": ports,
            "cgroup": None,  # no cgroups to make in a container: the process group holds it
            "setup": (self._setup or "") + _FIRST_TO_GO,
            "prelude": _prelude(path, inside),
        }
        self._adopt = request
        return request

    def adopted(self, pid: int) -> None:
        """``pid``: the fork's pid in the container, as the kernel answered (so checked at
        ``start``: only a process the container's reaper sees is ever signalled). The
        container now stays up until it ends."""
        self.container_pid = pid
        self.parent.attach(self)

    def release_request(self) -> None:
        self._adopt = None

    async def start(self, *, work_dir: Path, env: Any, timeout: float) -> None:
        self._env = dict(env)
        pid, info = self.container_pid, self._info
        if pid is None or info is None or self._adopt is None:
            raise KernelStartFailed(
                "a fork of a Docker kernel cannot restart: its state is gone; restart the"
                " session (a fresh container) or fork it again"
            )
        self._adopt = None
        started = await self.parent.ask(f"alive {pid}")
        if started is None or started in ("gone", "no") or started.startswith("error"):
            raise KernelStartFailed(f"the Docker kernel's fork (pid {pid}) is not running")
        self._started_at = started
        from docker.utils.socket import frames_iter

        loop_deadline = _deadline(timeout)
        container = self.parent.container
        try:
            await self._connect(info, self.parent._docker, container, frames_iter)
            await self._wait_ready(loop_deadline)
        except BaseException:
            await self.shutdown()
            raise

    async def restart(self, *, timeout: float) -> None:
        await self.shutdown()
        await self.start(work_dir=Path(WORKSPACE), env=self._env, timeout=timeout)

    async def pause(self, *, paused: bool) -> None:
        """Stop (or continue) the fork's process group: a live snapshot waits paused."""
        if self.container_pid is not None and self._started_at is not None:
            await self.parent.ask(f"{'stop' if paused else 'cont'} {self.container_pid}")

    async def interrupt(self) -> None:
        """An interrupt_request (ipykernel sends SIGINT to its own process group: the fork
        leads one), then the container's reaper kills what the running block started."""
        client = self._client
        if client is None:
            return
        client.control_channel.send(client.session.msg("interrupt_request", content={}))
        if client.reaper is not None and client.block_marked:
            with contextlib.suppress(KernelStartFailed):
                await self.parent.ask("reap")

    async def seems_gone(self) -> bool:
        relay = self._relay
        if relay is None or not relay.alive:
            return True
        return not await self._running()

    async def is_alive(self) -> bool:
        return not await self.seems_gone() and await self.parent.is_alive()

    async def _running(self) -> bool:
        pid = self.container_pid
        if pid is None or self._started_at is None:
            return False
        try:
            answer = await self.parent.ask(f"alive {pid}", 5.0)
        except KernelStartFailed:
            answer = None
        if answer is None:
            return True  # the reaper did not answer (the container's state tells, is_alive)
        if answer != self._started_at:
            self._gone = "its process ended (killed by a signal, os._exit, or the OOM killer)"
            return False
        return True

    def death_reason(self) -> str | None:
        return self.parent.death_reason() or self._gone

    def _start_failed(self) -> KernelStartFailed:
        why = self.parent.death_reason() or self._gone or "it ended"
        return KernelStartFailed(f"the Docker kernel's fork did not start: {why}")

    async def shutdown(self) -> None:
        pid, self.container_pid = self.container_pid, None
        try:
            if pid is not None:
                with contextlib.suppress(Exception):
                    await self.parent.ask(f"kill {pid}", 5.0)
        finally:
            self._started_at = None
            try:
                await self._stop()
            finally:
                await self.parent.detach(self)  # the last one out removes the container


def _deadline(timeout: float) -> float:
    import asyncio

    return asyncio.get_running_loop().time() + timeout
