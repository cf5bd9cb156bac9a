"""Kernels forked from a warm server: a local kernel in tens of milliseconds, not hundreds.

A cold kernel spends most of its start importing ipykernel, IPython, zmq and tornado. A fork
server (``_fork_server.py``) imports them once, plus an optional warm-up list (numpy, pandas,
matplotlib...), and forks a fresh kernel per request: the child binds its own sockets and runs a
normal IPython kernel, so everything a local kernel promises holds (interrupt keeps state, restart,
death noticed, timeouts). Pages imported before the fork are shared copy-on-write, so an idle
kernel costs a fraction of a cold one's memory.

One server per (interpreter, warm-up list) per process, started by the first executor that asks,
shared by the rest, and ended with the process (its kernels watch it and end with it). A server
that died is replaced on the next request, with a log line.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import write_connection_file

from .._errors import BackendUnavailable, KernelStartFailed
from . import _containment
from ._ready import NotReady, start_channels, wait_bound, wait_ready
from .base import KernelBackend, KernelClientLike
from .local_command import resolve_python
from .local_kernel import BlockTracker, log_end

_log = logging.getLogger("kernelexec")
_SERVER_SCRIPT = Path(__file__).with_name("_fork_server.py")
_SHUTDOWN_WAIT = 1.0  # seconds a kernel gets to exit after a shutdown request, then it is killed


class _ForkServer:
    """One running server process, talked to over its stdin/stdout pipes (one line each way)."""

    def __init__(self, python: str, warm_up: tuple[str, ...], start_timeout: float) -> None:
        self.python, self.warm_up = python, warm_up
        self._lock = threading.Lock()  # requests from any thread / event loop, one at a time
        self._proc = subprocess.Popen(
            [python, str(_SERVER_SCRIPT), *warm_up],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C is not for it
        )
        try:
            answer = self._read(start_timeout)
        except BaseException:
            self.stop()  # no server left half-started
            raise
        if "ready" not in answer:
            self.stop()
            raise BackendUnavailable(str(answer.get("error", "the fork server did not start")))
        self.pid = int(answer["ready"])

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def fork(self, request: Mapping[str, Any], timeout: float) -> int:
        with self._lock:
            stdin = self._proc.stdin
            assert stdin is not None
            try:
                stdin.write(json.dumps(dict(request)) + "\n")
                stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                raise BackendUnavailable("the fork server is gone") from exc
            answer = self._read(timeout)
        if "pid" not in answer:
            raise KernelStartFailed(f"the fork server could not fork: {answer.get('error')}")
        return int(answer["pid"])

    def _read(self, timeout: float) -> dict[str, Any]:
        stdout: IO[str] | None = self._proc.stdout
        assert stdout is not None
        reader = _Line(stdout)
        line = reader.get(timeout)
        if line is None:
            self._proc.kill()  # a server that does not answer is broken: the next one is new
            raise BackendUnavailable(f"the fork server did not answer within {timeout:g} s")
        if not line:
            return {"error": f"the fork server exited (status {self._proc.poll()})"}
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self._proc.kill()  # its answers are out of step: the next server is new
            raise BackendUnavailable(f"the fork server answered {line[:200]!r}, not a document")
        return answer

    def disown(self) -> None:
        """In a process forked from the one that started the server: let go of the inherited
        pipe ends without touching the server. They are pointed at /dev/null rather than closed,
        so the file objects stay valid (nothing buffered can reach a reused descriptor), and the
        server still sees the end of its input when its owner stops it."""
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError, ValueError):
                        os.dup2(null, stream.fileno())
        finally:
            os.close(null)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()  # end of input: the server ends, its kernels follow
        try:
            self._proc.wait(2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class _Line:
    """Read one line with a deadline (a thread per read: the server's answer is immediate)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._line: str | None = None
        self._done = threading.Event()

    def get(self, timeout: float) -> str | None:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        self._done.wait(timeout)
        return self._line

    def _run(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._line = self._stream.readline()
        self._done.set()


_servers: dict[tuple[str, tuple[str, ...]], _ForkServer] = {}
_servers_lock = threading.Lock()


def _server(python: str, warm_up: tuple[str, ...], timeout: float) -> _ForkServer:
    with _servers_lock:
        key = (python, warm_up)
        server = _servers.get(key)
        if server is not None and not server.alive:
            _log.warning("the fork server (pid %s) died; starting a new one", server.pid)
            server.stop()
            server = None
        if server is None:
            server = _servers[key] = _ForkServer(python, warm_up, timeout)
        return server


def stop_fork_servers() -> None:
    """End every fork server of this process (and so their kernels). Called at exit; call it
    yourself after the Python environment changed, so the next kernel sees the change."""
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.stop()


def _forget_servers_in_child() -> None:
    """After ``os.fork()`` (multiprocessing's default on Linux, too): the parent's servers stay
    the parent's. The child lets go of their pipes (a child holding them kept a server its parent
    stopped waiting for end of input), forgets them, and starts its own when it asks; the lock is
    new (another thread may have held it at the fork)."""
    global _servers_lock
    _servers_lock = threading.Lock()
    for server in _servers.values():
        server.disown()
    _servers.clear()


atexit.register(stop_fork_servers)
os.register_at_fork(after_in_child=_forget_servers_in_child)


def _module_names(warm_up: Sequence[str]) -> tuple[str, ...]:
    """The warm-up list, checked before any server starts: a string alone would be read as
    its letters, each a module ("cannot import 'j'")."""
    if isinstance(warm_up, (str, bytes)):
        raise TypeError(f"warm_up is a list of module names, not one string: [{warm_up!r}]")
    names = tuple(warm_up)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"warm_up names modules as strings, not {type(name).__name__}")
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"warm_up: {name!r} is not a module name (like 'pandas' or 'a.b')")
    return names


class ForkKernel(KernelBackend):
    """A kernel forked from a warm server process on this machine."""

    kind = "fork-kernel"

    def __init__(
        self,
        *,
        warm_up: Sequence[str] = (),
        python: str | os.PathLike[str] | None = None,
        shutdown_wait: float = _SHUTDOWN_WAIT,
    ) -> None:
        self.warm_up = _module_names(warm_up)
        self.python = sys.executable if python is None else resolve_python(python)
        self.shutdown_wait = shutdown_wait
        self._kc: AsyncKernelClient | None = None
        self._tracker: BlockTracker | None = None
        #: the jail's processes when the running block started (None: no block runs)
        self._block_pids: set[_containment.Member] | None = None
        self._jail: _containment.Jail | None = None
        self._pid: int | None = None
        self._server_pid: int | None = None
        self._dir: str | None = None
        self._work_dir: Path | None = None
        self._env: dict[str, str] = {}
        self._setup: str | None = None

    def run_at_start(self, code: str) -> bool:
        """The forked child runs it once its kernel is built, before the kernel answers."""
        self._setup = code
        return True

    @property
    def client(self) -> KernelClientLike:
        if self._tracker is None:
            raise KernelStartFailed("the kernel is not running")
        return self._tracker

    def _jail_pids(self) -> set[_containment.Member]:
        return set() if self._jail is None else self._jail.members()

    @property
    def pid(self) -> int | None:
        """The kernel process id (None when no kernel runs)."""
        return self._pid

    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        self._work_dir, self._env = work_dir, dict(env)
        await self._launch(timeout)

    async def _launch(self, timeout: float) -> None:
        try:
            await self._fork_and_connect(timeout)
        except BaseException:
            await self._stop(polite=False)  # nothing half-started is left behind
            raise

    async def _fork_and_connect(self, timeout: float) -> None:
        server = await asyncio.to_thread(_server, self.python, self.warm_up, max(timeout, 30))
        self._server_pid = server.pid
        request = self._request()
        self._pid = await asyncio.to_thread(server.fork, request, timeout)
        self._kc = kc = AsyncKernelClient(connection_file=request["connection_file"])
        self._tracker = BlockTracker(kc, self)
        kc.load_connection_file()
        deadline = time.monotonic() + timeout
        try:
            await wait_bound(_socket_files(kc), deadline, self._running)
            start_channels(kc)
            await wait_ready(kc, deadline, self._running)
        except NotReady as exc:
            detail = "it exited" if exc.died else f"no answer within {timeout:g} s"
            log = self._log_tail()
            detail += f"; its log ends:\n{log}" if log else ""
            raise KernelStartFailed(f"the forked kernel did not start: {detail}") from exc

    def _request(self) -> dict[str, Any]:
        # IPC sockets in a private folder, as for a local kernel: no TCP port, no other user.
        self._dir = tempfile.mkdtemp(prefix="kernelexec-fork-")
        connection_file = os.path.join(self._dir, "kernel.json")
        write_connection_file(connection_file, transport="ipc", ip=os.path.join(self._dir, "k"))
        return {
            "connection_file": connection_file,
            "cwd": str(self._work_dir),
            "env": self._env,
            "log": os.path.join(self._dir, "kernel.log"),
            "status": os.path.join(self._dir, "exit-status"),
            "cgroup": self._cgroup_procs(),
            "setup": self._setup,
        }

    def _cgroup_procs(self) -> str | None:
        """A cgroup for the kernel when the host offers one (the forked child joins it before
        it runs anything): nothing it starts, in a new session or not, outlives ``close()``.
        Elsewhere the kernel's process group is what is killed."""
        mechanism = _containment.mechanism()
        if not mechanism.startswith("cgroup"):
            return None
        self._jail = jail = _containment.make_jail(mechanism)
        return None if jail.procs_file is None else str(jail.procs_file)

    def _log_tail(self) -> str:
        """The end of the kernel's own output (a traceback, when it failed to start)."""
        return "" if self._dir is None else log_end(os.path.join(self._dir, "kernel.log"))

    async def interrupt(self) -> None:
        """SIGINT to the kernel; and SIGKILL to every process the running block started that
        still runs (what earlier blocks started is left alone, as in ``LocalKernel``)."""
        if self._pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._pid, signal.SIGINT)
        before = self._block_pids
        if before is not None and self._jail is not None:
            await asyncio.to_thread(self._jail.kill_new, before, (self._pid,))

    async def restart(self, *, timeout: float) -> None:
        await self._stop(polite=False)  # state is lost either way
        await self._launch(timeout)

    async def is_alive(self) -> bool:
        return self._running()

    def death_reason(self) -> str | None:
        if self._pid is None or self._running():
            return None
        status = self._exit_status()
        if status is None:
            return "the kernel process exited"
        if status < 0:
            with contextlib.suppress(ValueError):
                return f"killed by signal {signal.Signals(-status).name}"
        return f"exit status {status}"

    def _exit_status(self) -> int | None:
        """What the server's reaper wrote for the kernel (it is the kernel's parent; it writes
        just after the kernel is gone, so a moment is allowed for it)."""
        if self._dir is None:
            return None
        path = os.path.join(self._dir, "exit-status")
        deadline = time.monotonic() + 0.5
        while True:
            with contextlib.suppress(OSError, ValueError), open(path, encoding="ascii") as f:
                return int(f.read())
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)

    async def shutdown(self) -> None:
        await self._stop(polite=True)

    def _running(self) -> bool:
        """Alive and not a zombie (the server reaps its children, but not instantly)."""
        if self._pid is None:
            return False
        try:
            with open(f"/proc/{self._pid}/stat", encoding="ascii") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")

    async def _stop(self, *, polite: bool) -> None:
        kc, self._kc = self._kc, None
        self._tracker, self._block_pids = None, None
        pid, self._pid = self._pid, None
        try:
            if kc is not None and polite and pid is not None:
                with contextlib.suppress(RuntimeError, OSError):
                    kc.shutdown()
                    await _wait_gone(pid, self.shutdown_wait)
            if kc is not None:
                kc.stop_channels()
                kc.context.destroy(linger=0)  # the client made it; nothing else shares it
        finally:
            if pid is not None:
                # The kernel leads its own process group: whatever a block started in it goes too.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            jail, self._jail = self._jail, None
            if jail is not None:  # and whatever left the group, from the cgroup
                await asyncio.to_thread(jail.close)
            folder, self._dir = self._dir, None
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _socket_files(kc: AsyncKernelClient) -> list[str]:
    ports = (kc.shell_port, kc.iopub_port, kc.stdin_port, kc.control_port)
    return [f"{kc.ip}-{port}" for port in ports]


async def _wait_gone(pid: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.01)
