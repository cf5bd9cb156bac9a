"""A kernel forked from another running kernel: same state, own process, sockets and cgroup.

``AsyncKernelExecutor.fork()`` prepares a ``ForkedKernel`` (its private folder, connection file
and cgroup), asks the running kernel to fork itself into it (``fork_request``: the source of
``_fork_child.py`` loaded and run by a silent request's user expression), then starts the
child's executor, whose back end adopts the forked process: from then on it is a kernel like a
fork-server kernel (not the host's child; its own process group and cgroup, killed with them on
``close()``).

A restart (asked for, or after the forked kernel died) cannot fork again from a state that is
gone: it gives a fresh kernel from a fork server, as a restart of any kernel loses its state.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.connect import write_connection_file

from .._errors import BackendUnavailable, KernelStartFailed
from . import _containment
from ._sandbox import SandboxOptions, give_to_sandbox, take_back
from .docker_fork import DockerForkedKernel
from .docker_kernel import DockerKernel
from .fork_kernel import ForkKernel
from .sandboxed import SandboxedKernel, sandbox_owner
from .sandboxed import host_pid as sandbox_host_pid

_CHILD_SOURCE = Path(__file__).with_name("_fork_child.py")
#: the module the fork code is loaded into in the kernel (never the user's namespace)
MODULE = "_kx_fork"


def fork_request(request: dict[str, Any]) -> tuple[str, str]:
    """The silent cell (empty) and the user expression that loads the fork code into a module
    object of its own (no name is left in the user's namespace), forks, and is the child's pid.
    The fork runs as an expression, after the cell: the child starts outside any cell (IPython's
    display and builtin traps are not held), as a kernel between two requests is. The module is
    loaded once per kernel (its forks inherit it, with the set-up code it compiled), only where
    this very source is not loaded yet; in the expression, not the cell: a cell holding the
    source cost the kernel 6 ms of CPU per fork (IPython transforms a cell), an expression 1."""
    source = _CHILD_SOURCE.read_text(encoding="utf-8")
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    load = (
        f"(lambda s: s.modules[{MODULE!r}] if getattr(s.modules.get({MODULE!r}), 'SOURCE_ID',"
        f" None) == {digest!r} else (lambda m: (m.__dict__.update("
        f"__builtins__=__import__('builtins'), SOURCE_ID={digest!r}),"
        f" exec(compile({source!r}, '<kernelexec fork>', 'exec'), m.__dict__),"
        f" s.modules.__setitem__({MODULE!r}, m), m)[-1])"
        f"(__import__('types').ModuleType({MODULE!r})))(__import__('sys'))"
    )
    expression = f"{load}.fork(__import__('json').loads({json.dumps(request)!r}))"
    return "", expression


class ForkedKernel(ForkKernel):
    """The back end of a fork: adopts the forked process, then behaves as a fork-server kernel."""

    kind = "forked-kernel"
    #: where the fork's executor works (None: a fresh folder of its own)
    work_home: Path | None = None
    #: who owns the files copied into its work dir (None: the host's user)
    owner: tuple[int, int] | None = None

    def __init__(self, *, origin_kind: str, python: str | None = None) -> None:
        super().__init__(python=python)
        #: the kind of the kernel this one was forked from (``local-kernel``, ``fork-kernel``)
        self.origin_kind = origin_kind
        self._adopt: dict[str, Any] | None = None
        #: the OOM kills counted so far in the fork's memory cgroup, and where they are counted
        self._oom: tuple[Path, int] | None = None

    def prepare(self, *, work_dir: Path, cwd: str | None = None) -> dict[str, Any]:
        """The request the running kernel forks into (a private folder, connection file, log,
        cgroup); ``cwd``: the child's working folder (default: ``work_dir``)."""
        if _containment.mechanism() == "subreaper":
            raise BackendUnavailable(
                "fork() needs cgroup or process-group containment (KERNELEXEC_CONTAINMENT): "
                "under the subreaper helper a forked kernel would die with its parent"
            )
        self._work_dir = work_dir
        request = self._request()
        # The child keeps the parent kernel's environment (the same executor options).
        os.unlink(request.pop("env_file"))
        # Its cgroup (made) is joined by the host's hand in ``adopted``, not by the child first:
        # a move into a cgroup waits out an RCU grace period (15 to 25 ms of a 1 GiB fork's
        # start, measured), which the child's kernel rebuild now overlaps. Until then it runs
        # only the fork code, in the session's cgroup (killed with it), its own process group.
        request["cgroup"] = None
        request["cwd"] = cwd or str(work_dir)
        self._adopt = request
        return request

    def adopted(self, pid: int) -> None:
        """The running kernel forked: ``pid`` is the child the next ``start()`` connects to,
        moved into its cgroup here (before it is connected to: no block runs outside it)."""
        self._pid = pid
        _join(self._jail, pid)
        first_to_go(pid)
        self._oom = oom_kills(pid)

    def death_reason(self) -> str | None:
        reason = super().death_reason()
        if reason is None or self._oom is None:
            return reason
        where, before = self._oom
        if _count_oom(where) > before:  # no parent waits for a fork: the cgroup tells
            return "killed for want of memory (the OOM killer: its writes copy shared pages)"
        return reason

    def release_request(self) -> None:
        """The fork failed: the prepared folder and cgroup go (nothing was forked into them)."""
        self._adopt = None

    async def _fork(self, deadline: float) -> dict[str, Any]:
        request, self._adopt = self._adopt, None
        if request is not None and self._pid is not None:
            return request
        # A restart: the forked state is gone; a fresh kernel (as any restart gives).
        self.python = self.python or sys.executable
        return await super()._fork(deadline)


class SandboxForkedKernel(ForkedKernel):
    """A fork of a sandboxed kernel: a process of the same bubblewrap sandbox (fork is in
    process: it cannot leave the sandbox's namespaces, and no new sandbox can be made around a
    running process). So it has the sandbox's view, user and network, and it ends with the
    sandbox: closing the session that started the sandbox ends its forks and snapshots too.

    Its folders are made by the host in the sandbox's runtime dir (the only place the host
    can add to the running sandbox's view; the code cannot rename what the host makes there):
    ``fork-*`` holds its connection file, sockets and log, ``work-*`` is its work dir. Its host
    pid is looked up in the sandbox's pid namespace, and the host moves it into a cgroup of
    its own (the sandbox hides the cgroup tree from inside). It cannot restart: a fresh kernel
    would be outside the sandbox."""

    kind = "sandboxed-forked-kernel"
    inherits_host_env = False

    def __init__(self, *, home: str, namespace: str, sandbox: SandboxOptions) -> None:
        super().__init__(origin_kind="sandboxed-kernel")
        self.sandbox = sandbox
        self._home, self._namespace = home, namespace
        #: the fork's work dir (its executor's, which removes it), made empty and the host's
        self.work_home: Path | None = Path(tempfile.mkdtemp(prefix="work-", dir=home))
        #: who owns the files copied in (the sandbox's user, on a root host)
        self.owner = sandbox_owner(sandbox)

    def prepare(self, *, work_dir: Path, cwd: str | None = None) -> dict[str, Any]:
        self._work_dir = work_dir
        give_to_sandbox(work_dir, self.sandbox)  # copied in by now, every file given
        request = self._request()
        request["cwd"] = cwd or str(work_dir)
        self._adopt = request
        return request

    def _request(self) -> dict[str, Any]:
        self._dir = folder = tempfile.mkdtemp(prefix="fork-", dir=self._home)
        connection_file = os.path.join(folder, "kernel.json")
        write_connection_file(connection_file, transport="ipc", ip=os.path.join(folder, "k"))
        give_to_sandbox(connection_file, self.sandbox)  # the fork reads it, as the sandbox's user
        give_to_sandbox(folder, self.sandbox)  # it binds its sockets and writes its log there
        return {
            "connection_file": connection_file,
            "cwd": str(self._work_dir),
            "log": os.path.join(folder, "kernel.log"),
            "cgroup": None,  # hidden inside the sandbox: the host moves the fork (adopted)
            "setup": self._setup,
        }

    def adopted(self, pid: int) -> None:
        """``pid``: the fork's pid inside the sandbox (what the kernel answered, so checked:
        only a process of the sandbox's pid namespace is ever adopted, signalled or killed)."""
        found = sandbox_host_pid(self._namespace, pid)
        if found is None:
            raise KernelStartFailed(f"the sandboxed kernel's fork (pid {pid}) is not running")
        self._pid = found
        first_to_go(found)
        self._oom = oom_kills(found)
        mechanism = _containment.mechanism()
        if mechanism.startswith("cgroup"):
            self._jail = _containment.make_jail(mechanism)
            _join(self._jail, found)

    async def _fork_and_connect(self, deadline: float) -> None:
        await super()._fork_and_connect(deadline)
        # Its sockets are bound and its log open: the folder is the host's again, so no block
        # (of this fork, or of any kernel in the sandbox) can swap a socket for a link the
        # host, root, would connect to on an interrupt or a reconnect.
        assert self._dir is not None
        take_back(self._dir, "kernel.json", "kernel.log")

    def fork_home(self) -> tuple[str, str]:
        """A fork of this fork lives in the same sandbox."""
        return self._home, self._namespace

    async def _fork(self, deadline: float) -> dict[str, Any]:
        request, self._adopt = self._adopt, None
        if request is not None and self._pid is not None:
            return request
        raise KernelStartFailed(
            "a fork of a sandboxed kernel cannot restart: its state is gone and a fresh kernel"
            " would be outside the sandbox; start a new sandboxed executor instead"
        )


def _join(jail: _containment.Jail | None, pid: int) -> None:
    """Move the forked ``pid`` (a process of the host's pid namespace) into ``jail``'s cgroup,
    if it has one; a fork gone by then is a fork that did not start."""
    procs = None if jail is None else jail.procs_file
    if procs is None:
        return
    try:
        procs.write_text(str(pid), encoding="ascii")
    except OSError as exc:
        raise KernelStartFailed(
            f"the forked kernel (pid {pid}) could not join its cgroup: {exc}"
        ) from exc


def first_to_go(pid: int) -> None:
    """When memory runs out where a fork and its session share a limit (a cgroup's, the
    machine's), the OOM killer takes the fork (or a snapshot), not the session: its pages are
    mostly the session's, shared, and the copies its writes make are what ran out."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/oom_score_adj", "w") as f:
        f.write("1000")


def oom_kills(pid: int) -> tuple[Path, int] | None:
    """The file counting OOM kills in ``pid``'s memory cgroup (v1 ``memory.oom_control``, v2
    ``memory.events``) and its count now; None where there is none to read."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            where = Path("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.oom_control")
        elif controllers == "":
            where = Path("/sys/fs/cgroup", path.lstrip("/"), "memory.events")
        else:
            continue
        if where.exists():
            return where, _count_oom(where)
    return None


def _count_oom(where: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in where.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    return 0


def fork_backend(backend: Any) -> Any:
    """The back end of a fork of ``backend``'s running kernel (a ``ForkedKernel``, or a
    ``DockerForkedKernel`` in a Docker kernel's container)."""
    if isinstance(backend, DockerForkedKernel):
        return backend.fork_backend()
    if isinstance(backend, DockerKernel):
        return DockerForkedKernel(backend)
    if isinstance(backend, (SandboxedKernel, SandboxForkedKernel)):
        home, namespace = backend.fork_home()
        return SandboxForkedKernel(home=home, namespace=namespace, sandbox=backend.sandbox)
    return ForkedKernel(origin_kind=backend.kind, python=getattr(backend, "python", None))
