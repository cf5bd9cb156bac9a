"""Nothing a local kernel started survives ``restart()`` or ``close()`` (issue 13.3).

Each escape form (a new session, ``setsid``, a double fork, ``nohup ... &``) is started from a
kernel block under each containment mechanism this host has. One kernel per mechanism starts
all four forms in one block, so the suite stays quick; each form's pid is checked on its own.
A timed-out block keeps the kernel's state (the interrupt still works) and loses its own
processes, not those of earlier blocks.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelexec import KernelExecutor
from kernelexec.backends import _containment
from kernelexec.backends.local_kernel import LocalKernel

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


def our_cgroups() -> list[Path]:
    """The cgroups this test process's executors made and have not removed."""
    found: list[Path] = []
    for flavour in ("v2", "v1"):
        parent = _containment._cgroup_parent(flavour)
        if parent is not None:
            found += parent.glob(f"kernelexec-{os.getpid()}-*")
    return found


def mechanisms() -> list[str]:
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


def start_all(ex: KernelExecutor, folder: Path) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    pidfiles = {form: folder / f"{form}.pid" for form in ESCAPES}
    for form, pidfile in pidfiles.items():
        result = ex.execute(escape_block(form, pidfile))
        assert result.ok and "escaped" in result.output, result.output
    for form, pidfile in pidfiles.items():  # a kernel keeps what a block started running
        assert running(int(pidfile.read_text())), f"{form} died with its block"
    return pidfiles


def assert_all_gone(pidfiles: dict[str, Path], mechanism: str, after: str) -> None:
    survivors = [f for f, p in pidfiles.items() if not gone_within(int(p.read_text()))]
    assert survivors == [], f"{survivors} survived {after} under {mechanism}"


@pytest.fixture(params=mechanisms())
def mechanism(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ex(mechanism: str, tmp_path: Path) -> Iterator[KernelExecutor]:
    backend = LocalKernel(containment=mechanism)
    with KernelExecutor(backend=backend, work_dir=tmp_path / "work", timeout=30) as executor:
        yield executor


@pytest.mark.slow
def test_restart_and_close_leave_nothing_running(
    ex: KernelExecutor, mechanism: str, tmp_path: Path
) -> None:
    pidfiles: dict[str, Path] = {}
    timed_out: dict[str, Path] = {}
    try:
        pidfiles = start_all(ex, tmp_path / "before-restart")
        ex.execute("kept = 42")
        # A timed-out block is interrupted: the kernel's state is kept, the processes that
        # block started die (escaped or not), and those earlier blocks started stay.
        timed_out = {form: tmp_path / f"timed-out-{form}.pid" for form in ESCAPES}
        for form, pidfile in timed_out.items():
            result = ex.execute(escape_block(form, pidfile, then_sleep=60), timeout=3)
            assert result.timed_out and "state were kept" in result.output, result.output
            assert gone_within(int(pidfile.read_text())), f"{form} outlived its timeout"
        assert ex.execute("print(kept)").output == "42\n"
        for form, pidfile in pidfiles.items():
            assert running(int(pidfile.read_text())), f"{form} of an earlier block was killed"
        cgroups_before = our_cgroups()
        ex.restart()
        assert_all_gone(pidfiles, mechanism, "restart()")
        if mechanism.startswith("cgroup"):
            after = our_cgroups()
            assert len(cgroups_before) == len(after) == 1 and after != cgroups_before
        pidfiles = start_all(ex, tmp_path / "before-close")
        ex.close()
        assert_all_gone(pidfiles, mechanism, "close()")
        assert our_cgroups() == []
    finally:
        for pidfile in [*pidfiles.values(), *timed_out.values()]:
            kill_leftover(pidfile)
