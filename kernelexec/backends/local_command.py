"""Stateless back end: each block runs in a new local process.

The process is started in a session (and so a process group) of its own, with stdin closed, and
inside a jail (``_containment``: a cgroup, a subreaper, or the process group alone). With a
cgroup, one is made per back end and a resident spawner inside it starts every block (born
inside, so no block pays the move into a cgroup; what a block leaves running is killed at its
end, the spawner spared). When the
block times out, or when the block's main process exits and leaves processes behind, everything
in the jail is killed, including what left the session (``setsid``, a double fork,
``nohup ... &``); we never wait for a child's descendants, which is how other executors hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._errors import BackendUnavailable
from . import _containment
from ._resident import Spawner
from .base import ByteSink, CommandBackend, CommandOutcome

# After the main process ends, how long its pipes may stay open (grandchildren holding them)
# before the group is killed and reading stops.
_DRAIN_GRACE = 0.2


def _deno() -> str | None:
    """Deno on PATH, or the one the ``deno`` wheel put beside this interpreter."""
    beside = Path(sys.executable).with_name("deno")
    return shutil.which("deno") or (str(beside) if os.access(beside, os.X_OK) else None)


def resolve_python(python: str | os.PathLike[str] | None) -> str:
    """An absolute interpreter path from a python executable, a virtualenv folder, or None.

    A relative path is relative to the caller's current directory now, not to the work dir the
    block later runs in. Symlinks are kept: a virtualenv's ``python`` is one, and resolving it
    would leave the virtualenv.
    """
    if python is None:
        return sys.executable
    path = Path(python)
    if path.is_dir():
        for candidate in (path / "bin" / "python", path / "Scripts" / "python.exe"):
            if candidate.exists():
                return os.path.abspath(candidate)
        raise BackendUnavailable(f"no Python interpreter found in virtualenv {path}")
    found = shutil.which(str(python))
    if found is None:
        raise BackendUnavailable(f"Python interpreter not found: {python}")
    return os.path.abspath(found)


class LocalCommand(CommandBackend):
    """Runs python blocks with an interpreter, shell blocks with bash, pwsh when installed."""

    kind = "local-command"

    def __init__(
        self,
        *,
        python: str | os.PathLike[str] | None = None,
        shell: str = "bash",
        kill_grace: float = 0.2,
        containment: str | None = None,
    ) -> None:
        self.python = resolve_python(python)
        self.shell = shell
        self.kill_grace = kill_grace
        #: how a block's processes are held: "cgroup", "cgroup-v2", "cgroup-v1", "subreaper" or
        #: "process-group" (``containment=`` or ``$KERNELEXEC_CONTAINMENT``; "auto": best here)
        self.containment = _containment.mechanism(containment)
        self._pwsh = shutil.which("pwsh")
        self._rscript = shutil.which("Rscript")
        self._deno = _deno()
        # cgroup containment: a resident spawner in a cgroup made once (see ``_resident``)
        self._spawner: Spawner | None = None

    @property
    def pid(self) -> int | None:
        """The resident spawner's pid (cgroup containment, once a block has run), else None:
        the one process of this back end that outlives a block, until ``close()``."""
        return self._spawner.pid if self._spawner is not None else None

    def supported_languages(self) -> Sequence[str]:
        found = {
            "powershell": self._pwsh,
            "r": self._rscript,
            "javascript": self._deno,
            "typescript": self._deno,
        }
        return ("python", "shell", *(language for language, path in found.items() if path))

    def argv_for(self, language: str, code_path: str) -> list[str] | None:
        if language == "python":
            return [self.python, code_path]
        if language == "shell":
            return [self.shell, code_path]
        if language == "powershell" and self._pwsh:
            return [self._pwsh, "-NoProfile", "-NonInteractive", "-File", code_path]
        if language == "r" and self._rscript:
            return [self._rscript, "--no-save", "--no-restore", code_path]
        if language in ("javascript", "typescript") and self._deno:
            # All permissions: a Python block has them all too; Deno's prompt for a missing
            # one would wait for a terminal that is not there. The file's suffix picks JS/TS.
            # NO_COLOR: an error's text without ANSI colours (Deno has no flag for it).
            return ["env", "NO_COLOR=1", self._deno, "run", "--allow-all", "--no-prompt", code_path]
        return None

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
        spawner = self._take_spawner()
        if spawner is not None:
            try:
                return await self._run_resident(
                    spawner, argv, work_dir, env, timeout, on_stdout, on_stderr
                )
            finally:
                spawner.busy = False
        loop = asyncio.get_running_loop()
        if self.containment == "subreaper" and shutil.which(argv[0], path=env.get("PATH")) is None:
            # the helper would report it only as exit status 127
            raise BackendUnavailable(f"cannot run {argv[0]}: No such file or directory")
        jail = _containment.make_jail(self.containment)
        try:
            transport, proto = await loop.subprocess_exec(
                lambda: _BlockProtocol(loop, on_stdout, on_stderr),
                *jail.wrap(argv),
                cwd=work_dir,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                **jail.popen_kwargs(),
            )
        except OSError as exc:  # interpreter missing or not executable
            jail.close()
            raise BackendUnavailable(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
        except BaseException:
            jail.close()
            raise
        pid = transport.get_pid()
        jail.started(pid)
        timed_out = False
        try:
            timed_out = not await _settle(proto.exited, timeout)
            if timed_out:
                await self._kill_group(pid, proto)
            # Pipes close when their last holder exits; a child that outlived the block keeps
            # them open, so wait only briefly before killing the group below.
            await _settle(proto.pipes_closed, _DRAIN_GRACE)
        finally:
            # Every process of the block that outlived it dies with it, in its session or not.
            jail.close()
            await _settle(proto.pipes_closed, _DRAIN_GRACE)
            transport.close()
        proto.raise_sink_error()
        if timed_out:
            return CommandOutcome(exit_code=None, timed_out=True, killed_reason="timeout")
        return CommandOutcome(exit_code=transport.get_returncode())

    def _take_spawner(self) -> Spawner | None:
        """The resident spawner, started if need be; None when there is none to use (another
        containment, a block already running on it, or it cannot start): a jail per block."""
        if not self.containment.startswith("cgroup"):
            return None
        if self._spawner is not None and not self._spawner.alive():
            self._spawner.close()  # a block killed it: a new one, in a new cgroup
            self._spawner = None
        if self._spawner is None:
            try:
                self._spawner = Spawner(self.containment)
            except (OSError, BackendUnavailable):
                return None
        if self._spawner.busy:
            return None
        self._spawner.busy = True
        return self._spawner

    async def _run_resident(
        self,
        spawner: Spawner,
        argv: Sequence[str],
        work_dir: Path,
        env: Mapping[str, str],
        timeout: float,
        on_stdout: ByteSink,
        on_stderr: ByteSink,
    ) -> CommandOutcome:
        loop = asyncio.get_running_loop()
        proto = _BlockProtocol(loop, on_stdout, on_stderr)
        status = _Status(loop, proto, argv[0])
        transports: list[asyncio.ReadTransport] = []
        readers: list[tuple[io.FileIO, asyncio.Protocol]] = []
        write_ends: list[int] = []
        try:
            try:
                for protocol in (status, _Pipe(proto, 1), _Pipe(proto, 2)):
                    read_end, write_end = os.pipe()
                    write_ends.append(write_end)
                    readers.append((io.FileIO(read_end, "rb"), protocol))
                spawner.spawn(argv, cwd=work_dir, env=env, fds=write_ends)
            finally:
                for fd in write_ends:  # the spawner has its copies now
                    os.close(fd)
            while readers:
                pipe, reader = readers.pop(0)
                transport, _ = await loop.connect_read_pipe(functools.partial(_same, reader), pipe)
                transports.append(transport)
            if not await _settle(status.started, timeout):
                # The spawner does not answer (a block stopped it): it goes, with its cgroup
                # and all in it; the next block gets a new one.
                spawner.close()
                for transport in transports:
                    transport.close()
                return CommandOutcome(exit_code=None, timed_out=True, killed_reason="timeout")
            pid = status.started.result()
        except BaseException:
            spawner.sweep()
            for pipe, _ in readers:
                pipe.close()
            for transport in transports:
                transport.close()
            raise
        timed_out = False
        try:
            timed_out = not await _settle(proto.exited, timeout)
            if timed_out:
                await self._kill_group(pid, proto)
            await _settle(proto.pipes_closed, _DRAIN_GRACE)
        finally:
            spawner.sweep()  # whatever the block left running dies with it
            await _settle(proto.pipes_closed, _DRAIN_GRACE)
            for transport in transports:
                transport.close()
        proto.raise_sink_error()
        if timed_out:
            return CommandOutcome(exit_code=None, timed_out=True, killed_reason="timeout")
        return CommandOutcome(exit_code=status.exit_code)

    async def close(self) -> None:
        if self._spawner is not None:
            self._spawner.close()
            self._spawner = None

    async def _kill_group(self, pid: int, proto: _BlockProtocol) -> None:
        _signal_group(pid, signal.SIGTERM)
        await _settle(proto.exited, self.kill_grace)
        _signal_group(pid, signal.SIGKILL)
        await _settle(proto.exited, 5)


class _BlockProtocol(asyncio.SubprocessProtocol):
    """Feeds the pipes' bytes to the sinks and tells apart "process exited" from "pipes closed".

    ``asyncio.subprocess.Process.wait()`` returns only once every pipe is closed as well (so on
    Python 3.11, at least), so a grandchild holding stdout would make it wait for that grandchild:
    the hang this back end exists to avoid. A protocol sees the two events separately.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_stdout: ByteSink, on_stderr: ByteSink
    ) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._sinks = {1: on_stdout, 2: on_stderr}
        self._open = {1, 2}
        self._sink_error: BaseException | None = None

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        if self._sink_error is not None:
            return
        try:
            self._sinks[fd](data if isinstance(data, bytes) else data.encode())
        except Exception as exc:  # re-raised by run(), after the process is dealt with
            self._sink_error = exc

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open:
            _resolve(self.pipes_closed)

    def process_exited(self) -> None:
        _resolve(self.exited)

    def raise_sink_error(self) -> None:
        if self._sink_error is not None:
            raise self._sink_error


class _Pipe(asyncio.Protocol):
    """One of the block's output pipes, read by the host (the spawner started the block)."""

    def __init__(self, block: _BlockProtocol, fd: int) -> None:
        self._block, self._fd = block, fd

    def data_received(self, data: bytes) -> None:
        self._block.pipe_data_received(self._fd, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._block.pipe_connection_lost(self._fd, exc)


class _Status(asyncio.Protocol):
    """The spawner's replies about one block: ``pid N`` (or ``error TEXT``), then ``exit CODE``."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, block: _BlockProtocol, program: str
    ) -> None:
        self.started: asyncio.Future[int] = loop.create_future()
        # Killed by SIGKILL unless told otherwise: the spawner died (a block killed it) before
        # it could say, and the block's processes were killed with its cgroup.
        self.exit_code = -signal.SIGKILL
        self._block, self._program = block, program
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            word, _, rest = line.decode(errors="replace").partition(" ")
            if word == "pid" and not self.started.done():
                self.started.set_result(int(rest))
            elif word == "error" and not self.started.done():
                self.started.set_exception(
                    BackendUnavailable(f"cannot run {self._program}: {rest}")
                )
            elif word == "exit":
                self.exit_code = int(rest)
                self._block.process_exited()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.started.done():
            self.started.set_exception(BackendUnavailable("the block's spawner exited"))
        self._block.process_exited()


def _same(protocol: asyncio.Protocol) -> asyncio.Protocol:
    return protocol


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _settle(future: asyncio.Future[Any], timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``future``; True if it completed (never cancels it)."""
    if not future.done():
        await asyncio.wait([future], timeout=timeout)
    return future.done()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
