"""DockerOptions for containers kept and named, and for a work dir the engine sees elsewhere
(``bind_dir``): both Docker back ends, against a real engine."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kx_docker_helpers import containers_of

from kernelexec import (
    CommandLineExecutor,
    DockerCommand,
    DockerConfigError,
    DockerKernel,
    DockerOptions,
    KernelExecutor,
    make_executor,
)
from kernelexec.backends._docker import LABEL_OWNER_PID, LABEL_SESSION, gc

pytestmark = pytest.mark.docker

KINDS = ["command", "kernel"]


def make(kind: str, work: Path, **options: Any) -> CommandLineExecutor | KernelExecutor:
    if kind == "command":
        return CommandLineExecutor(backend=DockerCommand(**options), work_dir=work, timeout=30)
    return KernelExecutor(backend=DockerKernel(**options), work_dir=work, timeout=30)


@pytest.fixture
def name(docker_client: docker.DockerClient) -> Iterator[str]:
    """A container name no one uses; whatever carries it is removed afterwards."""
    chosen = f"kx-test-{uuid.uuid4().hex[:8]}"
    yield chosen
    with contextlib.suppress(docker.errors.NotFound):
        docker_client.containers.get(chosen).remove(force=True)


def test_the_registry_passes_the_options_through(tmp_path: Path) -> None:
    for name in ("docker-command", "docker-kernel"):
        ex = make_executor(
            name,
            work_dir=tmp_path,
            bind_dir=str(tmp_path),
            auto_remove=False,
            stop_container=False,
            container_name="kx-registry",
        )
        options: DockerOptions = ex.backend.options  # type: ignore[attr-defined]
        assert (options.bind_dir, options.container_name) == (str(tmp_path), "kx-registry")
        assert not options.auto_remove and not options.stop_container


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="bind_dir must be an absolute path"):
        DockerOptions(bind_dir="relative/path")
    with pytest.raises(ValueError, match="container_name"):
        DockerOptions(container_name=" ")
    assert not DockerOptions().keeps_container
    assert DockerOptions(auto_remove=False).keeps_container
    assert DockerOptions(stop_container=False).keeps_container


@pytest.mark.parametrize("kind", KINDS)
def test_container_name_is_used_and_a_name_in_use_is_a_clear_error(
    kind: str, docker_client: docker.DockerClient, tmp_path: Path, name: str
) -> None:
    with make(kind, tmp_path / "a", container_name=name) as ex:
        assert ex.execute("print('named')").output == "named\n"
        assert docker_client.containers.get(name).labels[LABEL_SESSION] == ex.backend.session  # type: ignore[attr-defined]
        other = make(kind, tmp_path / "b", container_name=name)
        with pytest.raises(DockerConfigError, match=f"container_name '{name}' is already in use"):
            other.start()
        other.close()
        assert ex.execute("print('still')").output == "still\n"
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(name)  # removed at close, as by default


@pytest.mark.parametrize("kind", KINDS)
def test_restart_with_a_container_name_replaces_the_container(
    kind: str, docker_client: docker.DockerClient, tmp_path: Path, name: str
) -> None:
    with make(kind, tmp_path, container_name=name) as ex:
        first = docker_client.containers.get(name).id
        ex.restart()
        assert ex.execute("print('again')").output == "again\n"
        assert docker_client.containers.get(name).id != first


@pytest.mark.parametrize("kind", KINDS)
def test_auto_remove_false_keeps_the_stopped_container_and_close_says_where(
    kind: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ex = make(kind, tmp_path, container_name=name, auto_remove=False)
    with ex, caplog.at_level(logging.WARNING, logger="kernelexec.docker"):
        ex.execute("open('made.txt', 'w').write('x')")
    kept = docker_client.containers.get(name)
    assert kept.status == "exited"
    assert kept.labels[LABEL_OWNER_PID] == str(os.getpid())
    backend: Any = ex.backend
    assert backend.kept is not None and name in backend.kept and "stopped" in backend.kept
    assert f"docker rm -f {name}" in backend.kept
    assert any(name in record.getMessage() for record in caplog.records)
    # The container's file system is there to inspect (the work dir is a mount: on the host).
    assert (tmp_path / "made.txt").read_text() == "x"


@pytest.mark.parametrize("kind", KINDS)
def test_stop_container_false_leaves_it_running(
    kind: str, docker_client: docker.DockerClient, tmp_path: Path, name: str
) -> None:
    ex = make(kind, tmp_path, container_name=name, stop_container=False)
    with ex:
        ex.execute("x = 1")
    assert docker_client.containers.get(name).status == "running"
    backend: Any = ex.backend
    assert backend.kept is not None and "running" in backend.kept
    if kind == "kernel":
        # The kernel still holds its state, and close() left a file to attach with.
        attach = Path(backend.kept.rsplit("--existing ", 1)[1].rstrip("`"))
        client = BlockingKernelClient()
        client.load_connection_file(str(attach))
        client.start_channels()
        try:
            reply = client.execute_interactive("print(x + 1)", timeout=30)
        finally:
            client.stop_channels()
        assert reply["content"]["status"] == "ok"
        shutil.rmtree(attach.parent, ignore_errors=True)


def test_gc_finds_a_kept_container_once_its_owner_has_exited(
    docker_client: docker.DockerClient, tmp_path: Path, name: str
) -> None:
    script = (
        "from kernelexec import CommandLineExecutor, DockerCommand\n"
        f"backend = DockerCommand(container_name={name!r}, auto_remove=False)\n"
        f"with CommandLineExecutor(backend=backend, work_dir={str(tmp_path)!r}) as ex:\n"
        "    ex.execute('print(1)')\n"
        "print(backend.kept)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert name in done.stdout
    kept = docker_client.containers.get(name)
    assert kept.short_id in gc(dry_run=True)
    assert kept.short_id in gc()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(name)


@pytest.mark.parametrize("kind", KINDS)
def test_bind_dir_that_does_not_exist_on_the_host_is_a_clear_error(
    kind: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    missing = tmp_path / "not-on-the-host"
    ex = make(kind, tmp_path / "work", bind_dir=str(missing))
    with pytest.raises(DockerConfigError, match=r"bind_dir .*not-on-the-host.* does not exist"):
        ex.start()
    ex.close()
    assert not missing.exists()  # the engine did not quietly create it
    assert containers_of(docker_client, ex.backend.session) == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", KINDS)
def test_bind_dir_that_is_another_folder_is_a_clear_error(
    kind: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ex = make(kind, tmp_path / "work", bind_dir=str(elsewhere))
    with pytest.raises(DockerConfigError, match="is not the work dir"):
        ex.start()
    ex.close()
    assert containers_of(docker_client, ex.backend.session) == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", KINDS)
def test_bind_dir_naming_the_same_folder_another_way(
    kind: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """A symlink stands in for the path the application sees: the engine gets bind_dir."""
    real = tmp_path / "real"
    real.mkdir()
    seen = tmp_path / "seen-here"
    seen.symlink_to(real)
    with make(kind, seen, bind_dir=str(real)) as ex:
        ex.execute("v = 5" if kind == "kernel" else "print(0)")
        r = ex.execute("open('out.txt', 'w').write('bound')")
        assert r.ok, r.output
    assert (real / "out.txt").read_text() == "bound"


def test_kernel_container_removed_from_outside_is_said_and_replaced(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    with KernelExecutor(backend=DockerKernel(), work_dir=tmp_path, timeout=30) as ex:
        ex.execute("lost = 1")
        backend = ex.backend
        assert isinstance(backend, DockerKernel)
        backend.container.remove(force=True)
        r = ex.execute("print('lost' in dir())")
        assert r.kernel_died and r.state_lost
        assert "container was removed from outside" in r.output
        assert ex.execute("print('back')").output == "back\n"


def test_a_deep_bind_dir_names_its_sockets_through_an_alias_gc_can_judge(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """A work dir too deep for a unix socket's path: the sockets are reached through a short
    alias in the temp folder, a folder carrying this process's owner record (so ``kernelexec
    gc`` can collect it once the process is gone), removed at close."""
    from kernelexec.backends._owner import ALIAS_PREFIX, OWNER_FILE, Owner, this_process

    work = tmp_path / ("d" * 60) / ("e" * 60)
    with make("kernel", work, bind_dir=str(work)) as ex:
        assert ex.execute("print(6 * 7)").output == "42\n"
        alias = ex.backend._alias  # type: ignore[attr-defined]
        assert alias is not None and alias.parent.name.startswith(ALIAS_PREFIX)
        assert alias.is_symlink() and not alias.parent.is_symlink()
        record = Owner.from_text((alias.parent / OWNER_FILE).read_text())
        assert record == this_process()
    assert not os.path.lexists(alias.parent)


@pytest.mark.parametrize("plant", ["connection-file", "runtime-folder"])
def test_a_link_planted_after_the_runtime_folder_was_made_is_not_followed(
    docker_client: docker.DockerClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    plant: str,
) -> None:
    """With bind_dir the runtime folder lies in the work dir's ``.kernelexec``. A link put
    there right after the door made it (at the connection file's name, or in place of
    ``.kernelexec`` with a folder of the same name behind it) is not written through, chowned
    or mounted: the host folder stays as it was, and the kernel still starts."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "kernel.json").write_text("host file")
    original = DockerKernel._make_runtime_dir

    def planting(self: DockerKernel) -> Path:
        runtime = original(self)
        if plant == "connection-file":
            (runtime / "kernel.json").symlink_to(host / "kernel.json")
        else:
            own = runtime.parent
            (host / runtime.name).mkdir()
            own.rename(own.with_name("moved"))
            own.symlink_to(host, target_is_directory=True)
        return runtime

    monkeypatch.setattr(DockerKernel, "_make_runtime_dir", planting)
    work = tmp_path / "work"
    with make("kernel", work, bind_dir=str(work)) as ex:
        assert ex.execute("print(6 * 7)").output == "42\n"
    assert (host / "kernel.json").read_text() == "host file"
    assert os.stat(host).st_uid == os.getuid()
    assert all(
        p.stat().st_uid == os.getuid() and not any(p.iterdir())
        for p in host.glob("kernelexec-run-*")
    )
