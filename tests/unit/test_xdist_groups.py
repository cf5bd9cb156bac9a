"""The parallel run's groups (tests/conftest.py): what must not run beside itself shares a group."""

from __future__ import annotations

import re
from pathlib import Path

from kx_xdist import xdist_group

TESTS = Path(__file__).resolve().parents[1]
# `kernelexec gc` run as a command or called in-process (main(["gc"]), gc(dry_run=...), _gc(...))
RUNS_GC = re.compile(r"""["']gc["']|\b_?gc\(""")


def _runs_gc(path: Path) -> bool:
    """A line that runs a sweep (a dry run removes nothing: it races with no one)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return any(RUNS_GC.search(line) and "dry" not in line for line in lines)


def test_every_file_that_runs_gc_is_in_the_sweeps_group() -> None:
    runners = [
        p
        for p in sorted(TESTS.glob("*/test_*.py"))
        if p.name != Path(__file__).name and _runs_gc(p)
    ]
    assert len(runners) >= 5  # the pattern still finds them
    ungrouped = [
        str(p.relative_to(TESTS))
        for p in runners
        if xdist_group(f"tests/{p.relative_to(TESTS)}::t") != "sweeps"
    ]
    assert ungrouped == [], f"these run `kernelexec gc` beside other sweeps: {ungrouped}"


def test_docker_files_share_two_groups_sweeps_one_and_other_files_one_each() -> None:
    assert xdist_group("tests/docker/test_gvisor.py::test_x[a]") == "docker-1"
    assert xdist_group("tests/docker/test_docker_files.py::test_x") == "docker-2"
    assert xdist_group("tests/mcp/test_mcp_docker.py::test_x") == "docker-2"
    assert xdist_group("tests/cluster/test_swarm_sessions.py::test_x") == "cluster"
    assert xdist_group("tests/cluster/test_swarm_gc.py::test_x") == "sweeps"
    assert xdist_group("tests/docker/test_docker_lifecycle.py::test_x") == "sweeps"
    assert xdist_group("tests/unit/test_door.py::test_x") == "tests/unit/test_door.py"
    assert xdist_group("tests/unit/test_door.py::Cls::test_y") == "tests/unit/test_door.py"


def test_every_measured_group_still_exists() -> None:
    """A renamed or removed file's figure would silently stop ordering anything."""
    from kx_xdist import _MEASURED, group_weight

    groups = {xdist_group(f"tests/{p.relative_to(TESTS)}::t") for p in TESTS.glob("*/test_*.py")}
    assert set(_MEASURED) - groups == set()
    assert group_weight("cluster", 3) == _MEASURED["cluster"]
    assert group_weight("tests/unit/test_door.py", 10) > group_weight("tests/unit/x.py", 2)
