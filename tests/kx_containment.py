"""Helpers the containment tests share (command back end in tests/command, kernel back end in
tests/kernel): the escape forms, and how to tell an escaped process is gone."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from kernelexec.backends import _containment

# Each snippet starts a process that escapes the block's process group and session; that
# process writes its own pid to ``pidfile`` and then sleeps.
ESCAPES = {
    "new-session": """
        subprocess.Popen([sys.executable, "-c",
            "import os, time; open('{pidfile}', 'w').write(str(os.getpid())); time.sleep(300)"],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    """,
    "setsid": """
        subprocess.Popen(["setsid", "sh", "-c", "echo $$ > {pidfile}; exec sleep 300"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    """,
    "double-fork": """
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.closerange(0, 3)
                open('{pidfile}', 'w').write(str(os.getpid()))
                time.sleep(300)
            os._exit(0)
    """,
    "nohup": """
        subprocess.Popen("nohup sh -c 'echo $$ > {pidfile}; exec sleep 300' >/dev/null 2>&1 &",
            shell=True)
    """,
}


def escape_block(form: str, pidfile: Path, *, then_sleep: float = 0) -> str:
    """A python block that starts ``form``, waits until its pid is written, then sleeps."""
    start = textwrap.dedent(ESCAPES[form]).format(pidfile=pidfile)
    return (
        "import os, subprocess, sys, time\n"
        f"{start}\n"
        f"while not os.path.exists({str(pidfile)!r}) or not open({str(pidfile)!r}).read():\n"
        "    time.sleep(0.01)\n"
        "print('escaped', flush=True)\n"
        f"time.sleep({then_sleep})\n"
    )


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def gone_within(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.05)
    return not running(pid)


#: cgroup name -> the test after which it was first seen (filled by conftest after each test)
SEEN_AFTER: dict[str, str] = {}


def our_cgroups() -> list[Path]:
    """The cgroups this test process's executors made and have not removed."""
    found: list[Path] = []
    for flavour in ("v2", "v1"):
        parent = _containment._cgroup_parent(flavour)
        if parent is not None:
            found += parent.glob(f"kernelexec-{os.getpid()}-*")
    return found


def describe_cgroups(paths: list[Path]) -> str:
    """Where each cgroup came from and what holds it: for the message of a failed check."""
    lines = []
    for path in paths:
        members = []
        for pid in sorted(_containment._members(path)):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                cmd, state = b"?", "?"
            members.append(f"{pid} {state} {cmd.decode(errors='replace')}")
        lines.append(
            f"{path}: first seen after {SEEN_AFTER.get(path.name, '?')}; removal pending: "
            f"{path in _containment._PENDING}; members: {members or 'none'}"
        )
    return "\n".join(lines)


def mechanisms() -> list[Any]:
    """Every mechanism that contains escapes and that this host offers; the rest skip, saying so."""
    params = []
    for name in ("cgroup-v2", "cgroup-v1", "subreaper"):
        try:
            _containment.mechanism(name)
            marks = []
        except Exception as exc:
            marks = [pytest.mark.skip(reason=f"{name} not available on this host: {exc}")]
        params.append(pytest.param(name, marks=marks))
    return params


def kill_leftover(pidfile: Path) -> None:
    """Never leave a process behind, even when the test fails."""
    if pidfile.exists() and pidfile.read_text().strip().isdigit():
        pid = int(pidfile.read_text())
        if running(pid):
            os.kill(pid, 9)
