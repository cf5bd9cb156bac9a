"""Local kernels: a jupyter_client ``AsyncKernelManager`` and its ``AsyncKernelClient``.

The kernel is any installed kernelspec (``python3`` by default) or, given ``python=``, that
interpreter (or virtualenv) running ``ipykernel_launcher``. jupyter_client starts it in a session
of its own, so interrupts reach the whole process group. It also runs in a jail of its own
(``_containment``: a cgroup, a subreaper, or the process group alone): on ``restart()`` and
``shutdown()`` everything in the jail is killed, including what a block started in a new session
(``setsid``, a double fork, ``nohup ... &``), and the cgroup is removed.

The kernel process's own stdout and stderr (``os.write(1, ...)``, a child process's output,
ipykernel's echo of captured output) never reach the host's: stdout goes to /dev/null, stderr to
``kernel.log`` in its private runtime dir. A host whose stdout is a protocol channel stays
clean. What a block prints still reaches its result through the messaging protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager

from .._door import read_regular
from .._errors import BackendUnavailable, KernelStartFailed
from . import _containment
from ._fork_server import KERNEL_ARGS
from ._iopub import BatchingClient
from ._owner import mark_folder
from ._ready import NotReady, start_channels, wait_ready
from .base import KernelBackend, KernelClientLike
from .local_command import resolve_python

_SHUTDOWN_WAIT = 3.0  # seconds a kernel gets to exit after a shutdown request, then it is killed


class _InterpreterSpecs(KernelSpecManager):
    """Serves one kernelspec: ``ipykernel_launcher`` under a given interpreter."""

    def __init__(self, python: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._spec = KernelSpec(
            argv=[python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name=f"Python ({python})",
            language="python",
            interrupt_mode="signal",
        )

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return self._spec


class _WrappedSpecs(KernelSpecManager):
    """Serves another manager's kernelspecs with their argv run through a jail's ``wrap``."""

    def __init__(self, base: KernelSpecManager, wrap: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._base, self._wrap = base, wrap

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        with warnings.catch_warnings():
            # bash_kernel's spec has a "codemirror_mode" key, which traitlets warns about
            warnings.simplefilter("ignore", DeprecationWarning)
            spec = self._base.get_kernel_spec(kernel_name)
        argv = list(spec.argv)
        if argv and argv[0] in {"python", "python3", f"python3.{sys.version_info[1]}"}:
            argv[0] = sys.executable  # as jupyter_client does for a bare "python"
        fields = spec.to_dict()
        fields["argv"] = self._wrap(argv)
        if _is_deno(argv):
            # SIGINT kills Deno's kernel (state lost, told as a death); an interrupt_request
            # stops a busy loop and keeps the kernel (checked with Deno 2.9).
            fields["interrupt_mode"] = "message"
        return KernelSpec(resource_dir=spec.resource_dir, **fields)


def _is_deno(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]) == "deno" and "jupyter" in argv[1:2]


def _speaks_ipc(km: AsyncKernelManager) -> bool:
    """Whether the kernel binds IPC sockets: IPython kernels (ipykernel and kernels built on
    it, such as bash_kernel) do; a missing kernelspec is left for ``start_kernel`` to report."""
    try:
        spec = km.kernel_spec
    except NoSuchKernel:
        return True
    return spec is None or spec.language == "python" or "ipykernel" in " ".join(spec.argv)


def _ipykernel_args(km: AsyncKernelManager) -> list[str]:
    """kernelexec's changes to ipykernel's defaults (``_fork_server.KERNEL_ARGS``: the input
    history in memory, one sqlite write less per block), for IPython kernels only: another
    kernelspec's program would not know the options."""
    spec = km.kernel_spec
    argv = " ".join(spec.argv) if spec is not None else ""
    return list(KERNEL_ARGS) if "ipykernel" in argv else []


class BlockOwner(Protocol):
    """A back end whose jail's processes a ``BlockTracker`` notes at each block's start."""

    _block_pids: set[_containment.Member] | None

    def _jail_pids(self) -> set[_containment.Member]: ...


class BlockTracker(BatchingClient):
    """The kernel client, noting which block (a non-silent execute request) is running.

    A block starts when its request is sent and ends with the kernel's ``idle`` status for it;
    the jail's processes at the start are noted, so an interrupt can tell the block's own
    processes from those earlier blocks left running on purpose (a server, say).
    """

    def __init__(self, kc: AsyncKernelClient, owner: BlockOwner) -> None:
        super().__init__(kc)
        self._owner = owner
        self._msg_id: str | None = None

    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool | None = None,
        stop_on_error: bool = True,
    ) -> str:
        before = None if silent else self._owner._jail_pids()
        msg_id = super().execute(
            code, silent, store_history, user_expressions, allow_stdin, stop_on_error
        )
        if before is not None:
            self._msg_id, self._owner._block_pids = msg_id, before
        return msg_id

    def _seen(self, msg: dict[str, Any]) -> None:
        if (
            self._msg_id is not None
            and msg.get("msg_type") == "status"
            and msg.get("content", {}).get("execution_state") == "idle"
            and msg.get("parent_header", {}).get("msg_id") == self._msg_id
        ):
            self._msg_id, self._owner._block_pids = None, None


class LocalKernel(KernelBackend):
    """A kernel process on this machine."""

    kind = "local-kernel"

    def __init__(
        self,
        *,
        kernel_name: str = "python3",
        python: str | os.PathLike[str] | None = None,
        shutdown_wait: float = _SHUTDOWN_WAIT,
        containment: str | None = None,
    ) -> None:
        self.kernel_name = kernel_name
        self.python = None if python is None else resolve_python(python)
        self.shutdown_wait = shutdown_wait
        #: how the kernel's processes are held, as for ``LocalCommand.containment``
        self.containment = _containment.mechanism(containment)
        self._jail: _containment.Jail | None = None
        self._tracker: BlockTracker | None = None
        self._kernel_pid: int | None = None  # under the subreaper helper, once known
        #: the jail's processes when the running block started (None: no block runs)
        self._block_pids: set[_containment.Member] | None = None
        self._km: AsyncKernelManager | None = None
        self._kc: AsyncKernelClient | None = None
        self._pgid: int | None = None
        self._work_dir: Path | None = None
        self._env: dict[str, str] = {}
        self._ipc_dir: str | None = None

    @property
    def client(self) -> KernelClientLike:
        if self._kc is None or self._tracker is None:
            raise KernelStartFailed("the kernel is not running")
        return self._tracker

    def _jail_pids(self) -> set[_containment.Member]:
        return set() if self._jail is None else self._jail.members()

    @property
    def pid(self) -> int | None:
        """The kernel process id (None when no kernel runs).

        Under the subreaper helper, the helper's first child (the helper is what
        jupyter_client started; processes re-parented to it later are younger).
        """
        launched = self._launched_pid()
        if launched is None or self.containment != "subreaper":
            return launched
        if self._kernel_pid is None:
            self._kernel_pid = _containment.first_child(launched)
        return self._kernel_pid or launched

    def _launched_pid(self) -> int | None:
        provisioner = getattr(self._km, "provisioner", None)
        pid: int | None = getattr(provisioner, "pid", None)
        return pid

    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        if self.python is not None:
            await _check_ipykernel(self.python)
        self._work_dir, self._env = work_dir, dict(env)
        await self._launch(timeout)

    async def _launch(self, timeout: float) -> None:
        try:
            await self._start_kernel()
            await self._connect(timeout)
        except BaseException:
            await self._stop(now=True)  # nothing half-started is left behind
            raise

    async def _start_kernel(self) -> None:
        assert self._work_dir is not None
        self._jail = jail = _containment.make_jail(self.containment)
        self._km = km = self._manager(jail)
        assert self._ipc_dir is not None
        # The kernel's own fds 1 and 2 never reach the host's. What a block writes there reaches
        # its result through ipykernel's capture, which also echoes it to the original fd: fd 1
        # goes nowhere (a flood must not fill a disk), fd 2 to a log (why a kernel failed).
        log = os.open(self._log_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            await km.start_kernel(
                cwd=str(self._work_dir),
                env=self._env,
                extra_arguments=_ipykernel_args(km),
                stdout=subprocess.DEVNULL,
                stderr=log,
                **jail.popen_kwargs(),
            )
        except NoSuchKernel as exc:
            raise KernelStartFailed(f"no kernelspec named {self.kernel_name!r}") from exc
        except (OSError, RuntimeError) as exc:
            raise KernelStartFailed(f"the kernel did not start: {exc}") from exc
        finally:
            os.close(log)
            jail.started(self._launched_pid() or 0)
        self._pgid = getattr(km.provisioner, "pgid", None)

    def _log_path(self) -> str:
        assert self._ipc_dir is not None
        return os.path.join(self._ipc_dir, "kernel.log")

    def _log_tail(self) -> str:
        """The last line the kernel wrote to its log (why it failed to start, usually)."""
        if self._ipc_dir is None:
            return ""
        lines = log_end(self._log_path()).splitlines()
        return lines[-1].strip() if lines else ""

    async def _connect(self, timeout: float) -> None:
        assert self._km is not None
        self._kc = kc = self._km.client()
        self._tracker = BlockTracker(kc, self)
        start_channels(kc)
        try:
            await kc.wait_for_ready(timeout=timeout)
        except (RuntimeError, TimeoutError) as exc:
            reason = self.death_reason()
            detail = f"it exited ({reason})" if reason else f"no answer within {timeout:g} s"
            tail = self._log_tail()
            if reason and tail:
                detail += f": {tail}"
            raise KernelStartFailed(f"the kernel did not start: {detail}") from exc
        if self._km.transport == "tcp":
            # A TCP subscription joins late: jupyter_client's wait can end before IOPub is live,
            # and Deno's first block then lost its result. Ready once an idle status came too.
            alive = lambda: self.death_reason() is None  # noqa: E731
            try:
                await wait_ready(kc, time.monotonic() + timeout, alive)
            except NotReady as exc:
                raise KernelStartFailed(f"the kernel did not start: {exc}") from exc

    def _manager(self, jail: _containment.Jail) -> AsyncKernelManager:
        # IPC sockets in a private folder: nothing listens on a TCP port, and no other local
        # user can connect (ipykernel warns about unencrypted TCP otherwise).
        self._ipc_dir = tempfile.mkdtemp(prefix="kernelexec-ipc-")
        mark_folder(self._ipc_dir)  # `kernelexec gc` removes it once this process is gone
        options: dict[str, Any] = {"transport": "ipc", "ip": os.path.join(self._ipc_dir, "k")}
        if self.python is None:
            specs: KernelSpecManager = _WrappedSpecs(KernelSpecManager(), jail.wrap)
            km = AsyncKernelManager(
                kernel_name=self.kernel_name, kernel_spec_manager=specs, **options
            )
        else:
            specs = _WrappedSpecs(_InterpreterSpecs(self.python), jail.wrap)
            km = AsyncKernelManager(
                kernel_name="kernelexec-python", kernel_spec_manager=specs, **options
            )
        km.shutdown_wait_time = self.shutdown_wait
        if not _speaks_ipc(km):
            # IRkernel and Deno build "transport://ip:port" themselves and cannot bind an IPC
            # path (Deno: "invalid host"): they get TCP on the loopback, with the session's key.
            km.transport, km.ip = "tcp", "127.0.0.1"
        return km

    @property
    def runs_other_kernels(self) -> bool:
        # A subclass confines its kernel (a sandbox): a plain sibling would escape that.
        return type(self) is LocalKernel

    def other_kernel(self, kernel_name: str) -> KernelBackend | None:
        if not self.runs_other_kernels:
            return None
        return LocalKernel(
            kernel_name=kernel_name, shutdown_wait=self.shutdown_wait, containment=self.containment
        )

    async def interrupt(self) -> None:
        """SIGINT to the kernel's process group; and SIGKILL to every process the running block
        started that still runs (in the kernel's session or not). What earlier blocks started
        is left alone: the kernel keeps it, as it keeps their variables."""
        if self._km is not None:
            with contextlib.suppress(RuntimeError, OSError):
                await self._km.interrupt_kernel()
        before = self._block_pids
        if before is not None and self._jail is not None:
            await self._jail.kill_new_after_sigint(before, (self._launched_pid(), self.pid))

    async def restart(self, *, timeout: float) -> None:
        # A fresh manager and client, not jupyter_client's in-place restart: no stale messages
        # and no port reuse races. State is lost either way; so the old kernel is killed.
        await self._stop(now=True)
        await self._launch(timeout)

    async def is_alive(self) -> bool:
        return self._km is not None and bool(await self._km.is_alive())

    async def seems_gone(self) -> bool:
        return not await self.is_alive()  # a poll() of the kernel's process: no I/O

    def death_reason(self) -> str | None:
        process = getattr(getattr(self._km, "provisioner", None), "process", None)
        code = None if process is None else process.poll()
        if code is None:
            return None
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by signal {signal.Signals(-code).name}"
        return f"exit status {code}"

    async def shutdown(self) -> None:
        await self._stop(now=False)

    async def _stop(self, *, now: bool) -> None:
        kc, self._kc = self._kc, None
        self._tracker, self._block_pids, self._kernel_pid = None, None, None
        km, self._km = self._km, None
        pgid, self._pgid = self._pgid, None
        jail, self._jail = self._jail, None
        try:
            if kc is not None:
                kc.stop_channels()
            if jail is not None:
                # The kernel and everything it started, in its session or not, all at once;
                # the manager then finds the kernel gone and only cleans up.
                jail.close()
            if km is not None:
                await _shutdown_manager(km, now=now)
        finally:
            if pgid is not None:
                # Whatever the block started (a forked child, a server) goes with the kernel.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            ipc_dir, self._ipc_dir = self._ipc_dir, None
            if ipc_dir is not None:
                shutil.rmtree(ipc_dir, ignore_errors=True)


async def _shutdown_manager(km: AsyncKernelManager, *, now: bool) -> None:
    try:
        if await km.is_alive():
            await km.shutdown_kernel(now=now)
        else:
            await km.cleanup_resources()
    except (RuntimeError, OSError):
        # The polite path failed (e.g. the control channel is gone): kill, then clean up.
        with contextlib.suppress(RuntimeError, OSError):
            await km.shutdown_kernel(now=True)
    finally:
        context = getattr(km, "context", None)
        if context is not None and not context.closed:
            context.destroy(linger=0)


async def _check_ipykernel(python: str) -> None:
    """Fail early and clearly when the interpreter cannot run a kernel at all."""
    proc = await asyncio.create_subprocess_exec(
        python,
        "-c",
        "import ipykernel",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        detail = err.decode(errors="replace").strip().splitlines()[-1:] or ["unknown error"]
        raise BackendUnavailable(
            f"{python} cannot run an IPython kernel ({detail[0]}); install ipykernel there"
        )


def log_end(path: str, limit: int = 2000) -> str:
    """The last ``limit`` bytes of a kernel's log, stripped ('' if it cannot be read). Read as
    enemy data: a sandboxed kernel's fork writes its log in a folder its code can write, where
    a link (to a host file the error would quote) or a FIFO (the host would hang) can stand."""
    data = read_regular(path, limit=limit, tail=True)
    return "" if data is None else data.decode(errors="replace").strip()
