"""A stateless block at the floor (issue 33.1): with cgroup containment, the executor makes one
cgroup and a resident spawner inside it, and every block is born there (no move into a cgroup
per block, which waits for an RCU grace period each time). Still nothing a block starts
survives it, and nothing of the executor survives its close."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from kx_containment import (
    describe_cgroups,
    escape_block,
    gone_within,
    kill_leftover,
    our_cgroups,
    running,
)

from kernelexec import BackendUnavailable, CommandLineExecutor
from kernelexec.backends import _containment
from kernelexec.backends.local_command import LocalCommand

pytestmark = pytest.mark.command


def _cgroup_flavours() -> list[object]:
    params = []
    for name in ("cgroup-v2", "cgroup-v1"):
        try:
            _containment.mechanism(name)
            marks = []
        except Exception as exc:
            marks = [pytest.mark.skip(reason=f"{name} not available on this host: {exc}")]
        params.append(pytest.param(name, marks=marks))
    return params


@pytest.fixture(params=_cgroup_flavours())
def ex(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CommandLineExecutor]:
    backend = LocalCommand(containment=request.param)
    with CommandLineExecutor(backend=backend, work_dir=tmp_path / "work", timeout=30) as executor:
        yield executor


_WHERE = "print(open('/proc/self/cgroup').read())"


def _cgroup_of(output: str, flavour: str) -> str:
    for line in output.splitlines():
        _, controllers, path = line.split(":", 2)
        if (flavour == "v2" and controllers == "") or (
            flavour == "v1" and "freezer" in controllers.split(",")
        ):
            return path
    raise AssertionError(output)


def test_every_block_is_born_in_the_one_cgroup_of_its_executor(ex: CommandLineExecutor) -> None:
    flavour = ex.backend.containment[-2:]  # type: ignore[attr-defined]
    first = ex.execute(_WHERE)
    second = ex.execute(_WHERE)
    assert first.ok and second.ok, (first.output, second.output)
    where = _cgroup_of(first.output, flavour)
    assert "/kernelexec-" in where, where
    assert _cgroup_of(second.output, flavour) == where  # made once, not per block
    spawner = ex.backend._spawner  # type: ignore[attr-defined]
    assert spawner is not None and running(spawner.pid)
    ex.close()
    assert gone_within(spawner.pid)
    left = our_cgroups()
    assert left == [], describe_cgroups(left)


def test_a_block_that_kills_the_spawner_still_loses_what_it_started(
    ex: CommandLineExecutor, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    assert ex.execute("print(1)").ok
    spawner = ex.backend._spawner  # type: ignore[attr-defined]
    # it escapes its session, then kills the spawner that started it
    code = escape_block("new-session", pidfile) + f"os.kill({spawner.pid}, 9)\ntime.sleep(5)\n"
    try:
        result = ex.execute(code)
        # the spawner's end is the block's: killed with everything in its cgroup, and said so
        assert "escaped" in result.output and result.exit_code == 137, result.output
        assert gone_within(int(pidfile.read_text()))
        assert ex.execute("print('still usable')").output == "still usable\n"
        assert ex.backend._spawner.pid != spawner.pid  # type: ignore[attr-defined]
    finally:
        kill_leftover(pidfile)


def test_a_missing_interpreter_is_a_clear_error(tmp_path: Path) -> None:
    backend = LocalCommand()
    if not backend.containment.startswith("cgroup"):
        pytest.skip("no cgroup containment here")
    backend.python = str(tmp_path / "no-such-python")
    with (
        CommandLineExecutor(backend=backend, work_dir=tmp_path / "w", timeout=30) as ex,
        pytest.raises(BackendUnavailable, match="no-such-python"),
    ):
        ex.execute("print(1)")


def test_exit_codes_and_signals_read_as_from_a_direct_child(ex: CommandLineExecutor) -> None:
    assert ex.execute("import sys; sys.exit(3)").exit_code == 3
    killed = ex.execute(f"import os; os.kill(os.getpid(), {int(signal.SIGTERM)})")
    assert killed.exit_code == 128 + signal.SIGTERM and "SIGTERM" in killed.output


def test_a_block_that_stops_the_spawner_leaves_nothing_stuck(ex: CommandLineExecutor) -> None:
    """SIGSTOP on the spawner: that block can no longer be told done and ends at its timeout;
    the next block finds the spawner stopped and gets a new one (the old one killed)."""
    assert ex.execute("print(1)").ok
    stopped = ex.backend._spawner.pid  # type: ignore[attr-defined]
    late = ex.execute(f"import os, signal; os.kill({stopped}, signal.SIGSTOP)", timeout=3)
    assert late.timed_out, late.output
    assert ex.execute("print('usable')").output == "usable\n"
    assert ex.backend._spawner.pid != stopped  # type: ignore[attr-defined]
    assert gone_within(stopped)  # killed with its cgroup, not left stopped
