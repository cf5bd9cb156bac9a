"""Engine and image errors, labels and gc, the image build command, the CLI executors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import docker
import pytest

from kernelexec import DockerCommand, DockerKernel, DockerUnavailable, ImageNotFound
from kernelexec._image import LABEL_RECIPE, recipe_hash
from kernelexec.backends._docker import (
    DEFAULT_IMAGE,
    LABEL_HOST,
    LABEL_OWNER_PID,
    LABEL_RUNTIME_DIR,
    OWNER_LABEL,
    RUNTIME_DIR_PREFIX,
    DockerOptions,
    gc,
    labels_for,
)
from kernelexec.cli import main

MISSING_SOCKET = "unix:///nonexistent/kernelexec-test/docker.sock"


def _start_command(backend: DockerCommand, work: Path) -> None:
    async def go() -> None:
        try:
            await backend.start(work)
        finally:
            await backend.close()

    asyncio.run(go())


def _start_kernel(backend: DockerKernel, work: Path) -> None:
    async def go() -> None:
        try:
            await backend.start(work_dir=work, env={}, timeout=30)
        finally:
            await backend.shutdown()

    asyncio.run(go())


# -- no engine: these need no engine at all -------------------------------------------------------
def test_no_engine_is_docker_unavailable_saying_how_to_start_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", MISSING_SOCKET)
    with pytest.raises(DockerUnavailable) as info:
        _start_command(DockerCommand(), tmp_path)
    assert "dockerd" in str(info.value) and MISSING_SOCKET in str(info.value)
    with pytest.raises(DockerUnavailable, match="systemctl start docker"):
        _start_kernel(DockerKernel(), tmp_path)


def test_no_engine_on_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", MISSING_SOCKET)
    # gc's local sweep needs no engine: it succeeds, and says why no container was checked
    assert main(["gc", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "no containers checked" in err and "No Docker engine answers" in err
    # a command that needs the engine fails with the same clear message
    message = tmp_path / "message.md"
    message.write_text("```python\nprint(1)\n```\n")
    assert main(["run", str(message), "--executor", "docker-command"]) == 2
    assert "No Docker engine answers" in capsys.readouterr().err


# -- with an engine -------------------------------------------------------------------------------
def test_missing_image_says_how_to_get_that_image(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """A custom image is pulled or built by its owner: kernelexec's build command makes a
    different image, so it is not the advice (issue 34, item 6)."""
    advice = "docker pull kernelexec/missing:nope"
    with pytest.raises(ImageNotFound, match=advice) as command_error:
        _start_command(DockerCommand(image="kernelexec/missing:nope"), tmp_path)
    with pytest.raises(ImageNotFound, match=advice) as kernel_error:
        _start_kernel(DockerKernel(image="kernelexec/missing:nope"), tmp_path)
    for error in (command_error, kernel_error):
        assert "kernelexec image build" not in str(error.value)


def _labelled_container(
    client: docker.DockerClient, owner_pid: int, host: str | None = None, runtime: str = ""
) -> docker.models.containers.Container:
    labels = labels_for("test", f"gc-test-{owner_pid}", DockerOptions())
    labels.pop(OWNER_LABEL)  # as an older kernelexec made them: the owner's pid and host only
    labels[LABEL_OWNER_PID] = str(owner_pid)
    if host is not None:
        labels[LABEL_HOST] = host
    if runtime:
        labels[LABEL_RUNTIME_DIR] = runtime
    return client.containers.create(DEFAULT_IMAGE, command=["true"], labels=labels)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_gc_removes_only_containers_whose_owner_is_gone(
    docker_client: docker.DockerClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX))
    decoy = tmp_path / "not-ours"  # a label naming any other path must not be deleted
    decoy.mkdir()
    orphan = _labelled_container(docker_client, _dead_pid(), runtime=str(runtime))
    mine = _labelled_container(docker_client, os.getpid())
    elsewhere = _labelled_container(docker_client, _dead_pid(), host="some-other-host")
    spoofed = _labelled_container(docker_client, _dead_pid(), runtime=str(decoy))
    try:
        assert orphan.short_id in gc(dry_run=True)
        assert orphan.id in {
            c.id for c in docker_client.containers.list(all=True, ignore_removed=True)
        }  # dry run
        assert main(["gc"]) == 0
        out = capsys.readouterr().out
        assert orphan.short_id in out
        ids = {c.id for c in docker_client.containers.list(all=True, ignore_removed=True)}
        assert orphan.id not in ids and not runtime.exists()
        assert spoofed.id not in ids and decoy.is_dir()
        assert mine.id in ids and elsewhere.id in ids
    finally:
        for container in (orphan, mine, elsewhere, spoofed):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def test_a_container_gone_between_list_and_inspect_does_not_end_the_sweep(
    docker_client: docker.DockerClient,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another session ends (its container removed) while gc inspects the engine's list: the
    sweep goes on and says what it found. It said "no containers checked" and skipped the
    services (exit 0) when one inspect answered 404: seen in the parallel suite."""
    vanishing = _labelled_container(docker_client, os.getpid())
    orphan = _labelled_container(docker_client, _dead_pid())
    inspect = docker.api.client.APIClient.inspect_container

    def inspect_after_it_went(self: docker.api.client.APIClient, container: str) -> object:
        if vanishing.id.startswith(str(container)) or str(container).startswith(vanishing.id):
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.api.remove_container(vanishing.id, force=True)
        return inspect(self, container)

    monkeypatch.setattr(docker.api.client.APIClient, "inspect_container", inspect_after_it_went)
    try:
        assert main(["gc", "--dry-run"]) == 0
        captured = capsys.readouterr()
        assert "no containers checked" not in captured.err
        lines = captured.out.splitlines()
        assert any(orphan.short_id in line for line in lines if "container(s)" in line)
        assert any("service(s)" in line for line in lines)
    finally:
        monkeypatch.undo()
        for container in (vanishing, orphan):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def test_image_carries_its_recipe_and_an_up_to_date_build_is_skipped(
    docker_client: docker.DockerClient, capsys: pytest.CaptureFixture[str]
) -> None:
    image = docker_client.images.get(DEFAULT_IMAGE)
    assert image.labels[LABEL_RECIPE] == recipe_hash(offline=True)
    assert main(["image", "build", "--offline"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert docker_client.images.get(DEFAULT_IMAGE).id == image.id


@pytest.mark.parametrize("executor", ["docker-command", "docker-kernel"])
def test_cli_runs_a_message_in_docker(
    executor: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    message = tmp_path / "message.md"
    message.write_text("Here:\n\n```python\nimport os\nprint(os.getcwd())\n```\n")
    work = tmp_path / "work"
    assert main(["run", str(message), "--executor", executor, "--work-dir", str(work)]) == 0
    assert "/workspace" in capsys.readouterr().out
