"""``kernelexec bench`` on the Docker rows: they run beside their floors, and Ctrl-C leaves no
container behind. No timing asserts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest


def _bench(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernelexec", "bench", "--no-progress", "--no-charts", *args]


def _ours(client: docker.DockerClient, pid: int) -> list[str]:
    """Containers the bench process ``pid`` created: kernelexec's own and the raw floors'.

    ``ignore_removed``: the bench removes containers while we list them (the SDK inspects each).
    """
    found: list[Any] = []
    for label in (f"kernelexec.owner_pid={pid}", f"kernelexec.bench.owner={pid}"):
        found += client.containers.list(all=True, ignore_removed=True, filters={"label": label})
    return [c.short_id for c in found]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_docker_rows_run_beside_their_floors(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    proc = subprocess.run(
        _bench(
            "--quick",
            "--workloads",
            "trivial",
            "--executors",
            "docker-command",
            "docker-kernel",
            "--out",
            str(tmp_path),
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    rows = {r["executor"]: r for r in data["rows"]}
    # docker-kernel is measured against the local kernel, which is measured against its floor
    assert set(rows) == {"docker-exec", "docker-command", "docker-kernel", "kernel",
                         "jupyter-client"}  # fmt: skip
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["reason"])
        assert row["block"]["n"] == 5
    assert rows["docker-command"]["sessions"][0]["peak_rss"] > 0
    targets = {t["name"]: t for t in data["targets"]}
    assert targets["docker command block"]["value"] is not None
    assert targets["docker kernel round trip"]["value"] is not None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigint_mid_run_leaves_no_container(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        _bench(
            "--quick",  # 5 blocks a session: the run is 30 sessions long, stopped after one
            "--workloads",
            "trivial",
            "--executors",
            "docker-command",
            "docker-exec",
            "--no-floors",
            "--sessions",
            "30",
            "--out",
            str(out),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 300
        sessions = 0
        while sessions < 1 and time.monotonic() < deadline and proc.poll() is None:
            seen.update(_ours(docker_client, proc.pid))
            try:
                data = json.loads((out / "results.json").read_text())
                sessions = sum(len(r["sessions"]) for r in data["rows"])
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        assert sessions >= 1, "the bench never finished a session"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr.decode()[-2000:]
    assert json.loads((out / "results.json").read_text())["interrupted"] is True
    assert seen, "no container of the bench was ever seen"
    assert _ours(docker_client, proc.pid) == []
