"""The local back ends inside a bubblewrap sandbox (see ``_sandbox``).

``SandboxedCommand`` runs each block's process in a fresh sandbox; ``SandboxedKernel`` runs the
kernel process in one for its whole life. Both get only the executor's own environment (no host
secrets), see the host read-only (homes and runtime dirs hidden), write only their work dir (and
a kernel its runtime folder), have no network unless ``SandboxOptions(network=True)``, have a pid
namespace of their own (when the sandbox ends, every process a block started ends with it), and
hold no host right: a root host's code runs as an unprivileged user with no capability.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from .._errors import KernelStartFailed
from .._types import NetworkEvent
from ._containment import Jail
from ._egress import Egress, install_packages, sandbox_argv, sandbox_dns, sandbox_environment
from ._fontcache import copy_into, font_lists
from ._sandbox import (
    SandboxOptions,
    bwrap_argv,
    check_sandbox,
    give_to_sandbox,
    host_is_root,
    take_back,
)
from ._sandbox_bridge import BRIDGE_SCRIPT, INTERRUPT_SUFFIX, KERNEL_FILE
from .base import ByteSink, CommandOutcome, KernelBackend
from .local_command import LocalCommand
from .local_kernel import LocalKernel


class SandboxedCommand(LocalCommand):
    """``LocalCommand`` with every block in a bubblewrap sandbox."""

    kind = "sandboxed-command"
    inherits_host_env = False  # the block sees the executor's env, not the host's secrets

    def __init__(self, *, sandbox: SandboxOptions | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.sandbox = sandbox or SandboxOptions()
        self._egress = _Egress(self.sandbox)
        check_sandbox()

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
        give_to_sandbox(work_dir, self.sandbox, also=self.sandbox.writable)
        await self._egress.install(work_dir, sys.executable)
        egress = self._egress.get()
        if egress is not None:
            argv = sandbox_argv(egress, list(argv), sys.executable)
            env = sandbox_environment(egress, env)
        readable = [egress.folder] if egress is not None else []
        dns = sandbox_dns(egress) if egress is not None else {}
        await asyncio.to_thread(font_lists, sys.executable)  # built once, off the event loop
        wrapped = bwrap_argv(
            self.sandbox,
            argv,
            work_dir=work_dir,
            env=env,
            readable=readable,
            fonts=sys.executable,
            **dns,
        )
        return await super().run(
            wrapped,
            work_dir=work_dir,
            env=_launcher_env(),
            timeout=timeout,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )

    async def take_network_log(self) -> list[NetworkEvent]:
        return await self._egress.take()

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            self._egress.close()


class _Egress:
    """A sandboxed back end's egress proxy (``network=NetworkPolicy``), made on first use."""

    def __init__(self, options: SandboxOptions) -> None:
        self._options = options
        self._policy = options.egress_policy
        self._egress: Egress | None = None
        self._installed = False

    def get(self) -> Egress | None:
        if self._policy is not None and self._egress is None:
            self._egress = Egress(self._policy, shared=True)
        return self._egress

    async def install(self, work_dir: Path, python: str) -> None:
        """The policy's ``packages=``, once per session, before any of its code runs."""
        egress = self.get()
        if egress is None or not egress.policy.packages or self._installed:
            return
        await asyncio.to_thread(self._install, egress, work_dir, python)
        self._installed = True

    def _install(self, egress: Egress, work_dir: Path, python: str) -> None:
        """pip, in a sandbox of its own with the proxy, installs into the session's site: the
        one writable place of that run (afterwards shown read-only, with the egress folder)."""
        egress.site.mkdir(mode=0o755, exist_ok=True)
        give_to_sandbox(egress.site, self._options)
        env = sandbox_environment(egress, {"HOME": "/tmp", "PATH": os.defpath, "LANG": "C.UTF-8"})

        def run(args: list[str]) -> tuple[int, str]:
            pip = [python, "-m", "pip", "install", "-q", "--target", str(egress.site), *args]
            argv = bwrap_argv(
                self._options,
                sandbox_argv(egress, pip, python),
                work_dir=work_dir,
                env=env,
                writable=[egress.site],
                readable=[egress.folder],
                **sandbox_dns(egress),
            )
            proc = subprocess.run(
                argv, env=_launcher_env(), capture_output=True, text=True, timeout=900
            )
            return proc.returncode, proc.stdout + proc.stderr

        install_packages(egress, run, str(egress.wheels))

    async def take(self) -> list[NetworkEvent]:
        if self._egress is None:
            return []
        return await asyncio.to_thread(self._egress.take_log)

    def close(self) -> None:
        egress, self._egress = self._egress, None
        if egress is not None:
            egress.close()


class _SandboxedSpecs(KernelSpecManager):
    """One kernelspec: ``ipykernel_launcher`` under bwrap, interrupted by message (a signal to
    bwrap would not reach the kernel inside its pid namespace)."""

    def __init__(self, argv: list[str], language: str = "python", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._spec = KernelSpec(
            argv=argv,
            display_name=f"{language} (sandboxed)",
            language=language,
            interrupt_mode="message",
        )

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return self._spec


class SandboxedKernel(LocalKernel):
    """``LocalKernel`` whose kernel process lives in a bubblewrap sandbox."""

    kind = "sandboxed-kernel"
    inherits_host_env = False

    def __init__(self, *, sandbox: SandboxOptions | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.sandbox = sandbox or SandboxOptions()
        self._egress = _Egress(self.sandbox)
        #: another language's kernelspec (``other_kernel``): run through the bridge
        self._other: KernelSpec | None = None
        self._other_name = ""  # its name: set, with no spec found, the start says it is missing
        check_sandbox()

    @property
    def runs_other_kernels(self) -> bool:
        return True

    def other_kernel(self, kernel_name: str) -> KernelBackend | None:
        """A kernel of another kernelspec in a sandbox of its own, with the same options
        (the same work dir, user, hidden places and network)."""
        other = SandboxedKernel(
            sandbox=self.sandbox,
            kernel_name=kernel_name,
            shutdown_wait=self.shutdown_wait,
            containment=self.containment,
        )
        other._other, other._other_name = _host_spec(kernel_name), kernel_name
        return other

    async def interrupt(self) -> None:
        if (
            self._other is None
            or self._other.interrupt_mode == "message"
            or _is_deno_spec(self._other)
        ):
            await super().interrupt()
            return
        # SIGINT to the kernel's group inside the sandbox, through the bridge's socket.
        if self._km is not None and self._ipc_dir is not None:
            path = os.path.join(self._ipc_dir, "run", "k" + INTERRUPT_SUFFIX)
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(2)
                conn.connect(path)
        before = self._block_pids
        if before is not None and self._jail is not None:
            await self._jail.kill_new_after_sigint(before, (self._launched_pid(), self.pid))

    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        if self._other_name and self._other is None:
            raise KernelStartFailed(f"no kernelspec named {self._other_name!r}")
        if self._other is None:  # its font list: built once, off the event loop
            await asyncio.to_thread(font_lists, self.python or _kernelspec_python(self.kernel_name))
        give_to_sandbox(work_dir, self.sandbox, also=self.sandbox.writable)
        # the session's packages= are Python's, whichever language this kernel runs
        python = self.python or (
            sys.executable if self._other is not None else _kernelspec_python(self.kernel_name)
        )
        await self._egress.install(work_dir, python)
        await super().start(work_dir=work_dir, env=env, timeout=timeout)

    def _manager(self, jail: Jail) -> AsyncKernelManager:
        km = super()._manager(jail)
        assert self._work_dir is not None and self._ipc_dir is not None
        # The runtime dir stays the host's (its log, the connection file: nothing the code can
        # replace with a link); the kernel binds its sockets and keeps its files in "run", the
        # one folder in it the sandbox's user may write until the kernel is up (_seal_run).
        os.chmod(self._ipc_dir, 0o711)
        run = os.path.join(self._ipc_dir, "run")
        os.mkdir(run, 0o700)
        give_to_sandbox(run, self.sandbox)
        for own in _KERNEL_FOLDERS:  # made now: "run" is sealed before the kernel makes them
            os.mkdir(os.path.join(run, own), 0o700)
            give_to_sandbox(os.path.join(run, own), self.sandbox)
        if self._other is not None:
            # Another language's kernel: run by the bridge (``_sandbox_bridge``) with the host's
            # interpreter, its program shown read-only wherever it lies.
            python = sys.executable
            # jupyter_client fills every "{connection_file}" with the host's (ipc) file: the
            # kernel's own (tcp) one is the bridge's to fill in.
            theirs = [a.replace("{connection_file}", KERNEL_FILE) for a in self._other.argv]
            inner = [python, "-I", "-c", BRIDGE_SCRIPT, "{connection_file}", *theirs]
        else:
            python = self.python or _kernelspec_python(self.kernel_name)
            inner = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
            if "MPLCONFIGDIR" not in self._env:  # its font list, not built again inside
                copy_into(os.path.join(run, "matplotlib"), python)
        # Pid 1 of the sandbox is bwrap's reaper, not the kernel's parent: "1" tells ipykernel
        # there is no parent to watch (--die-with-parent does that) and keeps it from printing
        # its console note.
        env = {**self._env, "JPY_PARENT_PID": "1"}
        # The kernel's own files (history database, matplotlib cache) live in its runtime dir,
        # not in the private /tmp a block can fill.
        env.setdefault("IPYTHONDIR", os.path.join(run, "ipython"))
        env.setdefault("MPLCONFIGDIR", os.path.join(run, "matplotlib"))
        if self._other is not None:
            env.update(self._other.env or {})
            env.setdefault("DENO_DIR", os.path.join(run, "deno"))  # Deno's cache: not in /tmp
        egress = self._egress.get()
        readable: list[str | Path] = (
            [] if self._other is None else [*_program_roots(self._other.argv)]
        )
        dns: dict[str, Any] = {}
        if egress is not None:
            inner = sandbox_argv(egress, inner, python)
            env = sandbox_environment(egress, env)
            readable.append(egress.folder)
            dns = sandbox_dns(egress)
        argv = bwrap_argv(
            self.sandbox,
            inner,
            work_dir=self._work_dir,
            env=env,
            writable=[self._ipc_dir],
            readable=readable,
            **dns,
        )
        # The jail (a cgroup, or the subreaper helper) holds bwrap and so everything inside.
        language = "python" if self._other is None else self._other.language
        sandboxed = _SandboxedManager(
            kernel_name="kernelexec-sandboxed",
            kernel_spec_manager=_SandboxedSpecs(jail.wrap(argv), language),
            transport="ipc",
            ip=os.path.join(run, "k"),
            connection_file=os.path.join(self._ipc_dir, "kernel.json"),
        )
        sandboxed.sandbox = self.sandbox
        sandboxed.shutdown_wait_time = km.shutdown_wait_time
        return sandboxed

    async def _connect(self, timeout: float) -> None:
        await super()._connect(timeout)
        await self._seal_run()

    async def _seal_run(self) -> None:
        """Take "run" back from the sandbox's user once the kernel answered: its sockets (and
        the bridge's) are bound by then. A block can no longer remove or replace them (with a
        link to a host socket, which the host, root, would connect to on an interrupt or when
        its channels reconnect after the kernel died). On a host that is not root the sandbox's
        user is the host's: the folder stays theirs, only its mode changes."""
        assert self._ipc_dir is not None
        run = os.path.join(self._ipc_dir, "run")
        if self._other is not None:
            # The bridge binds its interrupt socket beside the channels': wait for it, briefly.
            interrupt = os.path.join(run, "k" + INTERRUPT_SUFFIX)
            for _ in range(100):
                if os.path.exists(interrupt):
                    break
                await asyncio.sleep(0.05)
        take_back(run)  # entered (the kernel's own folders, its sockets), not written

    async def take_network_log(self) -> list[NetworkEvent]:
        return await self._egress.take()

    #: its sandbox ends with it: a restore keeps it (``_kernel``), for the forks living there
    holds_forks = True

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who owns the files copied into its work dir by a restore."""
        return sandbox_owner(self.sandbox)

    def fork_home(self) -> tuple[str, str]:
        """Where a fork of this kernel lives (``forked_kernel.SandboxForkedKernel``): the
        sandbox's runtime dir, bound in writable and the host's (0711: the code cannot rename or
        replace what the host makes in it), and the sandbox's pid namespace (the fork is a
        process of the sandbox: its host pid is found there). ``KernelStartFailed`` when the
        sandbox is not running."""
        launched = self._launched_pid()
        namespace = None if launched is None else _pid_namespace_below(launched)
        if self._ipc_dir is None or namespace is None:
            raise KernelStartFailed("the sandboxed kernel is not running: nothing to fork")
        return self._ipc_dir, namespace

    async def shutdown(self) -> None:
        try:
            await super().shutdown()
        finally:
            self._egress.close()


class _SandboxedManager(AsyncKernelManager):
    """Gives the connection file (0600, the host's) to the sandbox's user, who must read it."""

    sandbox: SandboxOptions | None = None

    def write_connection_file(self, **kwargs: Any) -> None:
        super().write_connection_file(**kwargs)
        if self.sandbox is not None:
            give_to_sandbox(self.connection_file, self.sandbox)


#: the folders the kernel writes in "run" (IPython's, Matplotlib's, Deno's): the sandbox's
_KERNEL_FOLDERS = ("ipython", "matplotlib", "deno")


def _kernelspec_python(kernel_name: str) -> str:
    """The interpreter of a kernelspec (a bare ``python`` means this one, as jupyter_client
    reads it)."""
    argv = list(KernelSpecManager().get_kernel_spec(kernel_name).argv)
    if not argv or argv[0] in {"python", "python3"}:
        return sys.executable
    return str(argv[0])


def sandbox_owner(options: SandboxOptions) -> tuple[int, int] | None:
    """The host user the sandbox's files belong to (None: the host's own user)."""
    return (options.host_uid, options.host_gid) if host_is_root() else None


def _pid_namespace_below(bwrap: int) -> str | None:
    """The pid namespace bwrap made (its first child is that namespace's pid 1)."""
    try:
        for task in os.listdir(f"/proc/{bwrap}/task"):
            with open(f"/proc/{bwrap}/task/{task}/children", encoding="ascii") as f:
                for child in f.read().split():
                    return os.readlink(f"/proc/{child}/ns/pid")
    except OSError:
        return None
    return None


def host_pid(namespace: str, pid: int) -> int | None:
    """The host's pid of the process that is ``pid`` inside the pid namespace ``namespace``
    (None when no such process runs): only a process of that namespace is ever named. The
    newest processes are looked at first: a fork just made is found at once, where a scan of
    every process (each a link read) took 10 ms of the fork's time on a busy host."""
    pids = sorted((int(n) for n in os.listdir("/proc") if n.isdigit()), reverse=True)
    for name in pids:
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != namespace:
                continue
            with open(f"/proc/{name}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        if int(line.split()[-1]) == pid:
                            return int(name)
                        break
        except (OSError, ValueError):
            continue
    return None


def _launcher_env() -> dict[str, str]:
    """The environment of bwrap itself (the sandbox gets its own, built by ``bwrap_argv``)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _host_spec(kernel_name: str) -> KernelSpec | None:
    """The host's kernelspec (None: not installed; the start then says so, as a local one's)."""
    try:
        with warnings.catch_warnings():
            # bash_kernel's spec has a "codemirror_mode" key, which traitlets warns about
            warnings.simplefilter("ignore", DeprecationWarning)
            spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except Exception:  # NoSuchKernel, or a broken spec: reported when the kernel starts
        return None
    argv = list(spec.argv)
    if argv and argv[0] in {"python", "python3"}:
        argv[0] = sys.executable
    spec.argv = argv
    return spec


def _is_deno_spec(spec: KernelSpec) -> bool:
    argv = list(spec.argv)
    return bool(argv) and os.path.basename(argv[0]) == "deno" and "jupyter" in argv[1:2]


def _program_roots(argv: Sequence[str]) -> list[str]:
    """The folder of the kernel's program, shown read-only (a deno in a virtualenv or a home)."""
    import shutil

    program = shutil.which(argv[0]) if argv else None
    if program is None:
        return []
    return sorted({os.path.dirname(program), os.path.dirname(os.path.realpath(program))})
