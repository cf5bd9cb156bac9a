"""The host process is killed (SIGKILL) in the middle of a block: the session notebook on disk is
valid, and nothing is left running (for Docker, once ``kernelexec gc`` has run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import docker
import nbformat
import pytest
from kx_adversarial import ALL, DOCKER, backends, wait_gone, wait_started

HOST = Path(__file__).with_name("kx_session_host.py")
ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_host_killed_mid_block(backend: str, tmp_path: Path, token: str) -> None:
    notebook, status = tmp_path / "session.ipynb", tmp_path / "status.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HOST.parent)])}
    env["KXADV_TOKEN"] = token
    env.pop("PYTEST_CURRENT_TEST", None)
    argv = [sys.executable, str(HOST), backend, str(tmp_path / "work"), str(notebook)]
    with open(tmp_path / "host.log", "wb") as log:
        host = subprocess.Popen([*argv, str(status)], stdout=log, stderr=log, env=env)
        try:
            wait_started(token, within=90)
        finally:
            host.kill()
            host.wait(30)
    info = json.loads(status.read_text())

    # The notebook on disk holds the blocks that finished, and is valid.
    nb = nbformat.read(notebook, as_version=4)  # type: ignore[no-untyped-call]
    nbformat.validate(nb)
    assert [c.source for c in nb.cells] == ["print('one')", "print('two')"]
    assert [c.outputs[0]["text"] for c in nb.cells] == ["one\n", "two\n"]

    # `kernelexec gc` cleans up after a dead host: its containers, and the cgroups that hold a
    # local back end's kernel and processes (nothing else can kill them once the host is gone).
    gc = subprocess.run(
        [sys.executable, "-m", "kernelexec", "gc"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert gc.returncode == 0, gc.stderr
    if backend in DOCKER:
        client = docker.from_env()
        try:
            left = client.containers.list(
                all=True, filters={"label": f"kernelexec.session={info['session']}"}
            )
        finally:
            client.close()
        assert left == []
    # Nothing the session started is left: the block's child, the kernel.
    assert wait_gone(token) == []
    if info["kernel_pid"] is not None:
        deadline = time.monotonic() + 10
        while _alive(info["kernel_pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(info["kernel_pid"]), "the orphaned kernel still runs"
