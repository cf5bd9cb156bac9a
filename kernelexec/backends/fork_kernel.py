"""Kernels forked from a warm server: a local kernel in tens of milliseconds, not hundreds.

A cold kernel spends most of its start importing ipykernel, IPython, zmq and tornado. A fork
server (``_fork_server.py``) imports them once, plus an optional warm-up list (numpy, pandas,
matplotlib...), and forks a fresh kernel per request: the child binds its own sockets and runs a
normal IPython kernel, so everything a local kernel promises holds (interrupt keeps state, restart,
death noticed, timeouts). Pages imported before the fork are shared copy-on-write, so an idle
kernel costs a fraction of a cold one's memory.

One server per (interpreter, warm-up list, interpreter-start variables such as PYTHONPATH) per
process, started by the first executor that asks, shared by the rest, and ended with the process
(its kernels watch it and end with it). A server that died is replaced on the next request, with a
log line.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import write_connection_file

from .._errors import BackendUnavailable, KernelStartFailed
from . import _containment
from ._owner import mark_folder
from ._ready import NotReady, start_channels, wait_bound, wait_ready
from .base import KernelBackend, KernelClientLike
from .local_command import resolve_python
from .local_kernel import BlockTracker, LocalKernel, log_end

_log = logging.getLogger("kernelexec")
T = TypeVar("T")
_SERVER_SCRIPT = Path(__file__).with_name("_fork_server.py")
# The least time a server gets to take a request and answer it: a fork takes milliseconds, but
# a spare that does not take the request is waited for (``_fork_server.HANDOVER_WAIT``, 5 s).
_ANSWER_WAIT = 10.0
_SHUTDOWN_WAIT = 1.0  # seconds a kernel gets to exit after a shutdown request, then it is killed


class _ForkServer:
    """One running server process, talked to over its stdin/stdout pipes (one line each way)."""

    def __init__(
        self,
        python: str,
        warm_up: tuple[str, ...],
        start_timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.python, self.warm_up = python, warm_up
        self._lock = threading.Lock()  # requests from any thread / event loop, one at a time
        self.stopped = False
        # What the server writes before it answers (a warm-up module's traceback, an interpreter
        # that cannot run the script) is kept, to be quoted if it fails.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        try:
            self._proc = subprocess.Popen(
                [python, str(_SERVER_SCRIPT), *warm_up],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                env=_server_env(os.environ if env is None else env),
                start_new_session=True,  # a terminal's Ctrl-C is not for it
            )
        except BaseException:
            self._stderr.close()
            raise
        assert self._proc.stdin is not None
        # Writes that cannot block: a stopped server must not hold a starting kernel (and the
        # host's exit) for ever.
        os.set_blocking(self._proc.stdin.fileno(), False)
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
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=max(timeout, 0)):
            raise BackendUnavailable(f"the fork server was busy for {timeout:g} s")
        try:
            self._check_stopped()
            # A server that takes longer than this is ended (it is shared: it must be stuck,
            # not just late for a start whose time went on waiting for the lock).
            deadline = max(deadline, time.monotonic() + _ANSWER_WAIT)
            self._write(json.dumps(dict(request)) + "\n", deadline)
            answer = self._read(max(deadline - time.monotonic(), 0.001))
        finally:
            self._lock.release()
        if "pid" not in answer:
            self._check_stopped()
            raise KernelStartFailed(f"the fork server could not fork: {answer.get('error')}")
        return int(answer["pid"])

    def _check_stopped(self) -> None:
        if self.stopped:
            raise ServerStopped("the fork server was stopped (stop_fork_servers) meanwhile")

    def _write(self, line: str, deadline: float) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        data = line.encode()
        try:
            fd = stdin.fileno()
            while data:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [fd], [], left)[1]:
                    self._proc.kill()  # half a request may be in its pipe: never used again
                    raise BackendUnavailable(
                        "the fork server did not take a request in time (stopped or stuck); "
                        "it was ended, and the next kernel starts a new one"
                    )
                with contextlib.suppress(BlockingIOError):
                    data = data[os.write(fd, data) :]
        except (OSError, ValueError) as exc:
            self._check_stopped()
            raise BackendUnavailable("the fork server is gone") from exc

    def _read(self, timeout: float) -> dict[str, Any]:
        stdout: IO[str] | None = self._proc.stdout
        assert stdout is not None
        reader = _Line(stdout)
        line = reader.get(timeout)
        if line is None:
            self._proc.kill()  # a server that does not answer is broken: the next one is new
            raise BackendUnavailable(f"the fork server did not answer within {timeout:g} s")
        if not line:
            return {"error": self._exited()}
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

    def _exited(self) -> str:
        """Why the server ended: its status, and the end of what it wrote (a traceback)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(1)  # it closed its answers: it is ending
        text = f"the fork server exited (status {self._proc.poll()})"
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:].decode(errors="replace").strip()
            if tail:
                text += f"; it wrote:\n{tail}"
        return text

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(OSError, ValueError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()  # end of input: the server ends, its kernels follow
        try:
            self._proc.wait(2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._stderr.close()


class ServerStopped(BackendUnavailable):
    """The server was stopped while a kernel was being asked of it: a new one is asked."""


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


# Read by the interpreter (or the dynamic loader) as it starts, so they are the server's, not
# settable in a forked kernel: a kernel whose environment sets them otherwise gets a server of
# its own. Those a kernel can take on after the fork (TZ, PATH, BLAS thread counts) are not here.
_START_NAMES = ("LC_ALL", "LC_CTYPE", "LANG", "LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES")
# Thread pools a library would start at import (BLAS, OpenMP): one thread in the server, whatever
# the host's environment says, so none is running when it forks (a kernel's own setting then
# applies to what it imports itself).
_SINGLE_THREADED = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

ServerKey = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]


def _read_at_start(name: str) -> bool:
    return name.startswith("PYTHON") or name in _START_NAMES


def _start_vars(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if _read_at_start(k)))


def _server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The host's environment with the interpreter-start variables of ``env`` instead."""
    base = {k: v for k, v in os.environ.items() if not _read_at_start(k)}
    return {**base, **dict(_start_vars(env)), **dict.fromkeys(_SINGLE_THREADED, "1")}


def server_key(
    python: str, warm_up: tuple[str, ...], env: Mapping[str, str] | None = None
) -> ServerKey:
    """Which server a kernel comes from: one per interpreter, warm-up list and start variables."""
    return python, warm_up, _start_vars(os.environ if env is None else env)


_servers: dict[ServerKey, _ForkServer] = {}
_servers_lock = threading.Lock()


def _server(
    python: str,
    warm_up: tuple[str, ...],
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> _ForkServer:
    with _servers_lock:
        key = server_key(python, warm_up, env)
        server = _servers.get(key)
        if server is not None and not server.alive:
            _log.warning("the fork server (pid %s) died; starting a new one", server.pid)
            server.stop()
            server = None
        if server is None:
            server = _servers[key] = _ForkServer(python, warm_up, timeout, env)
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
    def runs_other_kernels(self) -> bool:
        return True

    def other_kernel(self, kernel_name: str) -> KernelBackend | None:
        """Another language's kernel (an R block's IRkernel) cannot be forked from a Python
        server: it starts as a local kernel beside this one, held as this one is (a cgroup of
        its own where the host offers one, else its process group) and ended with the session."""
        return LocalKernel(kernel_name=kernel_name, shutdown_wait=self.shutdown_wait)

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
        _check_env(env)
        self._work_dir, self._env = work_dir, dict(env)
        await self._launch(timeout)

    async def _launch(self, timeout: float) -> None:
        try:
            await self._fork_and_connect(time.monotonic() + timeout)
        except BaseException:
            await self._stop(polite=False)  # nothing half-started is left behind
            raise

    async def _fork_and_connect(self, deadline: float) -> None:
        request = await self._fork(deadline)
        self._kc = kc = AsyncKernelClient(connection_file=request["connection_file"])
        self._tracker = BlockTracker(kc, self)
        kc.load_connection_file()
        try:
            await wait_bound(_socket_files(kc), deadline, self._running)
            start_channels(kc)
            await wait_ready(kc, deadline, self._running)
        except NotReady as exc:
            detail = "it exited" if exc.died else "no answer within the start timeout"
            log = self._log_tail()
            detail += f"; its log ends:\n{log}" if log else ""
            raise KernelStartFailed(f"the forked kernel did not start: {detail}") from exc

    async def _fork(self, deadline: float) -> dict[str, Any]:
        """Ask this process's server for its interpreter, warm-up list and start variables for
        a kernel; the request made. A server stopped while it was asked may have forked the
        request's kernel before it ended: a new server gets a new request."""
        for attempt in (1, 2):
            request = self._request()
            left = max(deadline - time.monotonic(), 0.001)
            server = await _in_thread(_server, self.python, self.warm_up, left, self._env)
            self._server_pid = server.pid
            try:
                self._pid = await _in_thread(server.fork, request, left)
                return request
            except ServerStopped:
                if attempt == 2:
                    raise
                await self._stop(polite=False)
        raise AssertionError("unreachable")

    def _request(self) -> dict[str, Any]:
        # IPC sockets in a private folder, as for a local kernel: no TCP port, no other user.
        self._dir = tempfile.mkdtemp(prefix="kernelexec-fork-")
        mark_folder(self._dir)  # `kernelexec gc` removes it once this process is gone
        connection_file = os.path.join(self._dir, "kernel.json")
        write_connection_file(connection_file, transport="ipc", ip=os.path.join(self._dir, "k"))
        # The environment goes in a file of the private folder that the kernel reads and
        # deletes: were it in the request, its text (a token, a key) would stay in the server's
        # freed memory and be copied into every kernel forked after.
        env_file = os.path.join(self._dir, "env.json")
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self._env, f)
        return {
            "connection_file": connection_file,
            "cwd": str(self._work_dir),
            "env_file": env_file,
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
            await self._jail.kill_new_after_sigint(before, (self._pid,))

    async def restart(self, *, timeout: float) -> None:
        await self._stop(polite=False)  # state is lost either way
        await self._launch(timeout)

    async def is_alive(self) -> bool:
        return self._running()

    async def seems_gone(self) -> bool:
        return not self._running()  # one read of /proc/PID/stat

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
        return _alive(self._pid)

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
                await _in_thread(jail.close)
            folder, self._dir = self._dir, None
            if folder is not None:
                # A status is still to come only from a kernel just killed by a live server.
                reaped = pid is not None and _alive(self._server_pid)
                await _in_thread(_remove_folder, folder, reaped)


def _check_env(env: Mapping[str, str]) -> None:
    """What a process environment cannot hold, refused as ``subprocess`` refuses it for a local
    kernel, before any server is asked (the forked child would fail, further from the cause)."""
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"environment variables are strings: {name!r}={value!r}")
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"illegal environment variable name: {name!r}")
        if "\0" in value:
            raise ValueError(f"environment variable {name!r} holds a NUL character")


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread; here, when the interpreter is exiting and starts no
    more threads (an executor closed by its finalizer at exit must still clean up)."""
    loop = asyncio.get_running_loop()
    try:
        future = loop.run_in_executor(None, functools.partial(fn, *args))
    except RuntimeError:  # "cannot schedule new futures after shutdown"
        return fn(*args)
    return await future


def _alive(pid: int | None) -> bool:
    """Alive and not a zombie (the server reaps its children, but not instantly)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _remove_folder(folder: str, killed: bool) -> None:
    """The kernel's private folder. When its kernel was just killed, the server's reaper writes
    the exit status into it a moment later: that is waited for (briefly), so a file written
    after the removal cannot leave the folder behind."""
    status = os.path.join(folder, "exit-status")
    deadline = time.monotonic() + (1.0 if killed else 0.0)
    while not os.path.exists(status) and time.monotonic() < deadline:
        time.sleep(0.005)
    for _ in range(3):
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.exists(folder):
            return
        time.sleep(0.01)


def _socket_files(kc: AsyncKernelClient) -> list[str]:
    ports = (kc.shell_port, kc.iopub_port, kc.stdin_port, kc.control_port)
    return [f"{kc.ip}-{port}" for port in ports]


async def _wait_gone(pid: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):  # a zombie is gone too: its server may have ended before reaping it
            return
        await asyncio.sleep(0.01)
