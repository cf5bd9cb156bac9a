"""``kernelexec doctor``: the matrix of what each back end protects here, measured from inside
the back end and checked from the host; and it reports a failure when a protection is removed
(a back end run with a deliberately weakened option).
"""

from __future__ import annotations

import json
import os

import pytest

from kernelexec import _doctor
from kernelexec._doctor import PROBES, Target, run_doctor
from kernelexec._errors import BackendUnavailable
from kernelexec.cli import main

#: cells the local back ends leave open by design: they run as this user, in this environment
BY_DESIGN = ("env", "network", "pids", "memory")


def require_docker(problem: str | None) -> None:
    """Skip without an engine and the image; fail instead with KERNELEXEC_REQUIRE_DOCKER=1."""
    if problem is not None:
        if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":
            pytest.fail(f"{problem} (KERNELEXEC_REQUIRE_DOCKER=1, so this is a failure)")
        pytest.skip(problem)


@pytest.fixture(autouse=True)
def _quick_fifo(monkeypatch: pytest.MonkeyPatch) -> None:
    # A hang is a hang after 2 s as after 5 (a refusal takes milliseconds): quicker runs.
    monkeypatch.setattr(_doctor, "FIFO_BOUND", 2.0)


@pytest.mark.command
def test_doctor_prints_the_matrix_and_json_for_a_local_back_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["doctor", "--backend", "command"])
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert header.split()[2:] == list(PROBES)
    assert row.split()[0] == "command"
    assert "command: no isolation (by design)" in out
    cells = dict(zip(PROBES, row.split()[1:], strict=False))
    # The local back end does not protect the host, and says so: open, not a failure.
    assert all(cells[p] == "open" for p in BY_DESIGN), row
    failed = [p for p, cell in cells.items() if cell == "FAILS"]
    assert status == (1 if failed else 0), out

    status = main(["doctor", "--json", "--backend", "command"])
    report = json.loads(capsys.readouterr().out)
    (entry,) = report["backends"]
    assert entry["name"] == "command" and set(entry["cells"]) == set(PROBES)
    assert report["ok"] is (not entry["failed"]) and status == (0 if report["ok"] else 1)
    assert entry["cells"]["env"] == {
        "status": "open",
        "detail": "the code sees the host's canary variable",
    }


def _sandbox_problem() -> str | None:
    from kernelexec.backends._sandbox import check_sandbox

    try:
        check_sandbox()
    except BackendUnavailable as exc:
        if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
            raise
        return str(exc)
    return None


@pytest.mark.kernel
def test_doctor_reports_a_sandbox_whose_network_is_opened_as_failing() -> None:
    problem = _sandbox_problem()
    if problem is not None:
        pytest.skip(problem)
    from kernelexec.backends._sandbox import SandboxOptions

    kept, weakened = run_doctor(
        [
            Target(name="sandboxed-command"),
            Target(name="sandboxed-command", options={"sandbox": SandboxOptions(network=True)}),
        ]
    )
    assert kept.cells["network"].status == "holds" and kept.cells["env"].status == "holds"
    assert weakened.cells["network"].status == "FAILS"
    assert "127.0.0.1" in weakened.cells["network"].detail and "network" in weakened.failed


@pytest.mark.docker
def test_doctor_reports_a_container_run_as_root_with_capabilities_as_failing(
    docker_problem: str | None,
) -> None:
    require_docker(docker_problem)
    kept, weakened = run_doctor(
        [
            Target(name="docker-command", runtime="runc"),
            Target(name="docker-command", runtime="runc", options={"user": "0:0", "cap_drop": ()}),
        ]
    )
    for probe in ("uid", "caps", "socket", "network", "env", "pids", "memory"):
        assert kept.cells[probe].status == "holds", (probe, kept.cells[probe])
    assert weakened.cells["uid"].status == "FAILS" and weakened.cells["caps"].status == "FAILS"
    assert {"uid", "caps"} <= set(weakened.failed)


def test_doctor_under_an_allowlist_finds_its_listeners_closed_through_the_proxy() -> None:
    problem = _sandbox_problem()
    if problem is not None:
        pytest.skip(problem)
    from kernelexec import NetworkPolicy
    from kernelexec._doctor import targets

    (row,) = run_doctor(
        targets(["sandboxed-command"], network=NetworkPolicy(allow=["127.0.0.1:1"]))
    )
    assert row.cells["network"].status == "holds", row.cells["network"]
    assert "holds" in row.cells["network"].status and not row.failed
