"""Stateful back end in Docker: a container runs ipykernel; the host talks to it over ZMQ.

With the default ``network=False`` the container has no network at all: the kernel's sockets are
ZMQ ``ipc`` sockets in a runtime folder bind-mounted into the container. Two connection files
describe the one kernel: the container's (``ip`` = the path inside the container) and the host's
(``ip`` = the same folder's host path). ``network=True`` puts the container on the bridge and
uses TCP instead, with the kernel's ports published on 127.0.0.1 only.

Under a runtime with its own kernel (gVisor's ``runsc``: ``DockerOptions.runtime``) sockets made
in the container never appear on the host, so the kernel listens on the container's own loopback
and a relay over ``docker exec`` carries its channels (``_docker_relay``). The container still
has no network, and the host's connection file is the same ``ipc`` one.

Docker's init (tini) is PID 1, so the kernel gets SIGINT for an interrupt (tini forwards it),
orphans are reaped, and removal with ``force`` is immediate. A fresh container per restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import queue
import re
import shutil
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.asynchronous.client import AsyncKernelClient

from .._door import Door
from .._errors import DockerConfigError, ForkUnsupported, KernelStartFailed, UnsafePath
from .._types import NetworkEvent
from .._workdir import INTERNAL_DIR
from ._docker import (
    LABEL_RUNTIME_DIR,
    RUNTIME_DIR_PREFIX,
    WORKSPACE,
    ContainerHandle,
    ContainerSpec,
    DockerOptions,
    merge_options,
    prepare_host_dir,
    prepare_inside,
)
from ._docker_langs import LAUNCHER_SCRIPT, LauncherWatch
from ._docker_options import (
    BRANCHES,
    BRANCHES_DIR_PREFIX,
    LABEL_BRANCHES_DIR,
    LANGUAGES_IMAGE,
)
from ._docker_relay import RELAY_SCRIPT, Relay
from ._iopub import receive_batch, receive_one
from ._owner import ALIAS_PREFIX, OWNER_FILE, TEMP_PREFIXES, mark_folder
from ._ready import start_channels
from ._remote import refuse_shared_fork
from .base import KernelBackend, KernelClientLike

RUNTIME = "/run/kernelexec"
#: the unix socket (in the runtime folder) of the in-kernel reaper (see ``_LAUNCHER``)
REAPER_SOCKET = "reaper"
#: the launcher's exit status when the runtime folder's mount is empty (a wrong host path)
EXIT_MOUNT_EMPTY = 3
_CHANNELS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
# The kernel container's main command (under tini). Before handing over to ipykernel it
#  * checks that the runtime folder's mount holds the connection file: an empty mount means the
#    host path given to the engine is not the folder we wrote (Docker out of Docker without
#    ``bind_dir``), and a clear exit beats a kernel that never answers;
#  * replaces ipykernel's fd-capture thread with one that decodes incrementally with
#    ``errors="replace"``: ipykernel < 6.2x decodes each raw read strictly, so one non-UTF-8 byte
#    written to fd 1 killed the thread, the pipe filled up and every later write to fd 1 blocked.
#    The bytes are not echoed to the container's own stdout (the engine's log) either. Once
#    the executor's set-up has run, its own reader (own_reader in _kernel) takes the fds over
#    and echoes at most 1 MiB per stream to that log;
#  * starts the reaper, a thread listening on a unix socket in the runtime folder. ``mark`` (sent
#    just before each block) notes the processes alive then (pid and start time); ``reap`` kills
#    (SIGSTOP, then SIGKILL, until none is left) every process not marked, except PID 1 and the
#    kernel. It needs no new process, so it still works when a fork bomb has used up the pids
#    limit.
_LAUNCHER = r"""
import codecs, os, select, signal, socket, sys, threading, time
retired = sys.argv[-1] == "retired"
if retired:
    sys.argv.pop()
    # The kernel's output pipes were read by the kernel that was: a log of its own instead.
    _log = os.open("/tmp/kx-holder.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(_log, 1)
    os.dup2(_log, 2)
runtime = sys.argv[1]
if not os.path.isfile(os.path.join(runtime, "kernel.json")):
    sys.stderr.write("kernelexec: the runtime folder mounted at %s is empty\n" % runtime)
    sys.exit(@MOUNT_EMPTY@)

from ipykernel import iostream

def _watch_pipe_fd(self):
    if getattr(self, "_fid", None) is None:
        return
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        data = os.read(self._fid, 65536)
        while data and self._should_watch:
            text = decoder.decode(data)
            # An unfinished character waits only for bytes already in the pipe: bytes left over
            # from one block must not turn up at the start of the next one's output.
            if decoder.getstate()[0] and not select.select([self._fid], [], [], 0)[0]:
                text += decoder.decode(b"", True)
            if text:
                self.write(text)
            data = os.read(self._fid, 65536)
    except Exception:
        self._exc = sys.exc_info()

if hasattr(iostream.OutStream, "_watch_pipe_fd"):
    iostream.OutStream._watch_pipe_fd = _watch_pipe_fd

def _processes():
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] != b"Z":
            found.add((int(name), fields[19]))
    return found

marked = set()

def _reap():
    spare = {1, os.getpid()}
    killed = set()
    for _ in range(100):
        pids = [pid for pid, start in _processes() - marked if pid not in spare]
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        killed.update(pids)
        time.sleep(0.01)
    return len(killed)

def _started(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] in (b"Z", b"X") else fields[19]

_SIGNALS = {b"stop": signal.SIGSTOP, b"cont": signal.SIGCONT, b"kill": signal.SIGKILL}

def _signal(pid, sig):
    # A forked kernel is the leader of its own group: the group, else the one process.
    if pid in (1, os.getpid()) or pid <= 0:
        return b"no\n"
    for how in (os.killpg, os.kill):
        try:
            how(pid, sig)
            return b"ok\n"
        except OSError:
            pass
    return b"gone\n"

def _retire():
    # The kernel's image ends, its pid stays: tini's child, the container lives on for the
    # kernels forked in it, and this reaper is served again by the small holder it becomes.
    os.execv(sys.executable, [sys.executable, "-I"] + sys.orig_argv[1:] + ["retired"])

def _serve(listener):
    global marked
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                conn.settimeout(5)
                request = conn.recv(64).strip()
                words = request.split()
                if request == b"mark":
                    marked = _processes()
                    conn.sendall(b"ok\n")
                elif request == b"reap":
                    conn.sendall(b"%d\n" % _reap())
                elif request == b"ping":
                    conn.sendall(b"retired\n" if retired else b"kernel\n")
                elif len(words) == 2 and words[0] == b"alive":
                    conn.sendall((_started(int(words[1])) or b"gone") + b"\n")
                elif len(words) == 2 and words[0] in _SIGNALS:
                    conn.sendall(_signal(int(words[1]), _SIGNALS[words[0]]))
                elif request == b"retire" and not retired:
                    conn.sendall(b"ok\n")
                    conn.close()
                    listener.close()
                    _retire()
            except Exception as exc:
                try:
                    conn.sendall(("error %s\n" % exc).encode())
                except OSError:
                    pass

if len(sys.argv) > 2:
    # Relayed (gVisor): a unix socket here would exist only in the sandbox's kernel.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # bound again once retired
    listener.bind(("127.0.0.1", int(sys.argv[2])))
else:
    path = os.path.join(runtime, "@REAPER@")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    listener.bind(path)
listener.listen(4)
if retired:
    # Only the reaper is left: an interrupt (SIGINT from tini) is for the forked kernels.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(listener)
threading.Thread(target=_serve, args=(listener,), daemon=True, name="kernelexec-reaper").start()

if os.environ.get("PIP_USER"):
    # An egress policy lets pip install into the user site (HOME=/tmp): a folder missing when
    # the interpreter started is never looked at again, so make it and put it on the path now.
    import site
    os.makedirs(site.getusersitepackages(), exist_ok=True)
    site.addsitedir(site.getusersitepackages())

sys.argv = ["ipykernel_launcher", "-f", os.path.join(runtime, "kernel.json")]
from ipykernel import kernelapp
kernelapp.launch_new_instance()
""".replace("@MOUNT_EMPTY@", str(EXIT_MOUNT_EMPTY)).replace("@REAPER@", REAPER_SOCKET)

# Fixed ports inside the container (network mode and relayed); the host side gets random ones.
_CONTAINER_PORTS = dict(zip(_CHANNELS, range(50001, 50006), strict=True))
#: the reaper's port on the container's loopback when relayed
_REAPER_PORT = 50006


def _exit_reason(code: Any) -> str:
    """The container's exit status in words; 128+n is the kernel (PID 1) killed by signal n,
    named as a local kernel's death is."""
    if isinstance(code, int) and 128 < code < 128 + 65:
        with contextlib.suppress(ValueError):
            name = signal.Signals(code - 128).name
            return f"the kernel was killed by signal {name} (its container exited, status {code})"
    return f"the kernel's container exited (status {code})"


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
        self._client: _BlockClient | None = None
        self._runtime: Path | None = None
        #: a short symlink to a runtime folder whose socket paths would be too long
        self._alias: Path | None = None
        self._host_info: dict[str, Any] = {}
        self._env: dict[str, str] = {}
        self._death: str | None = None
        self._relay: Relay | None = None
        self._slots = 0  # language kernels made so far: each gets its own container ports
        #: the host folder mounted at ``BRANCHES`` (live forks' work dirs); None with bind_dir
        self._branches: Path | None = None
        self._reaper: Path | None = None  # the container's reaper, as long as the container
        # Live kernels forked in the container (``docker_fork``): it lives until the last of
        # them and the session are closed, whichever closes last (forks close on other loops).
        self._forks: set[object] = set()
        self._forks_lock = threading.Lock()
        self._closing = False

    @property
    def options(self) -> DockerOptions:
        return self._docker.options

    @options.setter
    def options(self, value: DockerOptions) -> None:
        self._docker.options = value

    @property
    def workspace(self) -> str:
        return WORKSPACE

    def fresh_copy(self) -> DockerKernel:
        """Another container from the same options (a fork made through a durable snapshot:
        a kernel in a container is not forked as a process); a fixed ``container_name`` is
        left to the engine (two containers cannot share one)."""
        refuse_shared_fork(self.kind, self.options.bind_dir, "bind_dir")
        return DockerKernel(options=replace(self.options, container_name=None))

    @property
    def container(self) -> Any:
        """The current container (a docker SDK ``Container``), or None."""
        return self._docker.container

    @property
    def relayed(self) -> bool:
        """Whether the kernel's channels go through a relay (a runtime with its own kernel)."""
        return not self.options.shares_host_kernel

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
        """SIGINT to the kernel, then kill every process the running block started.

        A ``%%bash`` block's background jobs, a fork bomb, a server a block started and never
        waited for: none of them stop for the kernel's ``KeyboardInterrupt``. What earlier
        blocks started is left alone (the reaper spares what was running when the block began).
        """
        container = self._docker.container
        if container is None:
            return
        await self._docker.call("interrupting", container.kill, signal="SIGINT")
        client = self._client
        if client is not None and client.reaper is not None and client.block_marked:
            await asyncio.to_thread(_ask_reaper, client.reaper, "reap", 10.0)

    async def restart(self, *, timeout: float) -> None:
        with self._forks_lock:
            self._forks.clear()  # they end with the container a restart replaces
        await self._stop_kernel()
        await self._launch(timeout)

    async def is_alive(self) -> bool:
        container = self._docker.container
        if container is None:
            return False
        if not await self._docker.reload(container):
            self._death = "its container was removed from outside (docker rm, or kernelexec gc)"
            return False
        if container.status == "running":
            if self._relay is not None and not self._relay.alive:
                self._death = "its relay (the docker exec carrying its sockets) ended"
                return False
            return True
        state = container.attrs.get("State", {})
        if state.get("OOMKilled"):
            self._death = "out of memory"
        elif state.get("ExitCode") == EXIT_MOUNT_EMPTY:
            self._death = "its runtime folder's mount is empty"
        else:
            self._death = _exit_reason(state.get("ExitCode"))
            if self.relayed and self._slots and state.get("ExitCode") == 2:
                # Seen with R and Deno kernels beside Python (the host's dmesg: "fork rejected
                # by pids controller"): gVisor's ptrace platform counts its own threads too.
                self._death += (
                    "; under gVisor every thread of the sandbox counts against pids_limit "
                    f"({self.options.pids_limit}): other languages' kernels, forks and live "
                    "snapshots need about 1024"
                )
        return False

    async def seems_gone(self) -> bool:
        # No engine round trip: a relayed kernel's relay ends with its container; otherwise the
        # reaper's unix socket, served by a thread of the kernel's own process, refuses a
        # connection once that process is gone (an image without the reaper: cannot tell).
        client = self._client
        if client is None:
            return True
        if self._relay is not None:
            return not self._relay.alive
        return client.reaper is not None and not _reaper_listening(client.reaper)

    def death_reason(self) -> str | None:
        return self._death

    @property
    def runs_other_kernels(self) -> bool:
        return True

    def other_kernel(self, kernel_name: str) -> KernelBackend | None:
        """An R, Deno or bash kernel in this kernel's container (``DockerLanguageKernel``)."""
        self._slots += 1
        return DockerLanguageKernel(self, kernel_name, slot=self._slots)

    def install_hint(self, kernel_name: str) -> str | None:
        flag = {"ir": "r", "deno": "js", "bash": "bash"}.get(kernel_name)
        if flag is None:
            return f"an image with the kernelspec {kernel_name!r} ({self.options.image} has none)"
        return (
            f"an image with it: `kernelexec image build --offline --languages {flag}`, then "
            f"image={LANGUAGES_IMAGE!r} ({self.options.image} has no {kernel_name!r} kernel)"
        )

    async def take_network_log(self) -> list[NetworkEvent]:
        return await self._docker.take_network_log()

    # -- kernels forked in the container (``docker_fork``) ------------------------------------
    #: a restore keeps it (``_kernel``): its container holds the kernels forked in it
    holds_forks = True
    retires = True

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who owns the files a restore copies into the work dir (the container user, when the
        host runs as root)."""
        return container_owner(self.options)

    def reaper(self) -> Path:
        """The host's path to the container's reaper (also the forked kernels' signaller)."""
        if self._reaper is None:
            raise KernelStartFailed("the Docker kernel is not running: nothing to fork")
        return self._reaper

    @property
    def forks_live(self) -> bool:
        """Whether ``fork()`` forks the kernel process in its container: not with ``bind_dir``
        (no ``BRANCHES`` folder to work in; such a fork goes through a durable snapshot)."""
        return self.options.bind_dir is None

    def branch_home(self) -> Path:
        """A new folder for a live fork's work dir, in the host folder mounted at ``BRANCHES``:
        a random name (0700, given to the container user) in a folder root owns and the
        container user can only traverse, so the code can neither list, guess, make nor
        replace one; it owns what is inside its own."""
        if self._branches is None:
            raise ForkUnsupported(
                f"a live fork needs the {BRANCHES} folder, which a Docker kernel with bind_dir"
                " (or not started) does not have"
            )
        home = Path(tempfile.mkdtemp(prefix="fork-", dir=self._branches))
        prepare_host_dir(home, self.options)
        return home

    def container_path(self, work_dir: Path) -> str:
        """Where the container sees ``work_dir``: a live fork's folder, else ``WORKSPACE``."""
        if self._branches is not None and work_dir.parent == self._branches:
            return f"{BRANCHES}/{work_dir.name}"
        return WORKSPACE

    def attach(self, fork: object) -> None:
        """A kernel forked in the container (its process running): the container stays up
        until it is detached, even once the session is closed."""
        with self._forks_lock:
            if self._docker.container is None:
                raise KernelStartFailed("the session's container was removed: nothing to fork")
            self._forks.add(fork)

    async def detach(self, fork: object) -> None:
        """A forked kernel ended; the last one to end after the session closed removes the
        container (and its folders). Twice is fine."""
        with self._forks_lock:
            self._forks.discard(fork)
            last = self._closing and not self._forks
            if last:
                self._closing = False
        if last:
            await self._remove()

    def next_slot(self) -> int:
        """A fresh range of container ports (another language's kernel, a forked kernel)."""
        self._slots += 1
        return self._slots

    async def ask(self, request: str, timeout: float = 10.0) -> str | None:
        """One request to the container's reaper (``_LAUNCHER``); None when unanswered."""
        return await asyncio.to_thread(_ask_reaper, self.reaper(), request, timeout)

    async def retire(self) -> None:
        """The container's first kernel is replaced (a restore): its process becomes a small
        holder (the reaper alone, its memory freed), so the container outlives it: the kernels
        forked in it run on, and a block that kills one of them costs only that one."""
        if await self.ask("ping") != "kernel":
            return  # retired already
        await self.ask("retire")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while loop.time() < deadline:
            if await self.ask("ping", 1.0) == "retired":
                return
            await asyncio.sleep(0.02)
        raise KernelStartFailed("the Docker kernel's first process did not retire in time")

    async def died_before(self, when: float) -> bool:
        # The engine's clock is this host's: its record of when the container ended is a fact
        # the relay may learn only later (under gVisor the exec stream ends after the engine
        # has seen the container exit).
        container = self._docker.container
        if container is None or not await self._docker.reload(container):
            return False
        finished = engine_time(container.attrs.get("State", {}).get("FinishedAt"))
        return finished is not None and finished < when

    async def shutdown(self) -> None:
        """Stop the kernel and remove its container, or keep it as ``auto_remove`` /
        ``stop_container`` say (then ``kept`` says where it is, and its runtime folder stays).
        With live forks still running in it, the kernel retires and the container stays up for
        them: the last fork to close removes it (``detach``)."""
        with self._forks_lock:
            self._closing = bool(self._forks) and self._docker.container is not None
            linger = self._closing
        if not linger:
            await self._remove()
            return
        with contextlib.suppress(Exception):  # dead already: the forks' blocks will say so
            await self.retire()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(zmq.ZMQError):
                client.stop_channels()

    async def _remove(self) -> None:
        try:
            await self._stop_kernel(final=True)
        finally:
            self._docker.close()

    @property
    def kept(self) -> str | None:
        """Where the container ``shutdown()`` kept is, in words (None: nothing was kept)."""
        return self._docker.kept

    # -- internals ----------------------------------------------------------------------------
    async def _launch(self, timeout: float) -> None:
        self._death = None
        deadline = asyncio.get_running_loop().time() + timeout
        self._runtime = self._make_runtime_dir()
        self._branches = self._make_branches_dir()
        info = _connection_info(network=self.options.full_network and not self.relayed)
        door, inside = self._runtime_door(self._runtime)
        if door is not None:
            # In the work dir: handed over and written through the door, never by a path
            # the code could have redirected since the folder was made.
            prepare_inside(door, inside, self.options)
            _write_private_inside(door, f"{inside}/kernel.json", self._container_view(info))
        else:
            await asyncio.to_thread(prepare_host_dir, self._runtime, self.options)
            _write_private(self._runtime / "kernel.json", self._container_view(info), self.options)
        try:
            if door is not None:
                _check_still_there(door, inside, self._runtime)  # just before the engine mounts it
            await self._docker.start(self._spec())
            if self.relayed:
                await self._start_relay()
            host_info = await self._host_view(info)
            self._host_info = host_info
            self._client = _BlockClient()
            self._client.reaper = self._reaper = self._sockets() / REAPER_SOCKET
            self._client.load_connection_info(host_info)  # type: ignore[arg-type]
            try:
                start_channels(self._client)  # bounded receive queue: see _ready
            except zmq.ZMQError as exc:
                # A socket that failed to connect stays open in the client's own context and
                # would hang interpreter exit (the context's term()): destroy it, lingering not.
                self._client.context.destroy(linger=0)
                self._client = None
                raise KernelStartFailed(
                    f"cannot connect to the kernel's sockets in {self._sockets()}: {exc}"
                ) from exc
            await self._wait_ready(deadline)
        except BaseException:
            await self._stop_kernel()
            raise

    def _make_runtime_dir(self) -> Path:
        """A private folder for the connection file and the ipc sockets.

        With ``bind_dir`` it goes under the work dir's ``.kernelexec/`` (so the engine finds it
        under ``bind_dir`` as it finds the work dir); else in the temp folder.
        """
        door = self._docker.door
        if self.options.bind_dir is not None and self._docker.work_dir is not None and door:
            # made through the door: the code may have planted a link at .kernelexec
            return self._docker.work_dir / door.mkdtemp(INTERNAL_DIR, RUNTIME_DIR_PREFIX)
        return Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX))

    def _make_branches_dir(self) -> Path | None:
        """The folder mounted at ``BRANCHES`` (see ``branch_home``); None with ``bind_dir``: the
        engine would not find a folder of this host's temp folder."""
        if not self.forks_live:
            return None
        path = Path(tempfile.mkdtemp(prefix=BRANCHES_DIR_PREFIX))
        os.chmod(path, 0o711)  # the container user traverses it, lists and writes nothing
        return path

    def _runtime_door(self, runtime: Path) -> tuple[Door | None, str]:
        """The work dir's door and ``runtime``'s path in it, when it lies there (bind_dir)."""
        door, work = self._docker.door, self._docker.work_dir
        if door is None or work is None:
            return None, ""
        try:
            inside = runtime.relative_to(work).as_posix()
        except ValueError:
            return None, ""
        return door, inside

    def _sockets(self) -> Path:
        """The runtime folder as this process names its sockets: a unix socket's path holds at
        most 107 bytes, so a long one (a deep work dir with ``bind_dir``) goes through a short
        symlink in the temp folder."""
        assert self._runtime is not None
        if len(str(self._runtime / "kernel-5")) <= 100:
            return self._runtime
        if self._alias is None:
            self._alias = short_alias(self._runtime)
        return self._alias

    async def _start_relay(self) -> None:
        """One exec in the kernel's container carrying every channel (see ``_docker_relay``).

        It starts while the kernel is still importing: a connection made before the kernel
        listens waits in the relay (what it sends held back) until the kernel does.
        """
        from docker.utils.socket import frames_iter

        container = self._docker.container
        argv = ["python3", "-I", "-S", "-c", RELAY_SCRIPT]
        _, stream = await self._docker.exec_stream(container, argv, {}, stdin=True)
        sockets = self._sockets()
        endpoints = {sockets / f"kernel-{i}": port for i, port in _relayed_ports()}
        endpoints[sockets / REAPER_SOCKET] = _REAPER_PORT
        try:
            self._relay = Relay(endpoints, stream, frames_iter)
        except BaseException:
            with contextlib.suppress(OSError):
                stream.close()
            raise

    def _container_view(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.relayed:
            return {**info, "transport": "tcp", "ip": "127.0.0.1", **_CONTAINER_PORTS}
        if self.options.full_network:
            return {**info, "ip": "0.0.0.0", **_CONTAINER_PORTS}
        return {**info, "ip": f"{RUNTIME}/kernel"}

    async def _host_view(self, info: dict[str, Any]) -> dict[str, Any]:
        """The host's connection info: the mount's host path, or the published ports."""
        assert self._runtime is not None
        if not self.options.full_network or self.relayed:
            return {**info, "ip": str(self._sockets() / "kernel")}
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
        command = ["python3", "-c", _LAUNCHER, RUNTIME]
        if self.relayed:
            command.append(str(_REAPER_PORT))
        elif self.options.full_network:
            ports = {f"{p}/tcp": ("127.0.0.1", None) for p in _CONTAINER_PORTS.values()}
            run_kwargs["ports"] = ports
        mounts, labels = {self._runtime: RUNTIME}, {LABEL_RUNTIME_DIR: str(self._runtime)}
        if self._branches is not None:
            mounts[self._branches] = BRANCHES
            labels[LABEL_BRANCHES_DIR] = str(self._branches)
        return ContainerSpec(
            command=command,
            init=True,
            mounts=mounts,
            environment=self._env,
            labels=labels,
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
                if self._death == "its runtime folder's mount is empty":
                    raise DockerConfigError(
                        f"The kernel's container does not see its runtime folder {self._runtime} "
                        f"(mounted from {self._docker.host_path(self._runtime or Path())} of the "
                        "Docker host). Running kernelexec inside a container? Set bind_dir= to "
                        "the work dir's path on the Docker host."
                    )
                raise KernelStartFailed(f"the kernel's container stopped while starting:\n{logs}")
            if await _answers(client, remaining):
                return
        raise KernelStartFailed("the kernel in the container did not answer in time")

    def _logs(self) -> str:
        with contextlib.suppress(Exception):
            raw = self._docker.container.logs(tail=20)
            return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        return "(no logs)"

    async def _stop_kernel(self, *, final: bool = False) -> None:
        """Drop the kernel: its container goes (a restart always replaces it; at ``shutdown``,
        ``final``, the options may keep it) and so does its runtime folder, unless kept."""
        client, self._client = self._client, None
        runtime, self._runtime = self._runtime, None
        branches, self._branches = self._branches, None
        self._reaper = None
        alias, self._alias = self._alias, None
        relay, self._relay = self._relay, None
        kept = False
        try:
            if client is not None:
                with contextlib.suppress(zmq.ZMQError):
                    client.stop_channels()
            if relay is not None:
                # Its threads block in socket calls: closing them must not hold up the loop.
                await asyncio.to_thread(relay.close)
            if final and self.options.keeps_container:
                kept = await self._docker.release() is not None
                where = self._docker.kept
                # A relayed kernel's sockets ended with this process: nothing to attach to.
                running = where is not None and ", running)" in where
                if running and runtime is not None and relay is None:
                    # Still running: leave a connection file this host can attach with.
                    attach = runtime / "kernel-host.json"
                    door, inside = self._runtime_door(runtime)
                    if door is not None:  # in the work dir: through its door
                        data = json.dumps(self._host_info).encode()
                        door.write_bytes(f"{inside}/kernel-host.json", data, mode=0o600)
                    else:
                        fd = os.open(attach, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                        with os.fdopen(fd, "w", encoding="utf-8") as f:
                            json.dump(self._host_info, f)
                    self._docker.kept = (
                        f"{where}; attach with `jupyter console --existing {attach}`"
                    )
            else:
                container, self._docker.container = self._docker.container, None
                if container is not None:
                    # Best effort: with the engine gone this fails fast (`kernelexec gc`).
                    await self._docker.remove(container, best_effort=True)
        finally:
            if runtime is not None and not kept:
                shutil.rmtree(runtime, ignore_errors=True)
            if branches is not None and not kept:
                shutil.rmtree(branches, ignore_errors=True)
            if alias is not None:
                drop_alias(alias, kept=kept)


class _BlockClient(AsyncKernelClient):
    """A kernel client that has the reaper mark the container's processes before each block.

    ``block_marked`` is true from a block's execute request until its ``idle``: only then does
    an interrupt reap.
    """

    reaper: Path | None = None
    block_marked = False
    _block_msg_id: str | None = None

    def execute(self, *args: Any, **kwargs: Any) -> str:
        silent = kwargs.get("silent", args[1] if len(args) > 1 else False)
        marked = False
        if not silent and self.reaper is not None:
            # A unix-socket round trip to an idle kernel's thread: well under a millisecond.
            marked = _ask_reaper(self.reaper, "mark", 1.0) == "ok"
        msg_id: str = super().execute(*args, **kwargs)
        if not silent:
            self.block_marked, self._block_msg_id = marked, msg_id
        return msg_id

    async def get_iopub_msg(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        msg: dict[str, Any] = await super().get_iopub_msg(*args, **kwargs)
        self._note(msg)
        return msg

    async def get_iopub_batch(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """What IOPub holds after one wait (see ``_iopub``); ``Empty`` when nothing came."""
        msgs = await receive_batch(self, timeout)
        for msg in msgs:
            self._note(msg)
        return msgs

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next shell reply, decoded as IOPub is: a huge error reply (its traceback and
        value) is held once, as received, not copied and decoded whole (jupyter_client's)."""
        return await receive_one(self.session, self.shell_channel.socket, timeout)

    def _note(self, msg: dict[str, Any]) -> None:
        if (
            msg["msg_type"] == "status"
            and msg["content"].get("execution_state") == "idle"
            and msg["parent_header"].get("msg_id") == self._block_msg_id
        ):
            self.block_marked, self._block_msg_id = False, None


def short_alias(target: Path) -> Path:
    """A short path to ``target``: a link ``k`` in a private temp folder of its own, which
    carries this process's owner record (``kernelexec gc`` removes it once the process is
    gone; a bare link could carry none)."""
    folder = Path(tempfile.mkdtemp(prefix=ALIAS_PREFIX))
    mark_folder(folder)
    alias = folder / "k"
    alias.symlink_to(target, target_is_directory=True)
    return alias


def drop_alias(alias: Path, *, kept: bool) -> None:
    """Remove a ``short_alias`` folder; for a kept kernel, keep it (its connection file names
    the sockets through it) but drop its record, so ``kernelexec gc`` leaves it alone."""
    folder = alias.parent
    if not folder.name.startswith(ALIAS_PREFIX):
        return
    if kept:
        with contextlib.suppress(OSError):
            os.unlink(folder / OWNER_FILE)
        return
    shutil.rmtree(folder, ignore_errors=True)  # unlinks the link ``k``, never its target


def container_owner(options: DockerOptions) -> tuple[int, int] | None:
    """The container user's (uid, gid) when the host runs as root (files it must own)."""
    if not hasattr(os, "getuid") or os.getuid() != 0:
        return None
    uid, _, gid = options.resolved_user().partition(":")
    if not uid.isdigit() or uid == "0":
        return None
    return int(uid), int(gid) if gid.isdigit() else int(uid)


def _ask_reaper(path: Path, request: str, timeout: float) -> str | None:
    """Send ``request`` (``mark`` or ``reap``) to the kernel container's reaper; its answer.

    None when it cannot be reached (an image whose kernel was not started by ``_LAUNCHER``, a
    kernel already gone): the interrupt alone then has to do.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(path))
            conn.sendall(f"{request}\n".encode())
            return conn.recv(64).decode(errors="replace").strip()
    except OSError:
        return None


def _reaper_listening(path: Path) -> bool:
    """Whether the reaper's socket accepts a connection (its file missing: cannot tell)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(1.0)
        try:
            conn.connect(str(path))
        except FileNotFoundError:
            return True
        except OSError:
            return False
    return True


def _relayed_ports() -> list[tuple[int, int]]:
    """(ipc suffix on the host, port on the container's loopback) for each channel."""
    return [(i, _CONTAINER_PORTS[name]) for i, name in enumerate(_CHANNELS, start=1)]


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


def _write_private_inside(door: Door, path: str, info: dict[str, Any]) -> None:
    """The connection file in a runtime folder inside the work dir: new, 0600, renamed into
    place within the folder (a link planted at its name is replaced, never written through),
    then given to the container user as its folder was (``prepare_inside``)."""
    door.write_bytes(path, json.dumps(info).encode(), mode=0o600)
    folder = door.lstat(path.rsplit("/", 1)[0])
    if folder is not None and os.geteuid() == 0:
        door.chown(path, folder.st_uid, folder.st_gid)


def _check_still_there(door: Door, inside: str, runtime: Path) -> None:
    """The engine mounts the runtime folder by its path: refuse when that path no longer
    names the folder the door made (a link put on the way since)."""
    made = door.lstat(inside)
    try:
        named = os.stat(runtime)
    except OSError:
        named = None
    if made is None or named is None or (made.st_dev, made.st_ino) != (named.st_dev, named.st_ino):
        raise UnsafePath(
            f"the kernel's runtime folder {runtime} was moved or replaced by a link in the work "
            "dir before its container started; kernelexec does not mount it"
        )


def _write_private(path: Path, info: dict[str, Any], options: DockerOptions) -> None:
    """Write the connection file readable only by its owner (the container user)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(info, f)
    prepare_host_dir(path, options)


def engine_time(text: Any) -> float | None:
    """An engine timestamp (``2026-11-27T10:50:01.123456789Z``) as ``time.time()`` seconds;
    None for an unset one (``0001-01-01T00:00:00Z``: the container has not ended) or junk."""
    if not isinstance(text, str):
        return None
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if match is None or match[1].startswith("0001-"):
        return None
    fraction = (match[2] or ".0")[:7]  # microseconds: what datetime holds
    zone = "+00:00" if match[3] == "Z" else match[3]
    try:
        return datetime.datetime.fromisoformat(match[1] + fraction + zone).timestamp()
    except ValueError:
        return None


class DockerLanguageKernel(KernelBackend):
    """Another language's kernel (R, Deno, bash, any kernelspec the image has) in a
    ``DockerKernel``'s container: the same work dir, limits, user and (lack of) network as the
    session's Python kernel. Started by a ``docker exec`` of the launcher (``_docker_langs``),
    reached through a relay to its ports on the container's loopback; the container's reaper
    (the Python kernel's) kills what an interrupted block started. It lives as long as the
    container: a restart of the Python kernel (a new container) ends it."""

    kind = "docker-kernel"
    inherits_host_env = False
    #: where its relay's ``docker exec`` starts
    _exec_dir = WORKSPACE

    def __init__(self, parent: DockerKernel, kernel_name: str, *, slot: int) -> None:
        self.parent, self.kernel_name = parent, kernel_name
        #: its channels' ports in the container: beside the Python kernel's, one range per kernel
        #: (slots only differ within one container; the modulo keeps a long session's in range)
        self._ports = [50010 + 10 * (slot % 1000) + i for i in range(len(_CHANNELS))]
        self._env: dict[str, str] = {}
        self._client: _BlockClient | None = None
        self._watch: LauncherWatch | None = None
        self._relay: Relay | None = None
        self._sockets: Path | None = None
        self._by_message = False  # Deno: SIGINT kills its kernel, an interrupt_request does not

    @property
    def workspace(self) -> str:
        return WORKSPACE

    @property
    def client(self) -> KernelClientLike:
        if self._client is None:
            raise KernelStartFailed(f"the {self.kernel_name} kernel is not running")
        return self._client

    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        self._env = dict(env)
        await self._launch(timeout)

    async def _launch(self, timeout: float) -> None:
        from docker.utils.socket import frames_iter

        deadline = asyncio.get_running_loop().time() + timeout
        container, parent_client = self.parent.container, self.parent._client
        if container is None or parent_client is None or not await self.parent.is_alive():
            # Not an engine error: the container ended (the session's next block restarts it).
            why = self.parent.death_reason() or "not started"
            raise KernelStartFailed(f"the session's kernel container is not running ({why})")
        docker = self.parent._docker
        info = {**_connection_info(network=True), "kernel_name": self.kernel_name}
        try:
            path = f"{RUNTIME}/lang-{uuid.uuid4().hex}.json"
            argv = ["python3", "-I", "-c", LAUNCHER_SCRIPT, self.kernel_name, path]
            _, stream = await docker.exec_stream(container, argv, self._env, stdin=True)
            self._watch = watch = LauncherWatch(stream, frames_iter)
            inside = {**info, "ip": "127.0.0.1", **dict(zip(_CHANNELS, self._ports, strict=True))}
            watch.send(json.dumps(inside))
            if not await asyncio.to_thread(watch.wait_started, max(deadline - _now(), 0.1)):
                raise self._start_failed()
            self._by_message = "deno" in self.kernel_name.lower()
            await self._connect(info, docker, container, frames_iter)
            await self._wait_ready(deadline)
        except BaseException:
            await self._stop()
            raise

    async def _connect(
        self, info: dict[str, Any], docker: Any, container: Any, frames: Any
    ) -> None:
        argv = ["python3", "-I", "-S", "-c", RELAY_SCRIPT]
        _, stream = await docker.exec_stream(
            container, argv, {}, stdin=True, workdir=self._exec_dir
        )
        self._sockets = sockets = Path(tempfile.mkdtemp(prefix=TEMP_PREFIXES[0]))
        mark_folder(sockets)  # `kernelexec gc` removes it once this process is gone
        endpoints = {sockets / f"kernel-{i}": port for i, port in enumerate(self._ports, 1)}
        try:
            self._relay = Relay(endpoints, stream, frames)
        except BaseException:
            with contextlib.suppress(OSError):
                stream.close()
            raise
        self._client = client = _BlockClient()
        client.reaper = self.parent._reaper
        host: dict[str, Any] = {**info, "transport": "ipc", "ip": str(sockets / "kernel")}
        client.load_connection_info(host)  # type: ignore[arg-type]
        try:
            start_channels(client)
        except zmq.ZMQError as exc:
            client.context.destroy(linger=0)
            self._client = None
            what = f"cannot connect to the {self.kernel_name} kernel"
            raise KernelStartFailed(f"{what}: {exc}") from exc

    async def _wait_ready(self, deadline: float) -> None:
        """Until the kernel answers kernel_info on shell and is heard on iopub (as the Python
        kernel's ``_wait_ready``); a launcher that ended first is a clear failure."""
        client = self._client
        assert client is not None
        while (remaining := deadline - _now()) > 0:
            if await self.seems_gone():
                raise self._start_failed()
            if await _answers(client, remaining):
                return
        what = f"the {self.kernel_name} kernel in the container"
        raise KernelStartFailed(f"{what} did not answer in time")

    def _start_failed(self) -> KernelStartFailed:
        watch = self._watch
        if watch is not None and watch.missing:
            # "no kernelspec named" is what the session reports as a kernel not installed
            return KernelStartFailed(
                f"no kernelspec named {self.kernel_name!r} in the image {self.parent.options.image}"
            )
        reason = (watch.reason if watch else None) or self.parent.death_reason() or "it ended"
        tail = (watch.stderr_tail.strip().splitlines() or [""])[-1] if watch else ""
        return KernelStartFailed(
            f"the {self.kernel_name} kernel did not start: {reason}" + (f": {tail}" if tail else "")
        )

    async def interrupt(self) -> None:
        """SIGINT to the kernel's process group (Deno: an interrupt_request, which keeps it), then
        the container's reaper kills what the running block started."""
        client, watch = self._client, self._watch
        if client is None or watch is None:
            return
        if self._by_message:
            client.control_channel.send(client.session.msg("interrupt_request", content={}))
        else:
            await asyncio.to_thread(watch.send, "int")
        if client.reaper is not None and client.block_marked:
            await asyncio.to_thread(_ask_reaper, client.reaper, "reap", 10.0)

    async def restart(self, *, timeout: float) -> None:
        await self._stop()
        await self._launch(timeout)

    async def is_alive(self) -> bool:
        return not await self.seems_gone() and await self.parent.is_alive()

    async def seems_gone(self) -> bool:
        watch, relay = self._watch, self._relay
        return watch is None or watch.ended or relay is None or not relay.alive

    def death_reason(self) -> str | None:
        watch = self._watch
        if watch is None or not watch.ended:
            return self.parent.death_reason()
        return watch.reason

    async def shutdown(self) -> None:
        await self._stop()

    async def _stop(self) -> None:
        client, self._client = self._client, None
        relay, self._relay = self._relay, None
        watch = self._watch  # kept: death_reason still tells why it ended
        sockets, self._sockets = self._sockets, None
        try:
            if client is not None:
                with contextlib.suppress(zmq.ZMQError):
                    client.stop_channels()
            if watch is not None:
                # Its stdin closing makes the launcher kill the kernel's process group.
                await asyncio.to_thread(watch.close)
            if relay is not None:
                await asyncio.to_thread(relay.close)
        finally:
            if sockets is not None:
                shutil.rmtree(sockets, ignore_errors=True)


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _answers(client: Any, remaining: float) -> bool:
    """One kernel_info round: True once the kernel replied on shell and was heard on iopub
    (its queued iopub messages drained). A reply on shell is not enough: iopub must be
    subscribed too, or the first block's output could be lost; kernel_info makes the kernel
    publish a status."""
    client.kernel_info()
    try:
        await client.get_shell_msg(timeout=min(1.0, remaining))
        await client.get_iopub_msg(timeout=min(1.0, max(remaining, 0.1)))
    except queue.Empty:
        return False
    with contextlib.suppress(queue.Empty):
        while True:
            await client.get_iopub_msg(timeout=0.05)
    return True
