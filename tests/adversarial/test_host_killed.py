"""The host process is killed (SIGKILL) in the middle of a block: the session notebook on disk is
valid, and nothing is left running (for Docker, once ``kernelexec gc`` has run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import nbformat
import pytest
from kx_adversarial import ALL, DOCKER, KERNELS, backends, wait_gone, wait_started

HOST = Path(__file__).with_name("kx_session_host.py")
ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _run_and_kill(backend: str, tmp_path: Path, token: str, *extra: str, started: int = 1) -> Any:
    """The host script, killed (SIGKILL) once ``started`` processes carry ``token``; its
    status (JSON) and the environment to run ``kernelexec gc`` in."""
    notebook, status = tmp_path / "session.ipynb", tmp_path / "status.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HOST.parent)])}
    env["KXADV_TOKEN"] = token
    env.pop("PYTEST_CURRENT_TEST", None)
    argv = [sys.executable, str(HOST), backend, str(tmp_path / "work"), str(notebook)]
    with open(tmp_path / "host.log", "wb") as log:
        host = subprocess.Popen([*argv, str(status), *extra], stdout=log, stderr=log, env=env)
        try:
            wait_started(token, count=started, within=120)
        finally:
            host.kill()
            host.wait(30)
    return json.loads(status.read_text()), env


def _gc(env: dict[str, str]) -> None:
    gc = subprocess.run(
        [sys.executable, "-m", "kernelexec", "gc"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert gc.returncode == 0, gc.stderr


def _containers_of(*sessions: str | None) -> list[Any]:
    client = docker.from_env()
    try:
        return [
            c
            for session in sessions
            if session
            for c in client.containers.list(
                all=True, filters={"label": f"kernelexec.session={session}"}
            )
        ]
    finally:
        client.close()


def _gone_within(pid: int | None, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while pid is not None and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid is None or not _alive(pid)


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_host_killed_mid_block(backend: str, tmp_path: Path, token: str) -> None:
    info, env = _run_and_kill(backend, tmp_path, token)
    notebook = tmp_path / "session.ipynb"

    # The notebook on disk holds the blocks that finished, and is valid.
    nb = nbformat.read(notebook, as_version=4)  # type: ignore[no-untyped-call]
    nbformat.validate(nb)
    assert [c.source for c in nb.cells] == ["print('one')", "print('two')"]
    assert [c.outputs[0]["text"] for c in nb.cells] == ["one\n", "two\n"]

    # `kernelexec gc` cleans up after a dead host: its containers, and the cgroups that hold a
    # local back end's kernel and processes (nothing else can kill them once the host is gone).
    _gc(env)
    if backend in DOCKER:
        assert _containers_of(info["session"]) == []
    # Nothing the session started is left: the block's child, the kernel.
    assert wait_gone(token) == []
    assert _gone_within(info["kernel_pid"]), "the orphaned kernel still runs"


@pytest.mark.parametrize("backend", backends(KERNELS), indirect=True)
def test_host_killed_with_a_fork_and_a_snapshot(backend: str, tmp_path: Path, token: str) -> None:
    """A session with a live snapshot and a fork whose block left a process running: once
    ``kernelexec gc`` ran, none of them is left (forks and snapshots are the host's too)."""
    info, env = _run_and_kill(backend, tmp_path, token, "branch", started=2)
    branches = info["branches"]
    assert branches["forked_via"] == "process"
    _gc(env)
    assert wait_gone(token) == []
    if backend in DOCKER:
        assert _containers_of(info["session"], branches["fork_session"]) == []
        # a live fork's folder is in the container's /kx-branches folder, removed with it
        assert not Path(branches["fork_work_dir"]).exists()
    else:
        for pid in (info["kernel_pid"], branches["fork_pid"], branches["snapshot_pid"]):
            assert pid is not None and _gone_within(pid), pid
