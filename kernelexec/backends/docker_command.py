"""Stateless back end in Docker: one long-lived container per executor, one ``exec`` per block.

The container's main process is a tiny Python loop that is its own init: it reaps orphans and
exits at once on a SIGTERM from the engine (a main process that ignores SIGTERM is why
``docker stop`` can take 10 s). Being PID 1 also makes it the one process ``kill -1`` spares,
so after a block (and when a block times out) every process the block left behind is killed
*inside* the container with ``kill -9 -1`` run as the container user. A fresh container per
block is an option too.

The Docker SDK blocks, so every engine call runs in a worker thread and output frames are handed
to the event loop as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from docker.utils.socket import STDERR, frames_iter

from .._door import Door
from .._errors import DockerUnavailable, KernelExecError
from .._types import NetworkEvent
from .._workdir import INTERNAL_DIR
from ._docker import (
    WORKSPACE,
    ContainerHandle,
    ContainerSpec,
    DockerOptions,
    merge_options,
    prepare_inside,
)
from .base import ByteSink, CommandBackend, CommandOutcome

# PID 1 of the container: reaps orphans, and exits on a SIGTERM from outside the container
# (`docker stop`: the sender is in another pid namespace, so si_pid is 0) but ignores one sent
# from inside it, as the kernel already ignores a SIGKILL sent to PID 1 from inside.
_MAIN = """\
import os, signal, sys
wanted = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}
signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
while True:
    info = signal.sigwaitinfo(wanted)
    if info.si_signo != signal.SIGCHLD:
        if info.si_pid == 0:
            sys.exit(0)
        continue
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
"""

# Wraps every block (``python3 -I -S -c _WRAPPER STATUS_FILE argv...``): run it, then kill
# whatever it left running (kill(-1) spares PID 1 and the wrapper itself), say so when the memory
# cgroup's OOM killer fired during the block, and when the block was killed by a signal write the
# signal's number to STATUS_FILE: the exec's exit status (128 + n) cannot tell that from a
# process that exited with 128 + n, and the local back end names the signal.
# The block writes to pipes of the wrapper's, which copies them to the exec's stdout and stderr
# (``pump``): under gVisor a write to those returns after 64 KiB, and a writer that does not loop
# (Python's own unbuffered stdout) silently lost the rest of a long line.
_WRAPPER = r"""
import _thread, os, select, signal, sys

def pump(src, dst, done):
    broken = False
    while True:
        try:
            data = os.read(src, 65536)
        except OSError:
            data = b""
        if not data:
            break
        view = memoryview(data)
        while view and not broken:
            try:
                view = view[os.write(dst, view):]
            except BlockingIOError:
                select.select([], [dst], [], 1)
            except OSError:
                broken = True  # nobody reads any more: go on draining, never block the block
    done.release()

def oom():
    for name in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(name) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return value.strip()
        except OSError:
            pass
    return "0"

status_file, argv = sys.argv[1], sys.argv[2:]
before = oom()
pipes = (os.pipe(), os.pipe())
pid = os.fork()
if pid == 0:
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    for fd, (r, w) in zip((1, 2), pipes):
        os.dup2(w, fd)
        os.close(r)
        os.close(w)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write("%s: %s\n" % (argv[0], exc.strerror))
    os._exit(127)
signal.signal(signal.SIGINT, signal.SIG_IGN)
# At a timeout the block gets SIGTERM and a grace: what it writes then still goes through us.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pumps = []
for fd, (r, w) in zip((1, 2), pipes):
    os.close(w)
    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(pump, (r, fd, done))
    pumps.append(done)
status = os.waitpid(pid, 0)[1]
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
for done in pumps:  # what the block wrote is all delivered once its last process is gone
    done.acquire(timeout=5)
code = os.waitstatus_to_exitcode(status)
if code < 0:
    try:
        os.makedirs(os.path.dirname(status_file), exist_ok=True)
        with open(status_file, "w") as f:
            f.write(str(-code))
    except OSError:
        pass
    code = 128 - code
if code >= 128 and oom() != before:
    sys.stderr.write(
        "kernelexec: the block was killed: out of memory (container memory limit %s)\n"
        % os.environ.get("KERNELEXEC_MEMORY", "unknown")
    )
    sys.stderr.flush()
os._exit(code)
"""
#: where (under the work dir) a block's wrapper notes the signal that killed it: the host reads
#: the file itself (``docker cp`` cannot see the container's tmpfs)
_STATUS_DIR = (INTERNAL_DIR, "status")

# Run after a timeout: TERM, a short grace, then KILL until nothing but PID 1 (and us) is left.
_REAPER = """
kill -TERM -1 2>/dev/null && sleep {grace}
for i in 1 2 3 4 5 6 7 8 9 10; do
  kill -9 -1 2>/dev/null || exit 0
  sleep 0.05
done
exit 1
"""


class _ContainerEnded(Exception):
    """The block's exec could not start: its container had stopped."""


_ENDED_NOTE = (
    b"\nkernelexec: the container stopped while the block ran (its PID 1 was killed, or its "
    b"sandbox ended); the next block runs in a new one.\n"
)


_OOM_ENDED_NOTE = (
    "\nkernelexec: the block was killed: out of memory (container memory limit {memory}); its "
    "container stopped with it, and the next block runs in a new one.\n"
)


class DockerCommand(CommandBackend):
    """Runs python and shell blocks in a container (``kernelexec/python`` by default).

    >>> backend = DockerCommand(image="kernelexec/python:latest", memory="1g")

    Keyword overrides are ``DockerOptions`` fields; ``fresh_container=True`` starts a new
    container for every block (slower; nothing at all survives between blocks).
    """

    kind = "docker-command"
    inherits_host_env = False

    def __init__(
        self,
        *,
        image: str | None = None,
        options: DockerOptions | None = None,
        fresh_container: bool = False,
        kill_grace: float = 0.2,
        **overrides: Any,
    ) -> None:
        self._docker = ContainerHandle(merge_options(options, image, overrides), kind=self.kind)
        self.session = self._docker.session
        self.fresh_container = fresh_container
        self.kill_grace = kill_grace
        # The container a block saw stop under it (and said so): the next block's new
        # container needs no second note.
        self._ended_id: str | None = None

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
        """The long-lived container (a docker SDK ``Container``), or None."""
        return self._docker.container

    def supported_languages(self) -> Sequence[str]:
        return ("python", "shell")

    def argv_for(self, language: str, code_path: str) -> list[str] | None:
        if language == "python":
            return ["python3", code_path]
        if language == "shell":
            return ["bash", code_path]
        return None

    async def start(self, work_dir: Path) -> None:
        await self._docker.prepare(work_dir)
        # The blocks' wrapper writes its status files here, as the container user.
        assert self._docker.door is not None
        status = "/".join(_STATUS_DIR)
        await asyncio.to_thread(prepare_inside, self._docker.door, status, self.options)
        if not self.fresh_container:
            await self._docker.start(self._spec())

    async def run(
        self,
        argv: Sequence[str],
        *,
        work_dir: Path,
        env: Mapping[str, str],
        timeout: float,
        on_stdout: ByteSink,
        on_stderr: ByteSink,
    ) -> CommandOutcome:
        container = await self._block_container(on_stderr)
        try:
            try:
                return await self._exec(
                    container, argv, work_dir, env, timeout, on_stdout, on_stderr
                )
            except _ContainerEnded:
                # It stopped between the check above and the exec (under gVisor a sandbox ended
                # by the block before may take a moment to go): once more, in a new container.
                container = await self._block_container(on_stderr)
                return await self._exec(
                    container, argv, work_dir, env, timeout, on_stdout, on_stderr
                )
        finally:
            if self.fresh_container:
                await self._docker.remove(container)

    async def restart(self) -> None:
        if self._docker.container is not None:
            await self._docker.remove()
            await self._docker.start(self._spec())

    async def close(self) -> None:
        """Remove the container, or keep it as ``auto_remove`` / ``stop_container`` say (then
        ``kept`` says where it is)."""
        try:
            await self._docker.release()
        finally:
            self._docker.close()

    async def take_network_log(self) -> list[NetworkEvent]:
        return await self._docker.take_network_log()

    @property
    def kept(self) -> str | None:
        """Where the container ``close()`` kept is, in words (None: nothing was kept)."""
        return self._docker.kept

    # -- internals ----------------------------------------------------------------------------
    def _memory_env(self) -> dict[str, str]:
        return {"KERNELEXEC_MEMORY": self.options.memory or "none"}

    def _spec(self) -> ContainerSpec:
        return ContainerSpec(
            command=["python3", "-c", _MAIN],
            init=False,  # the main process is its own init (see _MAIN)
            environment=self._memory_env(),
        )

    async def _container_for_block(self) -> tuple[Any, str | None]:
        """The container to run the next block in, and a note when it had to be replaced."""
        if self.fresh_container:
            return await self._docker.create(self._spec()), None
        container = self._docker.container
        if container is None:
            raise DockerUnavailable("the Docker command back end is not started")
        if not await self._docker.reload(container):
            how = "was removed from outside (docker rm, or kernelexec gc)"
        elif container.status != "running":
            how = f"was found {container.status} (stopped or killed from outside)"
        else:
            return container, None
        # Nothing of value lived in it (the work dir is a mount): a fresh container takes over.
        old, told = container.short_id, container.id == self._ended_id
        container = await self._docker.start(self._spec())
        if told:  # the block it stopped under said so already
            return container, None
        return (
            container,
            f"the container {old} {how}; this block runs in a new one, {container.short_id}.",
        )

    async def _block_container(self, on_stderr: ByteSink) -> Any:
        """The container for a block; a note on stderr when it is a new one."""
        container, note = await self._container_for_block()
        if note is not None:
            on_stderr(f"kernelexec: {note}\n".encode())
        return container

    async def _exec(
        self,
        container: Any,
        argv: Sequence[str],
        work_dir: Path,
        env: Mapping[str, str],
        timeout: float,
        on_stdout: ByteSink,
        on_stderr: ByteSink,
    ) -> CommandOutcome:
        # The executor hands over only its own variables (inherits_host_env is False).
        status = Path(*_STATUS_DIR, f"signal-{uuid.uuid4().hex[:12]}")
        wrapped = ["python3", "-I", "-S", "-c", _WRAPPER, f"{WORKSPACE}/{status}", *argv]
        try:
            exec_id, sock = await self._docker.exec_stream(
                container, wrapped, {**env, **self._memory_env()}
            )
        except DockerUnavailable:
            if not self.options.shares_host_kernel and await self._ended(container):
                raise _ContainerEnded from None  # nothing of the block ran
            raise
        loop = asyncio.get_running_loop()
        sinks = _Sinks(on_stdout, on_stderr)
        reader = asyncio.ensure_future(asyncio.to_thread(_pump, sock, loop, sinks))
        try:
            done = await self._wait(reader, container, timeout)
            if done == "exited":
                return await self._ended_outcome(container, on_stderr)
            if done == "timeout":
                await self._reap(container)
                # Once the block's processes are gone the stream ends; never wait forever.
                await asyncio.wait({reader}, timeout=5)
                return CommandOutcome(exit_code=None, timed_out=True, killed_reason="timeout")
            if isinstance(reader.exception(), OSError):
                raise DockerUnavailable(
                    f"lost the connection to the Docker engine: {reader.exception()}"
                ) from reader.exception()
            reader.result()
        except asyncio.CancelledError:
            # The caller gave up on the block (an AutoGen cancellation token): its processes
            # must not run on in the container.
            await self._reap(container)
            raise
        finally:
            _shutdown(sock)
            # The reader thread ends once the socket is shut; its frames are delivered by then.
            await asyncio.gather(reader, return_exceptions=True)
        sinks.raise_error()
        code = await self._docker.exec_exit_code(exec_id)
        if code == 137 and not self.options.shares_host_kernel:
            await self._settle(container)
        if code == 128 and not self.options.shares_host_kernel and await self._ended(container):
            # gVisor's exec gave up waiting on a sandbox that ended under it (a fork bomb past
            # the engine's pids limit): its own "waiting on pid" text is in stderr; say plainly.
            return await self._ended_outcome(container, on_stderr)
        door = self._docker.door
        if 128 < code <= 128 + 64 and door and _read_signal(door, status) == code - 128:
            code = 128 - code  # as the local back end: a negative exit code names a signal
        return CommandOutcome(exit_code=code)

    async def _wait(self, reader: asyncio.Future[Any], container: Any, timeout: float) -> str:
        """Until the block's output ends ("done"), its timeout ("timeout") or, under a runtime with
        its own kernel, its container stops ("exited").

        gVisor lets a block SIGKILL the container's PID 1 (Linux does not, from inside the
        namespace) and then the exec's stream sometimes stays open until the timeout: the
        container's state is checked once a second instead.
        """
        if self.options.shares_host_kernel:
            done, _ = await asyncio.wait({reader}, timeout=timeout)
            return "done" if done else "timeout"
        deadline = asyncio.get_running_loop().time() + timeout
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            done, _ = await asyncio.wait({reader}, timeout=min(left, 1.0))
            if done:
                return "done"
            if not await self._docker.reload(container) or container.status != "running":
                # Whatever output was on its way has had a second to arrive.
                return "exited"
        return "timeout"

    async def _ended_outcome(self, container: Any, on_stderr: ByteSink) -> CommandOutcome:
        """A block whose container stopped under it (a runtime with its own kernel). Under
        gVisor the memory cgroup's OOM killer ends the whole sandbox, not the block alone: the
        engine says so (``OOMKilled``), and the block is reported killed by SIGKILL for want of
        memory, as under runc."""
        self._ended_id = container.id
        found = await self._docker.reload(container)
        if found and container.attrs.get("State", {}).get("OOMKilled"):
            on_stderr(_OOM_ENDED_NOTE.format(memory=self.options.memory or "unknown").encode())
            return CommandOutcome(exit_code=-signal.SIGKILL)
        on_stderr(_ENDED_NOTE)
        return CommandOutcome(exit_code=137)

    async def _ended(self, container: Any) -> bool:
        """Whether the container stopped (the engine may say so a moment after the exec)."""
        await self._settle(container)
        return not await self._docker.reload(container) or container.status != "running"

    async def _settle(self, container: Any) -> None:
        """After a block killed by SIGKILL under gVisor: was it the sandbox that ended? The
        engine says so a moment after the exec's end, and the next block must not try to exec
        in the dying container ("cannot exec in a stopped state")."""
        for _ in range(10):
            if not await self._docker.reload(container) or container.status != "running":
                return
            await asyncio.sleep(0.1)

    async def _reap(self, container: Any) -> None:
        """Kill every process the block left in the container; replace it if that fails."""
        try:
            code = await self._docker.exec_quiet(container, _REAPER.format(grace=self.kill_grace))
        except DockerUnavailable:
            code = -1
        if code != 0 and not self.fresh_container:
            # Could not even start the reaper (e.g. the pids limit is exhausted by a fork
            # bomb) or processes kept appearing: a new container is the sure way out.
            await self._docker.start(self._spec())


class _Sinks:
    """Delivers frames to the executor's sinks; a sink's exception is kept for ``run`` to raise."""

    def __init__(self, on_stdout: ByteSink, on_stderr: ByteSink) -> None:
        self._sinks = {STDERR: on_stderr}
        self._default = on_stdout
        self.error: BaseException | None = None

    def deliver(self, stream: int, data: bytes) -> None:
        if self.error is not None:
            return
        try:
            self._sinks.get(stream, self._default)(data)
        except Exception as exc:
            self.error = exc

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


def _pump(sock: Any, loop: asyncio.AbstractEventLoop, sinks: _Sinks) -> None:
    """Read exec frames (in a worker thread) and hand each to the event loop as it arrives."""
    for stream, data in frames_iter(sock, tty=False):  # type: ignore[no-untyped-call]
        loop.call_soon_threadsafe(sinks.deliver, stream, data)


def _read_signal(door: Door, path: Path) -> int | None:
    """The signal number a block's wrapper wrote (and remove the file), or None. Read through
    the door: the code may have put a link or a FIFO there."""
    try:
        text = door.read_bytes(path, head=16).decode("ascii", errors="replace")
    except (OSError, KernelExecError):
        return None
    with contextlib.suppress(OSError, KernelExecError):
        door.unlink(path)
    return int(text) if text.strip().isdigit() else None


def _shutdown(sock: Any) -> None:
    """Unblock a reader thread and close the exec socket."""
    raw = getattr(sock, "_sock", sock)
    with contextlib.suppress(OSError, AttributeError):
        raw.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()  # a SocketIO wrapper: closing it leaves the socket itself open
        raw.close()
