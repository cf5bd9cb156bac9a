"""Helpers the adversarial tests share (a module of its own: tests/adversarial is not a package).

The back ends are built by name through kernelexec's registry, so each case runs against exactly
what ``--executor NAME`` gives a user. ``backends()`` builds the parameter list of a case: each
back end carries its own tier marker. ``Running`` is the "nothing left running" check.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kernelexec.backends._fork_server import SPARE_NAME

COMMAND, WARM_COMMAND, KERNEL, FORK_KERNEL, DOCKER_COMMAND, DOCKER_KERNEL = (
    "command",
    "warm-command",
    "kernel",
    "fork-kernel",
    "docker-command",
    "docker-kernel",
)
ALL = (COMMAND, WARM_COMMAND, KERNEL, FORK_KERNEL, DOCKER_COMMAND, DOCKER_KERNEL)
KERNELS = (KERNEL, FORK_KERNEL, DOCKER_KERNEL)
COMMANDS = (COMMAND, WARM_COMMAND, DOCKER_COMMAND)
DOCKER = (DOCKER_COMMAND, DOCKER_KERNEL)
LOCAL = (COMMAND, WARM_COMMAND, KERNEL, FORK_KERNEL)

_TIER = {
    COMMAND: pytest.mark.command,
    WARM_COMMAND: pytest.mark.command,
    KERNEL: pytest.mark.kernel,
    FORK_KERNEL: pytest.mark.kernel,
    DOCKER_COMMAND: pytest.mark.docker,
    DOCKER_KERNEL: pytest.mark.docker,
}

# How long a block may take past its own timeout before the case calls it a hang: generous,
# the suite shares two cores with everything else on the machine.
SLACK = 30.0


def backends(names: Iterable[str] = ALL) -> list[Any]:
    """Parameters for ``@pytest.mark.parametrize("backend", ..., indirect=True)``."""
    return [pytest.param(name, marks=_TIER[name], id=name) for name in names]


def pairs(names: Iterable[str], values: Iterable[str]) -> list[Any]:
    """Parameters for ``parametrize(("backend", X), ..., indirect=["backend"])``: every back end
    with every value."""
    return [
        pytest.param(name, value, marks=_TIER[name], id=f"{value}-{name}")
        for name in names
        for value in values
    ]


def new_token() -> str:
    """A marker unique to one case, put in the command line of every process it starts."""
    return f"kxadv-{uuid.uuid4().hex[:12]}"


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_zombie(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def processes_with(token: str) -> list[int]:
    """Live (not zombie) processes on this machine, containers' included, whose command line
    holds ``token``. Docker's processes share the host's kernel, so /proc shows them too."""
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid != me and token in _cmdline(pid) and not _is_zombie(pid):
            found.append(int(pid))
    return found


def wait_gone(token: str, within: float = 3.0) -> list[int]:
    """Wait up to ``within`` s for every process carrying ``token`` to end; those left."""
    deadline = time.monotonic() + within
    while (left := processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_all(token: str) -> None:
    """Clean-up after a case (never an assertion): SIGKILL whatever still carries ``token``."""
    for pid in processes_with(token):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _stat(pid: str) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else (int(fields[1]), fields[19])


def descendants() -> dict[int, tuple[int, str]]:
    """Every live descendant of this process: pid -> (parent pid, start time)."""
    table = {int(pid): st for pid in os.listdir("/proc") if pid.isdigit() and (st := _stat(pid))}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, tuple[int, str]] = {}
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = table[child]
            todo.append(child)
    return found


#: How many processes a Docker executor's container holds between blocks: the command back
#: end's main process (its own init); the kernel's ``docker-init`` and the kernel under it.
CONTAINER_BASE = {DOCKER_COMMAND: 1, DOCKER_KERNEL: 2}


def container_processes(executor: Any) -> list[str]:
    """Command lines of the processes in a Docker executor's container, from the engine (``docker
    top``, no exec: it works when a fork bomb has used up the pids limit); [] without one."""
    container = getattr(executor.backend, "container", None)
    if container is None:
        return []
    rows = container.top(ps_args="-o pid,args")["Processes"] or []
    return [f"{row[0]} {row[-1][:80]}" for row in rows]


def labelled_containers(client: Any) -> set[str]:
    """Ids of the containers (running or not) that kernelexec labelled as this process's."""
    from kernelexec.backends._docker_options import LABEL_OWNER_PID

    found = client.containers.list(
        all=True, ignore_removed=True, filters={"label": f"{LABEL_OWNER_PID}={os.getpid()}"}
    )
    return {str(c.id) for c in found}


def _own_container(executor: Any) -> str | None:
    container = getattr(executor.backend, "container", None)
    return None if container is None else str(container.id)


def fork_spares(tree: dict[int, tuple[int, str]]) -> set[int]:
    """The processes fork servers forked ahead for their next kernels (named so while they
    wait, and still in their server's session: a kernel starts its own)."""
    found = set()
    for pid, (parent, _) in tree.items():
        try:
            with open(f"/proc/{pid}/comm", encoding="ascii") as f:
                spare = f.read().strip() == SPARE_NAME
            if spare and os.getsid(pid) == os.getsid(parent):
                found.add(pid)
        except OSError:
            continue
    return found


def _own_processes(executor: Any, tree: dict[int, tuple[int, str]]) -> set[int]:
    """A local kernel executor's own processes: the kernel and those between it and us (the
    jail's helper)."""
    pid = getattr(executor.backend, "pid", None)
    own = set(getattr(executor.backend, "helper_pids", ()))  # warm-command's spare, ...
    while pid in tree:
        own.add(pid)
        pid = tree[pid][0]
    return own


@dataclass
class Running:
    """What runs when a case starts, to say afterwards what the case left running.

    ``left(open_executors)`` names what should not be there: processes below this one (the
    test process) that are new and are not an open executor's own kernel; processes carrying
    the case's token; containers labelled as this process's that are neither an open
    executor's current one nor already there before; and, in each open Docker executor's
    container, processes beyond its ``CONTAINER_BASE``. Cheap: /proc, and the engine only when
    ``client`` is given (a Docker case).
    """

    processes: set[tuple[int, str]]
    containers: set[str]
    token: str | None
    client: Any

    @classmethod
    def now(
        cls, open_executors: Sequence[Any], token: str | None = None, client: Any = None
    ) -> Running:
        tree = descendants()
        containers: set[str] = set()
        if client is not None:
            own = {_own_container(e) for e in open_executors}
            containers = labelled_containers(client) - own  # strays from before: not this case's
        return cls({(p, st[1]) for p, st in tree.items()}, containers, token, client)

    def _left_once(self, open_executors: Sequence[Any]) -> list[str]:
        tree = descendants()
        own: set[int] = fork_spares(tree)  # the server's, like the server itself
        for executor in open_executors:
            own |= _own_processes(executor, tree)
        left = [
            f"process {pid}: {_cmdline(str(pid))[:120]}"
            for pid, (_, start) in tree.items()
            if (pid, start) not in self.processes and pid not in own
        ]
        if self.token is not None:
            left += [
                f"token process {pid}" for pid in processes_with(self.token) if pid not in tree
            ]
        if self.client is not None:
            owned = {_own_container(e) for e in open_executors}
            for cid in labelled_containers(self.client) - owned - self.containers:
                left.append(f"container {cid[:12]}")
            for executor in open_executors:
                kind = getattr(executor.backend, "kind", "")
                if kind in CONTAINER_BASE:
                    inside = container_processes(executor)
                    if len(inside) > CONTAINER_BASE[kind]:
                        left.append(f"in the {kind} container: {inside}")
        return left

    def left(self, open_executors: Sequence[Any], within: float = 5.0) -> list[str]:
        """What is still running that should not be, after waiting up to ``within`` s for it to
        end (an engine removes a container, a block's wrapper exits, a moment after the call)."""
        deadline = time.monotonic() + within
        while (left := self._left_once(open_executors)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


# A process that ignores every polite signal and sleeps for ten minutes; argv[1] is the token.
STUBBORN = (
    "import signal, time\n"
    "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "time.sleep(600)\n"
)

# Python code a block runs to start the stubborn process in one of three ways.
SPAWNERS = {
    "child": (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', {stubborn!r}, {token!r}],\n"
        "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
        "                 stderr=subprocess.DEVNULL)\n"
    ),
    "new-session": (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', {stubborn!r}, {token!r}],\n"
        "                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
        "                 stderr=subprocess.DEVNULL, start_new_session=True)\n"
    ),
    # An intermediate process starts the stubborn one in a new session and exits at once: the
    # grandchild is orphaned (re-parented to init or a subreaper), the classic daemon escape.
    "double-fork": (
        "import subprocess, sys\n"
        "_mid = ('import subprocess, sys, os; subprocess.Popen(sys.argv[1:], '\n"
        "        'stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, '\n"
        "        'stderr=subprocess.DEVNULL, start_new_session=True); os._exit(0)')\n"
        "subprocess.run([sys.executable, '-c', _mid, sys.executable, '-c', {stubborn!r},\n"
        "                {token!r}], check=True)\n"
    ),
    # The shell's way: nohup and setsid, in the background.
    "nohup": (
        "import subprocess, sys\n"
        'subprocess.run([\'bash\', \'-c\', \'nohup setsid "$0" -c "$1" "$2" '
        ">/dev/null 2>&1 &', sys.executable, {stubborn!r}, {token!r}], check=True)\n"
    ),
}


def spawn_code(how: str, token: str) -> str:
    return SPAWNERS[how].format(stubborn=STUBBORN, token=token)


def wait_started(token: str, count: int = 1, within: float = 40.0) -> None:
    """Wait until ``count`` processes carrying ``token`` run (a block may return first)."""
    deadline = time.monotonic() + within
    while len(processes_with(token)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_with(token)) >= count, f"never started: {token}"


_FULL_OUTPUT_NOTE = re.compile(r"\n\[full output in [^\n]*\]$")
_MARKER = re.compile(r"\n?\[\.\.\. (\d+) characters omitted[^\n]*?\.\.\.\]\n?")


def accounted_chars(text: str) -> tuple[int, int]:
    """(characters a possibly truncated text accounts for, how many times it was cut): the
    characters kept plus the count its "[... N characters omitted ...]" marker reports."""
    text = _FULL_OUTPUT_NOTE.sub("", text)  # where the whole text was spilled: not output
    counts = [int(m[1]) for m in _MARKER.finditer(text)]
    kept = len(_MARKER.sub("", text))
    return kept + sum(counts), len(counts)
