"""Processes that leave the block's session die with the block (issue 13.3), command back end.

Each escape form (a new session, ``setsid``, a double fork, ``nohup ... &``) runs under each
containment mechanism this host has; the escaped process writes its pid to a file, and must be
gone once the block has ended or timed out. The cgroups made for the blocks are removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kx_containment import (
    ESCAPES,
    describe_cgroups,
    escape_block,
    gone_within,
    kill_leftover,
    mechanisms,
    our_cgroups,
    running,
)

from kernelexec import CommandLineExecutor
from kernelexec.backends import _containment
from kernelexec.backends.local_command import LocalCommand
from kernelexec.cli import main


@pytest.fixture(params=mechanisms())
def ex(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CommandLineExecutor]:
    backend = LocalCommand(containment=request.param)
    work = tmp_path_factory.mktemp("work")
    with CommandLineExecutor(backend=backend, work_dir=work, timeout=30) as executor:
        yield executor
    left = our_cgroups()
    assert left == [], describe_cgroups(left)  # the executor's cgroup is removed at close


def held_by_our_cgroups() -> set[int]:
    """The processes in the cgroups this test process made (its executors' spawners, if any)."""
    return {int(p) for c in our_cgroups() for p in (c / "cgroup.procs").read_text().split()}


@pytest.mark.parametrize("form", list(ESCAPES))
@pytest.mark.parametrize("ending", ["block-end", "timeout"])
def test_escaped_process_dies_with_the_block(
    ex: CommandLineExecutor, form: str, ending: str, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    try:
        if ending == "block-end":
            result = ex.execute(escape_block(form, pidfile))
            assert result.ok, result.output
        else:
            result = ex.execute(escape_block(form, pidfile, then_sleep=60), timeout=3)
            assert result.timed_out, result.output
        assert "escaped" in result.output
        pid = int(pidfile.read_text())
        assert gone_within(pid), f"{form} escaped {ex.backend.containment} after {ending}"
        assert ex.execute("print('still usable')").output == "still usable\n"
        # one cgroup per executor, made once: after a block it holds the spawner, nothing else
        spawner = ex.backend._spawner  # type: ignore[attr-defined]
        assert held_by_our_cgroups() <= ({spawner.pid} if spawner else set())
    finally:
        kill_leftover(pidfile)


def test_auto_picks_the_strongest_mechanism_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_containment.ENV_VAR, raising=False)
    has_cgroup = bool(_containment._cgroup_parent("v2") or _containment._cgroup_parent("v1"))
    expected = "cgroup" if has_cgroup else "subreaper"
    assert LocalCommand().containment == expected


def test_environment_variable_overrides_and_bad_values_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(_containment.ENV_VAR, "process-group")
    assert LocalCommand().containment == "process-group"
    assert LocalCommand(containment="subreaper").containment == "subreaper"
    monkeypatch.setenv(_containment.ENV_VAR, "jail")
    with pytest.raises(ValueError, match="containment must be one of"):
        LocalCommand()


@pytest.mark.parametrize("flavour", ["cgroup-v2", "cgroup-v1"])
def test_gc_sweeps_the_cgroups_of_a_killed_host(
    flavour: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        _containment.mechanism(flavour)
    except Exception as exc:
        pytest.skip(f"{flavour} not available on this host: {exc}")
    pidfile = tmp_path / "pid"
    host_code = (
        "from kernelexec import CommandLineExecutor\n"
        f"with CommandLineExecutor(work_dir={str(tmp_path / 'work')!r}, timeout=300) as ex:\n"
        f"    ex.execute({escape_block('new-session', pidfile, then_sleep=300)!r})\n"
    )
    env = {**os.environ, _containment.ENV_VAR: flavour}
    root = Path(__file__).resolve().parents[2]  # this checkout's kernelexec
    host = subprocess.Popen([sys.executable, "-c", host_code], env=env, cwd=root)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        escaped = int(pidfile.read_text())
        host.send_signal(signal.SIGKILL)  # no clean-up: its cgroup and processes are left
        host.wait(30)
        mine = f"kernelexec-{host.pid}-"
        assert running(escaped)
        would = _containment.sweep_orphans(dry_run=True)
        assert [p for p in would if mine in p], would
        assert running(escaped)  # a dry run changes nothing
        monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        main(["gc"])  # the Docker part fails without an engine; the cgroups go first
        out = capsys.readouterr().out
        assert re.search(r"removed [1-9]\d* cgroup\(s\)", out) and mine in out, out
        assert gone_within(escaped)
        assert not [p for p in _containment.sweep_orphans(dry_run=True) if mine in p]
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(30)
        kill_leftover(pidfile)


def test_exit_status_and_signals_read_as_without_a_jail(ex: CommandLineExecutor) -> None:
    """The subreaper helper exits as its child did; a cgroup changes nothing here either."""
    assert ex.execute("exit 3", "sh").exit_code == 3
    for name, number in (("KILL", 9), ("TERM", 15), ("SEGV", 11)):
        result = ex.execute(f"kill -{name} $$", "sh")
        assert result.exit_code == 128 + number, result.output
        assert f"signal SIG{name}" in result.output


def test_process_group_fallback_kills_its_group_and_no_more(tmp_path: Path) -> None:
    """What the README says of the last resort: ``nohup ... &`` stays in the group and dies with
    it; a new session escapes (which is why cgroups or the subreaper come first)."""
    backend = LocalCommand(containment="process-group")
    in_group, escaped = tmp_path / "nohup.pid", tmp_path / "new-session.pid"
    try:
        with CommandLineExecutor(backend=backend, work_dir=tmp_path / "work", timeout=30) as ex:
            assert ex.execute(escape_block("nohup", in_group)).ok
            assert gone_within(int(in_group.read_text()))
            assert ex.execute(escape_block("new-session", escaped)).ok
        time.sleep(0.5)
        assert running(int(escaped.read_text()))  # the documented limit
    finally:
        kill_leftover(in_group)
        kill_leftover(escaped)


@pytest.mark.parametrize("flavour", ["v2", "v1"])
def test_a_cgroup_still_busy_at_close_is_removed_later(
    flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen under load: a killed kernel still leaving its cgroup when the wait ran out, and the
    cgroup left for the host's lifetime. It is now removed at the next close, or at exit."""
    if _containment._cgroup_parent(flavour) is None:
        pytest.skip(f"no writable cgroup {flavour} hierarchy here")
    monkeypatch.setattr(_containment, "_EMPTY_WAIT", 0.2)
    jail = _containment._CgroupJail(flavour)
    busy = jail.path / "busy"  # a child cgroup keeps it busy (EBUSY), as a dying member does
    busy.mkdir()
    try:
        jail.close()
        assert jail.path.is_dir()
        busy.rmdir()
        _containment._CgroupJail(flavour).close()  # any later close tries it again
        assert not jail.path.exists()
    finally:
        for path in (busy, jail.path):
            with contextlib.suppress(OSError):
                path.rmdir()
        _containment._PENDING.discard(jail.path)
    # at exit: a process whose last close found its cgroup busy
    script = (
        "import atexit, pathlib, sys\n"
        "from kernelexec.backends import _containment as c\n"
        "c._EMPTY_WAIT = 0.2\n"
        f"jail = c._CgroupJail({flavour!r})\n"
        "(jail.path / 'busy').mkdir()\n"
        "jail.close()\n"
        "print(jail.path, flush=True)\n"
        "atexit.register((jail.path / 'busy').rmdir)  # runs before kernelexec's own: LIFO\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    left = Path(done.stdout.strip())
    assert left.name.startswith("kernelexec-") and not left.exists(), done.stderr
