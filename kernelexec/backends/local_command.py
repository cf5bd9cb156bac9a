"""Stateless back end: each block runs in a new local process.

The process is started in a session (and so a process group) of its own, with stdin closed. When
the block times out, or when the block's main process exits and leaves children behind, the whole
group is killed; we never wait for a child's descendants, which is how other executors hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._errors import BackendUnavailable
from .base import ByteSink, CommandBackend, CommandOutcome

_CHUNK = 64 * 1024
# After the main process ends, how long its pipes may stay open (grandchildren holding them)
# before the group is killed and reading stops.
_DRAIN_GRACE = 0.2


def resolve_python(python: str | os.PathLike[str] | None) -> str:
    """An interpreter path from a python executable, a virtualenv folder, or None (this one)."""
    if python is None:
        return sys.executable
    path = Path(python)
    if path.is_dir():
        for candidate in (path / "bin" / "python", path / "Scripts" / "python.exe"):
            if candidate.exists():
                return str(candidate)
        raise BackendUnavailable(f"no Python interpreter found in virtualenv {path}")
    found = shutil.which(str(python))
    if found is None:
        raise BackendUnavailable(f"Python interpreter not found: {python}")
    return found


class LocalCommand(CommandBackend):
    """Runs python blocks with an interpreter, shell blocks with bash, pwsh when installed."""

    kind = "local-command"

    def __init__(
        self,
        *,
        python: str | os.PathLike[str] | None = None,
        shell: str = "bash",
        kill_grace: float = 0.2,
    ) -> None:
        self.python = resolve_python(python)
        self.shell = shell
        self.kill_grace = kill_grace
        self._pwsh = shutil.which("pwsh")

    def supported_languages(self) -> Sequence[str]:
        return ("python", "shell", "powershell") if self._pwsh else ("python", "shell")

    def argv_for(self, language: str, code_path: str) -> list[str] | None:
        if language == "python":
            return [self.python, code_path]
        if language == "shell":
            return [self.shell, code_path]
        if language == "powershell" and self._pwsh:
            return [self._pwsh, "-NoProfile", "-NonInteractive", "-File", code_path]
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
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=work_dir,
                env=dict(env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise BackendUnavailable(f"cannot run {argv[0]}: {exc.strerror}") from exc
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            asyncio.create_task(_pump(proc.stdout, on_stdout)),
            asyncio.create_task(_pump(proc.stderr, on_stderr)),
        ]
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            timed_out = True
            await self._kill_group(proc)
        finally:
            # Children that outlived the block (and hold its pipes) die with it.
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
            await _finish_readers(readers)
        if timed_out:
            return CommandOutcome(exit_code=None, timed_out=True, killed_reason="timeout")
        return CommandOutcome(exit_code=proc.returncode)

    async def _kill_group(self, proc: asyncio.subprocess.Process) -> None:
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), self.kill_grace)
        _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _pump(stream: asyncio.StreamReader, sink: ByteSink) -> None:
    while chunk := await stream.read(_CHUNK):
        sink(chunk)


async def _finish_readers(readers: list[asyncio.Task[None]]) -> None:
    _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE)
    for task in pending:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
