"""Stateless back end at stateful speed: each Python block is a fresh process forked from a warm
interpreter that has already imported a warm-up list (numpy, pandas, matplotlib where installed).

Nothing a block does survives it: its process is new (forked from a spawner that never runs a
block itself), in a cgroup (or session) of its own that is emptied when it ends, with the work dir
as the command executor has it. What blocks share is what the spawner made before the first block:
the warm-up modules' import-time state (copy-on-write) and the interpreter's string hash seed.
numpy's global generator is reseeded in each block. Shell blocks run as ``LocalCommand`` runs them.

``sandbox=True`` (or ``SandboxOptions``) runs the spawner itself in a bubblewrap sandbox, as
``SandboxedCommand`` runs each block: every block forked from it is sandboxed too. The blocks
of one executor share that sandbox's namespaces, so the spawner empties it after each block
(every other process, the private ``/tmp`` and ``/dev/shm``, System V IPC objects). Shell blocks
then run as ``SandboxedCommand`` runs them, each in a fresh sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import signal
import socket
import struct
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._errors import BackendUnavailable
from . import _containment
from ._fontcache import font_lists
from ._sandbox import SandboxOptions, bwrap_argv, check_sandbox, give_to_sandbox, sandbox_options
from .base import ByteSink, CommandOutcome
from .local_command import (
    _DRAIN_GRACE,
    LocalCommand,
    _BlockProtocol,
    _Pipe,
    _same,
    _settle,
    _signal_group,
)

_SPAWNER = Path(__file__).resolve().parent.parent / "_resources" / "kernelexec_warm.py"
#: what the spawner imports before the first block, where installed
DEFAULT_WARM_UP = ("numpy", "pandas", "matplotlib", "matplotlib.pyplot")
# The spawner's own environment: unbuffered text as a block's (PYTHONUNBUFFERED is read only as
# an interpreter starts), figures off-screen while it imports pyplot.
_SPAWNER_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8", "MPLBACKEND": "Agg"}
_READY_TIMEOUT = 120.0  # a cold import of pandas and matplotlib on a loaded machine


class WarmCommand(LocalCommand):
    """Python blocks fork from a warm spawner; shell (and PowerShell) blocks start as usual.

    With cgroup containment the spawner lives in a cgroup made once for it, so each block is
    born inside (joining a cgroup per block waits for an RCU grace period, 5 to 20 ms); after a
    block everything in it but the spawner is killed. Elsewhere each block is a session of its
    own, killed as a group (a forked block is the spawner's child, not ours: the subreaper
    helper cannot hold it).
    """

    kind = "warm-command"

    def __init__(
        self,
        *,
        python: str | os.PathLike[str] | None = None,
        shell: str = "bash",
        kill_grace: float = 0.2,
        containment: str | None = None,
        warm_up: Sequence[str] | None = None,
        sandbox: bool | SandboxOptions | None = None,
    ) -> None:
        super().__init__(python=python, shell=shell, kill_grace=kill_grace, containment=containment)
        self.warm_up = tuple(DEFAULT_WARM_UP if warm_up is None else warm_up)
        #: the bubblewrap sandbox the spawner (and so every block) runs in, or None
        self.sandbox = sandbox_options(sandbox)
        if self.sandbox is not None:
            check_sandbox()
            self.inherits_host_env = False  # the block sees the executor's env only
        self._work_dir: Path | None = None
        cgroup = self.containment.startswith("cgroup")
        self.block_containment = self.containment if cgroup else "process-group"
        self._warm: _Spawner | None = None
        self._warm_jail: _containment.Jail | None = None  # the warm spawner's cgroup
        #: warm-up modules the spawner could not import (absent or broken), once started
        self.not_warmed: tuple[str, ...] = ()

    @property
    def pid(self) -> int | None:
        """The warm spawner's process id (None before start and after close)."""
        return self._warm.pid if self._warm is not None else None

    @property
    def spare_pid(self) -> int | None:
        """The process forked ahead for the next block (it waits, unused, until then)."""
        return self._warm.spare if self._warm is not None else None

    @property
    def helper_pids(self) -> set[int]:
        """This back end's own processes besides the spawner: the spare, and the resident
        spawner shell blocks start from."""
        resident = self._spawner.pid if self._spawner is not None else None
        return {pid for pid in (self.spare_pid, resident) if pid is not None}

    async def start(self, work_dir: Path) -> None:
        await super().start(work_dir)
        self._work_dir = work_dir
        await self._ensure_spawner()

    async def close(self) -> None:
        await self._drop_spawner()
        await super().close()

    async def _drop_spawner(self) -> None:
        spawner, self._warm = self._warm, None
        jail, self._warm_jail = self._warm_jail, None
        if spawner is not None:
            await spawner.close()
        if jail is not None:
            jail.close()  # what is left of the blocks, and the cgroup itself

    async def _ensure_spawner(self, env: Mapping[str, str] | None = None) -> _Spawner:
        view = self._sandbox_view(env)
        if self._warm is not None and self._warm.view != view:
            await self._drop_spawner()  # a sandbox that does not show the block's PYTHONPATH
        if self._warm is None or self._warm.gone:
            await self._drop_spawner()
            jail = None
            if self.block_containment.startswith("cgroup"):
                jail = _containment.make_jail(self.block_containment)
            try:
                if self.sandbox is not None:  # its font list: built once, off the event loop
                    await asyncio.to_thread(font_lists, self.python)
                argv, spawn_env = self._spawner_command(view)
                self._warm = await _Spawner.start(argv, self.warm_up, spawn_env, jail, view)
            except BaseException:
                if jail is not None:
                    jail.close()
                raise
            self._warm_jail = jail
            self.not_warmed = self._warm.failed
        return self._warm

    def _sandbox_view(self, env: Mapping[str, str] | None) -> tuple[str, ...]:
        """What the spawner's sandbox must show besides the interpreter: the absolute
        ``PYTHONPATH`` folders of the blocks' environment (none without a sandbox)."""
        if self.sandbox is None or env is None:
            return self._warm.view if self._warm is not None else ()
        folders = env.get("PYTHONPATH", "").split(os.pathsep)
        return tuple(sorted({p for p in folders if os.path.isabs(p)}))

    def _spawner_command(self, view: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
        """The spawner's command line and environment (bubblewrap's, when sandboxed)."""
        argv = [self.python, "-u", str(_SPAWNER)]
        if self.sandbox is None:
            return argv, {**os.environ, **_SPAWNER_ENV}
        assert self._work_dir is not None, "start() first"
        give_to_sandbox(self._work_dir, self.sandbox, also=self.sandbox.writable)
        # the spawner's own file (and the figure backend beside it) wherever kernelexec lives
        options = dataclasses.replace(
            self.sandbox, readable=[*self.sandbox.readable, str(_SPAWNER.parent)]
        )
        inner = {**_SPAWNER_ENV, "KX_WARM_SANDBOX": "1", "PYTHONPATH": os.pathsep.join(view)}
        wrapped = bwrap_argv(options, argv, work_dir=self._work_dir, env=inner, fonts=self.python)
        return wrapped, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

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
        if len(argv) != 2 or argv[0] != self.python:
            return await super().run(
                argv,
                work_dir=work_dir,
                env=env,
                timeout=timeout,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )
        spawner = await self._ensure_spawner(env)
        cgroup = self._warm_jail
        # in a sandbox the block's pid is the sandbox's, not ours: the spawner holds it
        jail = None
        if cgroup is None and self.sandbox is None:
            jail = _containment.make_jail("process-group")
        streams: _Streams | None = None
        pid: int | None = None
        try:
            request = {"code": str(work_dir / argv[1]), "cwd": str(work_dir), "env": dict(env)}
            streams = _Streams(asyncio.get_running_loop(), on_stdout, on_stderr)
            try:
                pid = await spawner.spawn(request, await streams.open())
            finally:
                streams.drop_write_ends()  # the block holds its own copies
            if jail is not None:
                jail.started(pid)
            exited = spawner.exit_of(pid)
            timed_out = not await _settle(exited, timeout)
            if timed_out:
                await self._kill(spawner, pid, exited)
            await _settle(streams.closed, _DRAIN_GRACE)
        finally:
            # every process of the block that outlived it dies with it
            if jail is not None:
                jail.close()
            elif isinstance(cgroup, _containment._CgroupJail) and self.sandbox is None:
                # the block itself, if it said its end, is killed already: freeing its memory
                # is the kernel's to finish, not a thing to wait for
                dying = pid if pid is not None and pid in spawner.dying else None
                cgroup.kill_others(keep={spawner.pid, spawner.spare, dying})
            if pid is not None:
                spawner.forget(pid)
            if streams is not None:
                await _settle(streams.closed, _DRAIN_GRACE)
                streams.close()
        streams.raise_sink_error()
        if timed_out:
            return CommandOutcome(exit_code=None, timed_out=True, killed_reason="timeout")
        return CommandOutcome(exit_code=exited.result())

    async def _kill(self, spawner: _Spawner, pid: int, exited: asyncio.Future[int]) -> None:
        for sig, wait in ((signal.SIGTERM, self.kill_grace), (signal.SIGKILL, 5.0)):
            if self.sandbox is None:
                _signal_group(pid, sig)
            else:
                spawner.signal(pid, sig)
            await _settle(exited, wait)
        if not exited.done() and self.sandbox is not None:
            await self._drop_spawner()  # a spawner that does not answer goes, sandbox and all


class _Spawner:
    """The warm interpreter: requests go over a Unix socket (with the block's pipes), answers
    come back as JSON lines on its stdout."""

    def __init__(
        self, process: asyncio.subprocess.Process, sock: socket.socket, view: tuple[str, ...]
    ) -> None:
        self.view = view  # the PYTHONPATH folders its sandbox shows
        self._process = process
        self._sock = sock
        self._pids: asyncio.Queue[int | BaseException] = asyncio.Queue()
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.failed: tuple[str, ...] = ()
        self.gone = False
        self.pid = process.pid
        self.spare: int | None = None
        #: blocks that said their end (killed since, the kernel freeing their memory)
        self.dying: set[int] = set()

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        modules: Sequence[str],
        env: Mapping[str, str],
        jail: _containment.Jail | None,
        view: tuple[str, ...] = (),
    ) -> _Spawner:
        """Start the spawner, ``argv`` (in ``jail``'s cgroup, joined before it runs anything)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spawn = jail.popen_kwargs() if jail is not None else {"start_new_session": True}
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                str(theirs.fileno()),
                *modules,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=dict(env),
                cwd="/",
                **spawn,  # a session of its own: a Ctrl-C at the terminal is for the host
            )
        except OSError as exc:
            ours.close()
            raise BackendUnavailable(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
        finally:
            theirs.close()
            if jail is not None:
                jail.started(0)
        spawner = cls(process, ours, view)
        await spawner._ready()
        return spawner

    async def _ready(self) -> None:
        assert self._process.stdout is not None
        try:
            line = await asyncio.wait_for(self._process.stdout.readline(), _READY_TIMEOUT)
        except asyncio.TimeoutError:
            line = b""
        if not line:
            await self.close()
            raise BackendUnavailable("the warm spawner did not start")
        self.failed = tuple(json.loads(line).get("failed", ()))
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._process.stdout is not None
        while line := await self._process.stdout.readline():
            answer: dict[str, Any] = json.loads(line)
            if "pid" in answer:
                self._exits[answer["pid"]] = asyncio.get_running_loop().create_future()
                self._pids.put_nowait(answer["pid"])
            elif "spare" in answer:  # the process forked ahead for the next block
                self.spare = int(answer["spare"])
            elif "exit" in answer:
                future = self._exits.get(answer["exit"])  # taken by exit_of()
                if future is not None and not future.done():
                    if answer.get("early"):  # killed by the spawner, its memory being freed
                        self.dying.add(answer["exit"])
                    future.set_result(answer["code"])
            else:
                self._pids.put_nowait(BackendUnavailable(f"warm spawner: {answer.get('error')}"))
        self._end(BackendUnavailable("the warm spawner ended"))

    def _end(self, error: BaseException) -> None:
        self.gone = True
        self._pids.put_nowait(error)
        for future in self._exits.values():
            if not future.done():
                future.set_exception(error)
        self._exits.clear()

    async def spawn(self, request: dict[str, Any], fds: tuple[int, int]) -> int:
        """Fork the block's process with ``fds`` as its stdout and stderr; its pid."""
        if self.gone:
            raise BackendUnavailable("the warm spawner ended")
        data = json.dumps(request).encode()
        try:  # the pipes ride on the length; the document follows on the stream
            socket.send_fds(self._sock, [struct.pack("!I", len(data))], list(fds))
            self._sock.sendall(data)
        except OSError as exc:
            raise BackendUnavailable(f"the warm spawner is gone: {exc}") from exc
        answer = await self._pids.get()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def signal(self, pid: int, sig: signal.Signals) -> None:
        """Have the spawner signal block ``pid``'s process group (the sandbox's pid)."""
        data = json.dumps({"signal": pid, "number": int(sig)}).encode()
        with contextlib.suppress(OSError):  # gone: so is the block
            self._sock.sendall(struct.pack("!I", len(data)) + data)

    def exit_of(self, pid: int) -> asyncio.Future[int]:
        """The exit status of the block process ``pid`` as ``subprocess`` gives it."""
        future = self._exits.get(pid)
        if future is None:  # the spawner ended between its two answers
            future = asyncio.get_running_loop().create_future()
            future.set_exception(BackendUnavailable("the warm spawner ended"))
        return future

    def forget(self, pid: int) -> None:
        """The block ``pid`` is over: its status is no longer wanted."""
        self._exits.pop(pid, None)
        self.dying.discard(pid)

    async def close(self) -> None:
        self.gone = True
        self._sock.close()  # end of requests: the spawner exits
        if self._process.returncode is None:
            try:
                await asyncio.wait_for(self._process.wait(), 2.0)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
                await self._process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


class _Streams:
    """The block's stdout and stderr pipes, read as they are written, through
    ``LocalCommand``'s protocol (the sinks, a sink's error, "pipes closed")."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_stdout: ByteSink, on_stderr: ByteSink
    ) -> None:
        self._loop = loop
        self._block = _BlockProtocol(loop, on_stdout, on_stderr)
        self.closed: asyncio.Future[None] = self._block.pipes_closed
        self._transports: list[asyncio.BaseTransport] = []
        self._pending: list[tuple[int, _Pipe]] = []
        self._write: list[int] = []
        for fd in (1, 2):
            read, write = os.pipe()
            self._pending.append((read, _Pipe(self._block, fd)))
            self._write.append(write)

    async def open(self) -> tuple[int, int]:
        """Start reading; the write ends, for the block (the caller closes them)."""
        for read, reader in self._pending:
            pipe = os.fdopen(read, "rb", buffering=0)
            transport, _ = await self._loop.connect_read_pipe(
                functools.partial(_same, reader), pipe
            )
            self._transports.append(transport)
        self._pending = []
        out, err = self._write
        return out, err

    def drop_write_ends(self) -> None:
        write, self._write = self._write, []
        for fd in write:
            os.close(fd)

    def close(self) -> None:
        for transport in self._transports:
            transport.close()
        for read, _ in self._pending:  # never opened: the spawn failed first
            os.close(read)
        self.drop_write_ends()

    def raise_sink_error(self) -> None:
        self._block.raise_sink_error()
