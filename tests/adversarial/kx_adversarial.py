"""Helpers the adversarial tests share (a module of its own: tests/adversarial is not a package).

The back ends are built by name through kernelexec's registry, so each case runs against exactly
what ``--executor NAME`` gives a user. ``backends()`` builds the parameter list of a case: each
back end carries its own tier marker, and a case that exercises a known defect on a back end is
marked there with a *strict* xfail naming the issue item, so it turns red the day it is fixed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

COMMAND, KERNEL, DOCKER_COMMAND, DOCKER_KERNEL = (
    "command",
    "kernel",
    "docker-command",
    "docker-kernel",
)
ALL = (COMMAND, KERNEL, DOCKER_COMMAND, DOCKER_KERNEL)
KERNELS = (KERNEL, DOCKER_KERNEL)
COMMANDS = (COMMAND, DOCKER_COMMAND)
DOCKER = (DOCKER_COMMAND, DOCKER_KERNEL)
LOCAL = (COMMAND, KERNEL)

_TIER = {
    COMMAND: pytest.mark.command,
    KERNEL: pytest.mark.kernel,
    DOCKER_COMMAND: pytest.mark.docker,
    DOCKER_KERNEL: pytest.mark.docker,
}

# How long a block may take past its own timeout before the case calls it a hang: generous,
# the suite shares two cores with everything else on the machine.
SLACK = 30.0


def backends(names: Iterable[str] = ALL, *, xfail: Mapping[str, str] | None = None) -> list[Any]:
    """Parameters for ``@pytest.mark.parametrize("backend", ..., indirect=True)``."""
    xfail = dict(xfail or {})
    unknown = set(xfail) - set(ALL)
    assert not unknown, unknown
    params = []
    for name in names:
        marks = [_TIER[name]]
        if name in xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=xfail[name]))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def pairs(
    names: Iterable[str],
    values: Iterable[str],
    *,
    xfail: Mapping[tuple[str, str], str] | None = None,
) -> list[Any]:
    """Parameters for ``parametrize(("backend", X), ..., indirect=["backend"])``: every back end
    with every value, a strict xfail on the (back end, value) pairs that hit a known defect."""
    params = []
    for name in names:
        for value in values:
            marks = [_TIER[name]]
            if xfail and (name, value) in xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=xfail[name, value]))
            params.append(pytest.param(name, value, marks=marks, id=f"{value}-{name}"))
    return params


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


def wait_started(token: str, count: int = 1, within: float = 15.0) -> None:
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
