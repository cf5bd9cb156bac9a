"""Floods: 100 MB of stdout, one 50 MB line, 10,000 displays, random bytes to stdout and fd 1.

Each back end's floods run once, in a host process of their own (``kx_flood_host.py``), so the
host's memory is measured without pytest's and the host's own stdout can be checked; the cases
below assert on its report.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kx_adversarial import (
    ALL,
    KERNELS,
    SLACK,
    accounted_chars,
    backends,
)
from kx_flood_host import CASES, TOKEN

HOST = Path(__file__).with_name("kx_flood_host.py")
ROOT = Path(__file__).resolve().parents[2]

TIMEOUTS = {name: timeout for name, _, timeout, _ in CASES}
# One host process runs all of a back end's floods, inside the first case that asks for them:
# fixture set-up, which pytest-timeout counts (the project's default: 120 s). Measured: 3 s
# (local command), 9 s (Docker command), 59 s (local kernel), 90 s (Docker kernel) on two cores
# shared with other jobs (load 9.6). The host gets about five times the slowest, and each case a
# minute more than that, so the host's own timeout fires first (and kills it) on a machine slow
# enough to reach it.
HOST_BUDGET = 480
pytestmark = pytest.mark.timeout(HOST_BUDGET + 60)
# A host that bounds its capture holds a few MB more during a flood, not the flood.
MEMORY_BOUND_MB = 50
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _run_host(backend: str, tmp: Path) -> dict[str, Any]:
    report = tmp / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_CURRENT_TEST", None)
    proc = subprocess.run(
        [sys.executable, str(HOST), backend, str(tmp / "work"), str(report)],
        capture_output=True,
        timeout=HOST_BUDGET,
        env=env,
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    data: dict[str, Any] = json.loads(report.read_text())
    data["host_stdout"] = proc.stdout
    return data


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    """Each back end's flood report, run once per module (see ``Executors`` for why a cache)."""
    return {}


@pytest.fixture
def flood(
    backend: str, reports: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    if backend not in reports:
        reports[backend] = _run_host(backend, tmp_path_factory.mktemp(f"flood-{backend}"))
    return reports[backend]


def _case(flood: dict[str, Any], name: str) -> dict[str, Any]:
    case: dict[str, Any] = flood[name]
    assert case["elapsed"] < TIMEOUTS[name] + SLACK
    return case


SIZES = {"stdout-100mb": 100_000_000, "line-50mb": 50_000_001}


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
@pytest.mark.parametrize("name", list(SIZES))
def test_a_flood_is_truncated_with_the_true_count(flood: dict[str, Any], name: str) -> None:
    case = _case(flood, name)
    assert (case["exit_code"], case["timed_out"], case["truncated"]) == (0, False, True)
    # Nothing lost: what is kept plus what the marker counts is every character printed.
    assert accounted_chars(case["stdout"]) == (SIZES[name], 1)
    assert accounted_chars(case["output"]) == (SIZES[name], 1)
    assert len(case["output"]) < 25_000  # bounded for the LLM


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
@pytest.mark.parametrize("name", list(SIZES))
def test_a_flood_leaves_host_memory_bounded(flood: dict[str, Any], name: str) -> None:
    case = _case(flood, name)
    grew = case["peak_mb"] - case["base_mb"]
    assert grew < MEMORY_BOUND_MB, f"host peak RSS grew {grew:.0f} MB during {name}"


@pytest.mark.parametrize("backend", backends(KERNELS), indirect=True)
def test_ten_thousand_displays_are_kept_or_counted(flood: dict[str, Any]) -> None:
    case = _case(flood, "displays")
    assert case["exit_code"] == 0
    match = re.search(r"\[\.\.\. (\d+) display outputs omitted", case["output"])
    omitted = int(match[1]) if match else 0
    assert case["displays"] + omitted == 10_000, (case["displays"], omitted)
    assert case["truncated"] == bool(omitted)
    assert case["html_files"] == case["displays"]  # files only for the outputs kept


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_random_bytes_to_stdout(flood: dict[str, Any]) -> None:
    case = _case(flood, "random-stdout")
    assert (case["exit_code"], case["timed_out"], case["truncated"]) == (0, False, True)
    # A character may become a replacement character, never vanish: the count is exact.
    assert accounted_chars(case["stdout"]) == (1_000_001, 1)


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_random_bytes_to_fd_1_and_fd_1_still_works(flood: dict[str, Any]) -> None:
    case = _case(flood, "random-fd1")
    assert (case["exit_code"], case["timed_out"]) == (0, False), case["output"]
    assert len(case["stdout"]) > 10_000  # the bytes arrived (as replacement characters)
    later = _case(flood, "later-fd1")
    assert (later["exit_code"], later["stdout"]) == (0, "later\n")


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_binary_output_leaves_no_control_characters_in_output(flood: dict[str, Any]) -> None:
    case = _case(flood, "random-stdout")
    found = sorted(set(_CONTROL.findall(case["output"])))
    assert found == [], f"control characters in output: {found[:10]}"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_a_blocks_output_never_reaches_the_hosts_stdout(flood: dict[str, Any]) -> None:
    case = _case(flood, "host-stdout")
    # All of it reached the result ... (fd 1 is read by ipykernel's own thread, so its text can
    # land anywhere in the print's, even between the print's text and its newline: seen in CI)
    for where in ("fd", "child", "print"):
        assert f"{TOKEN}-{where}" in case["stdout"]
    assert case["stdout"].count("\n") >= 3
    # ... and none of it, nor the random bytes of the other cases, the host's own stdout.
    assert flood["host_stdout"] == b""
