"""``kernelexec gc`` after a host was killed outright (SIGKILL): it lists, by kind, everything
the host left (a local kernel's and a forked kernel's private temp folder, a Docker kernel's
container), removes it, and leaves alone what a live process made and anything planted to
look like kernelexec's (a link to ``/etc``, another user's folder, a folder with no record).

Each case runs with a temp folder of its own (``TMPDIR``), so the gc it runs sees its folders
only; containers and cgroups are the machine's (only those of dead owners are removed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from kernelexec.backends._docker import labels_for
from kernelexec.backends._docker_options import DEFAULT_IMAGE, DockerOptions
from kernelexec.backends._owner import (
    INDEX_ENV,
    OWNER_ENV,
    OWNER_FILE,
    OWNER_LINE,
    Owner,
    mark_folder,
    owner_line,
    owner_state,
    this_process,
)

HOST = Path(__file__).with_name("kx_leftovers_host.py")
ROOT = Path(__file__).resolve().parents[2]


def require_docker(problem: str | None) -> None:
    """Skip without an engine and the image; fail instead with KERNELEXEC_REQUIRE_DOCKER=1."""
    if problem is not None:
        if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":
            pytest.fail(f"{problem} (KERNELEXEC_REQUIRE_DOCKER=1, so this is a failure)")
        pytest.skip(problem)


@pytest.fixture
def tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A short temp folder of the case's own (a unix socket's path holds 107 bytes at most),
    and a gc index of its own (the folders made outside the standard temp folder)."""
    path = tempfile.mkdtemp(prefix="kxgc-")
    monkeypatch.setenv(INDEX_ENV, os.path.join(path, "index"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(tmp: str) -> dict[str, str]:
    env = {
        **os.environ,
        INDEX_ENV: os.path.join(tmp, "index"),
        "TMPDIR": tmp,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HOST.parent)]),
    }
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _killed_host(tmp: str, *names: str) -> dict[str, Any]:
    """Run the host with kernels of ``names``, SIGKILL it once they answered: what it made."""
    status = Path(tmp) / "status.json"
    argv = [sys.executable, str(HOST), str(status), os.path.join(tmp, "work"), *names]
    with open(Path(tmp) / "host.log", "wb") as log:
        host = subprocess.Popen(argv, stdout=log, stderr=log, env=_env(tmp))
        try:
            deadline = time.monotonic() + 120
            while not status.exists() and host.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            host.kill()
            host.wait(30)
    assert status.exists(), (Path(tmp) / "host.log").read_text()[-3000:]
    info: dict[str, Any] = json.loads(status.read_text())
    return info


def _gc(tmp: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kernelexec", "gc", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(tmp),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _line(out: str, kind: str) -> str:
    lines = [line for line in out.splitlines() if f" {kind}" in line]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.kernel
def test_gc_removes_the_temp_folders_of_a_killed_host_and_nothing_else(tmp: str) -> None:
    info = _killed_host(tmp, "kernel", "fork-kernel")
    dead = [info["kernel"]["folder"], info["fork-kernel"]["folder"]]
    assert all(Path(d).parent == Path(tmp) and Path(d, OWNER_FILE).is_file() for d in dead)
    record = Path(dead[0], OWNER_FILE).read_text()

    live = tempfile.mkdtemp(prefix="kernelexec-ipc-", dir=tmp)  # this process is alive
    mark_folder(live)
    no_record = tempfile.mkdtemp(prefix="kernelexec-fork-", dir=tmp)  # not ours to judge
    # A link named like ours, to a folder holding a dead owner's record: never followed.
    target = Path(tempfile.mkdtemp(dir=tmp))
    (target / OWNER_FILE).write_text(record)
    os.symlink(target, os.path.join(tmp, "kernelexec-fork-link"))
    os.symlink("/etc", os.path.join(tmp, "kernelexec-fork-etc"))
    # A dead owner's folder holding a link out (to a file and to a folder): removed, the
    # link's targets untouched.
    victim = Path(tmp) / "victim.txt"
    victim.write_text("keep me")
    outside = Path(tempfile.mkdtemp(dir=tmp))
    (outside / "precious").write_text("keep me too")
    planted = Path(tempfile.mkdtemp(prefix="kernelexec-fork-", dir=tmp))
    (planted / OWNER_FILE).write_text(record)
    (planted / "link").symlink_to(victim)
    (planted / "dir-link").symlink_to(outside, target_is_directory=True)
    # Its record a link to the dead owner's record: not a record.
    linked = Path(tempfile.mkdtemp(prefix="kernelexec-ipc-", dir=tmp))
    (linked / OWNER_FILE).symlink_to(target / OWNER_FILE)
    # A launcher log (a provisioned kernel's) of the dead owner: removed; a live owner's and
    # a link of that name to the dead one's: kept.
    log = Path(tmp, "kernelexec-launcher-dead.log")
    log.write_text(f"{OWNER_LINE}{record}\nthe launcher said\n")
    live_log = Path(tmp, "kernelexec-launcher-live.log")
    live_log.write_bytes(owner_line())
    Path(tmp, "kernelexec-launcher-link.log").symlink_to(log)
    others = None
    if os.geteuid() == 0:  # another user's folder with a dead owner's record: not ours
        others = Path(tempfile.mkdtemp(prefix="kernelexec-ipc-", dir=tmp))
        (others / OWNER_FILE).write_text(record)
        os.chown(others / OWNER_FILE, 65534, 65534)
        os.chown(others, 65534, 65534)

    would = _line(_gc(tmp, "--dry-run"), "temp folder(s)")
    listed = set(would.partition(": ")[2].split())
    assert listed == {*dead, str(planted), str(log)}, would
    assert would.startswith("would remove 4 temp folder(s)")
    assert all(Path(d).is_dir() for d in dead)  # a dry run removes nothing

    done = _line(_gc(tmp), "temp folder(s)")
    assert set(done.partition(": ")[2].split()) == listed
    assert not any(os.path.lexists(d) for d in [*dead, str(planted), str(log)])
    assert live_log.is_file() and Path(tmp, "kernelexec-launcher-link.log").is_symlink()
    assert Path(live, OWNER_FILE).is_file() and Path(no_record).is_dir()
    assert (target / OWNER_FILE).is_file() and Path(tmp, "kernelexec-fork-link").is_symlink()
    assert Path("/etc/passwd").is_file() and Path(tmp, "kernelexec-fork-etc").is_symlink()
    assert victim.read_text() == "keep me" and (outside / "precious").read_text() == "keep me too"
    assert linked.is_dir() and (others is None or others.is_dir())


@pytest.mark.docker
def test_gc_removes_the_container_of_a_killed_host_and_keeps_a_live_owners(
    tmp: str, docker_problem: str | None
) -> None:
    require_docker(docker_problem)
    client = docker.from_env()
    # A live owner's container (this process's record): kept.
    live = client.containers.create(
        DEFAULT_IMAGE, ["true"], labels=labels_for("test", "gc-live", DockerOptions())
    )
    try:
        info = _killed_host(tmp, "docker-kernel")
        label = f"kernelexec.session={info['docker-kernel']['session']}"
        (left,) = client.containers.list(all=True, ignore_removed=True, filters={"label": label})
        branches = Path(info["docker-kernel"]["branches"])
        assert branches.name.startswith("kernelexec-branches-") and branches.is_dir()

        would = _line(_gc(tmp, "--dry-run"), "container(s)")
        assert left.short_id in would and live.short_id not in would
        assert client.containers.list(
            all=True, ignore_removed=True, filters={"label": label}
        )  # dry run

        done = _line(_gc(tmp), "container(s)")
        assert left.short_id in done and live.short_id not in done
        assert client.containers.list(all=True, ignore_removed=True, filters={"label": label}) == []
        assert not branches.exists()  # its live forks' folder went with it
        live.reload()  # still there
    finally:
        live.remove(force=True)
        client.close()


@pytest.mark.docker
def test_an_owner_in_a_container_is_told_alive_then_gone_from_outside(
    docker_problem: str | None,
) -> None:
    """A host in a container (Docker out of Docker, a provisioned kernel's client) is another
    pid namespace: seen from this machine's own namespace, as root, it is found while it runs
    and gone once its container is; elsewhere no verdict is given."""
    require_docker(docker_problem)
    code = (
        "import sys, time; sys.path.insert(0, '/kx')\n"
        "from kernelexec.backends._owner import this_process\n"
        "print(this_process().to_text(), flush=True); time.sleep(600)\n"
    )
    client = docker.from_env()
    container = client.containers.run(
        DEFAULT_IMAGE,
        ["python3", "-c", code],
        volumes={str(ROOT): {"bind": "/kx", "mode": "ro"}},
        user="1000:1000",
        network_mode="none",
        detach=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (text := container.logs().decode()) and time.monotonic() < deadline:
            time.sleep(0.1)
        owner = Owner.from_text(text.strip())
        assert owner is not None and owner.pidns != this_process().pidns, text
        sees_all = this_process().pidns == "pid:[4026531836]" and os.geteuid() == 0
        assert owner_state(owner) == ("alive" if sees_all else "unknown")
        container.kill()
        container.wait(timeout=30)
        assert owner_state(owner) == ("gone" if sees_all else "unknown")
    finally:
        container.remove(force=True)
        client.close()


def _dead_record() -> str:
    """The owner record of a process that has exited."""
    code = "from kernelexec.backends._owner import this_process; print(this_process().to_text())"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_env(tempfile.gettempdir()),
    )
    return done.stdout.strip()


@pytest.mark.docker
def test_gc_removes_a_launcher_made_container_only_with_a_dead_owners_record(
    tmp: str, docker_problem: str | None
) -> None:
    """A provisioner's launcher (Docker, not Swarm) makes the kernel's container with the
    launching environment, the owner record included: that is what gc goes by."""
    require_docker(docker_problem)
    client = docker.from_env()
    made = []

    def launched(record: str | None) -> Any:
        env = {} if record is None else {OWNER_ENV: record}
        made.append(
            client.containers.create(
                DEFAULT_IMAGE, ["true"], labels={"kernel_id": "kx-gc-test"}, environment=env
            )
        )
        return made[-1]

    try:
        dead = launched(_dead_record())
        live = launched(this_process().to_text())
        foreign = launched(None)  # another launcher's container: not ours
        line = _line(_gc(tmp, "--dry-run"), "container(s)")
        assert dead.short_id in line
        assert live.short_id not in line and foreign.short_id not in line
        assert dead.short_id in _line(_gc(tmp), "container(s)")
        left = {
            c.id
            for c in client.containers.list(
                all=True, ignore_removed=True, filters={"label": "kernel_id"}
            )
        }
        assert dead.id not in left and {live.id, foreign.id} <= left
    finally:
        for container in made:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
        client.close()


def test_gc_removes_a_dead_owners_runtime_alias_never_its_target(
    tmp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Docker kernel with a deep ``bind_dir`` work dir names its sockets through a short
    alias in the temp folder (``kernelexec-run-link-*``): a folder with the owner's record and
    one link. Its owner gone, gc removes the folder; the runtime folder it points at (in the
    work dir) stays; a live owner's alias and a bare link of that name stay."""
    from kernelexec.backends.docker_kernel import drop_alias, short_alias

    runtime = Path(tempfile.mkdtemp(dir=tmp))
    (runtime / "kernel-1").write_text("socket stand-in")
    made = subprocess.run(  # its owner: a process that is gone when gc runs
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from kernelexec.backends.docker_kernel import short_alias; "
            "print(short_alias(Path(sys.argv[1])))",
            str(runtime),
        ],
        capture_output=True,
        text=True,
        env=_env(tmp),
        check=True,
        timeout=60,
    )
    dead = Path(made.stdout.strip())
    assert dead.parent.parent == Path(tmp) and dead.is_symlink()
    assert (dead / "kernel-1").read_text() == "socket stand-in"
    monkeypatch.setattr(tempfile, "tempdir", tmp)
    live = short_alias(runtime)  # this process: alive
    bare = Path(tmp, "kernelexec-run-link-bare")
    bare.symlink_to(runtime, target_is_directory=True)

    would = _line(_gc(tmp, "--dry-run"), "temp folder(s)")
    assert would.partition(": ")[2].split() == [str(dead.parent)], would
    _gc(tmp)
    assert not os.path.lexists(dead.parent)
    assert (runtime / "kernel-1").read_text() == "socket stand-in"  # the target: untouched
    assert live.is_symlink() and bare.is_symlink()
    drop_alias(live, kept=False)
    assert not os.path.lexists(live.parent) and runtime.is_dir()


def test_gc_finds_a_dead_owners_folder_made_under_another_tmpdir(tmp: str) -> None:
    """A host run with another ``TMPDIR`` notes its private folders in the gc index; gc run
    with any ``TMPDIR`` removes those whose owner is gone, and leaves a live owner's, a link
    the index names, and entries naming anything but kernelexec's folders."""
    elsewhere = Path(tmp, "elsewhere")
    elsewhere.mkdir()
    env = {**_env(tmp), "TMPDIR": str(elsewhere)}
    made = subprocess.run(  # its owner: a process that is gone when gc runs
        [
            sys.executable,
            "-c",
            "import tempfile; from kernelexec.backends._owner import "
            "mark_folder; d = tempfile.mkdtemp(prefix='kernelexec-ipc-'); mark_folder(d); print(d)",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    dead = made.stdout.strip()
    assert Path(dead).parent == elsewhere and Path(dead, OWNER_FILE).is_file()
    live = tempfile.mkdtemp(prefix="kernelexec-fork-", dir=elsewhere)
    mark_folder(live)  # this process: alive
    index = Path(tmp, "index")
    assert sorted(p.read_text() for p in index.iterdir()) == sorted([dead, live])
    # Entries planted in the index: a link named like ours to a dead owner's folder copy, and
    # a path that is not kernelexec's (never removed, whatever its record says).
    copy = Path(tempfile.mkdtemp(dir=tmp))
    shutil.copy(Path(dead, OWNER_FILE), copy / OWNER_FILE)
    link = elsewhere / "kernelexec-ipc-link"
    link.symlink_to(copy, target_is_directory=True)
    (index / "link.path").write_text(str(link))
    (index / "copy.path").write_text(str(copy))

    would = _line(_gc(tmp, "--dry-run"), "temp folder(s)")  # TMPDIR: tmp, not elsewhere
    assert would.partition(": ")[2].split() == [dead], would
    _gc(tmp)
    assert not os.path.lexists(dead) and Path(live, OWNER_FILE).is_file()
    assert link.is_symlink() and (copy / OWNER_FILE).is_file()
    assert not Path(index, Path(dead).name + ".path").exists()  # its entry went with it
