"""``fork()`` of a Docker kernel (runc and gVisor): a process fork inside the session's own
container, working in a fresh folder of its own under ``/kx-branches``.

The code inside is the attacker: it plants a link to / and a FIFO in /workspace and in a fork's
own folder before forking, and tries to make, list, replace or pre-create folders in
/kx-branches (root's, which the container user may only traverse). Nothing is followed, opened
or copied; the child has the parent's variables and a copy of its files; their writes by
relative path stay apart. The container lives until the last of the session and its forks is
closed, whichever order they close in; then no container, folder or process is left.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from kx_close import host_processes_with, unique_seconds
from kx_docker_helpers import (
    FORK_RUNTIMES,
    PLANT_LINK_AND_FIFO,
    containers_of,
    forking_backend,
    forking_session,
    require_runtime,
)

from kernelexec import KernelExecutor

RUNTIMES = FORK_RUNTIMES
# Each try at /kx-branches itself: listing it (the forks' names), planting a link or a FIFO at
# a name a fork could get, making a folder there.
_PROBE = (
    "import os\n"
    "tries = [lambda: os.listdir('/kx-branches'), lambda: os.symlink('/', '/kx-branches/fork-x'),\n"
    "         lambda: os.mkdir('/kx-branches/fork-y'), lambda: os.mkfifo('/kx-branches/p')]\n"
    "for attempt in tries:\n"
    "    try:\n"
    "        attempt()\n"
    "        print('done')\n"
    "    except PermissionError:\n"
    "        print('refused')\n"
)


def _kinds(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IFMT(p.lstat().st_mode) for p in folder.iterdir()}


@pytest.fixture(scope="module", params=RUNTIMES)
def session(
    request: pytest.FixtureRequest, docker_client: docker.DockerClient
) -> Iterator[KernelExecutor]:
    with forking_session(docker_client, request.param) as ex:
        yield ex


def test_forks_hold_the_state_and_a_copy_of_the_files_and_nothing_planted(
    session: KernelExecutor,
) -> None:
    ex = session
    assert ex.execute(PLANT_LINK_AND_FIFO + "x = 41\nopen('a.txt', 'w').write('parent')").ok
    assert ex.execute(_PROBE).output.split() == ["refused"] * 4
    forks = ex.fork(n=3)
    try:
        cwds = set()
        for child in forks:
            assert child.forked_via == "process"
            home = Path(child.work_dir)
            kinds = _kinds(home)
            assert kinds.get("a.txt") == stat.S_IFREG  # the regular file was copied ...
            assert "root-link" not in kinds and "pipe" not in kinds  # ... the link and FIFO not
            out = child.execute("import os\nprint(x + 1, open('a.txt').read(), os.getcwd())")
            assert out.output.split() == ["42", "parent", f"/kx-branches/{home.name}"]
            cwds.add(home.name)
        assert len(cwds) == 3
        first = forks[0]
        # Writes by relative path stay apart, both ways.
        assert first.execute("open('a.txt', 'w').write('child')\nopen('b.txt', 'w').write('b')").ok
        assert ex.execute("open('c.txt', 'w').write('c')").ok
        seen = ex.execute("print(open('a.txt').read(), os.path.exists('b.txt'))").output.split()
        assert seen == ["parent", "False"]
        assert first.execute("print(os.path.exists('c.txt'))").output.strip() == "False"
        assert (Path(first.work_dir) / "a.txt").read_text() == "child"
        assert not (Path(ex.work_dir) / "b.txt").exists()
        # An absolute /workspace path in a fork still names the session's folder (documented).
        assert first.execute("print(open('/workspace/a.txt').read())").output.strip() == "parent"
        # The fork cannot move its own folder away, nor touch /kx-branches; what it plants in
        # its folder is not copied into its own fork.
        rename = (
            "try:\n    os.rename(os.getcwd(), '/kx-branches/mine')\n"
            "except PermissionError:\n    print('refused')\n"
        )
        assert first.execute(PLANT_LINK_AND_FIFO + rename).output.strip() == "refused"
        assert first.execute(_PROBE).output.split() == ["refused"] * 4
        # A fork's own snapshot, restored, works in the fork's folder still.
        snap = first.snapshot()
        try:
            assert first.execute("os.remove('b.txt')").ok
            first.restore(snap)
            where = first.execute("print(os.getcwd(), os.path.exists('b.txt'))").output.split()
            assert where == [f"/kx-branches/{Path(first.work_dir).name}", "True"]
        finally:
            snap.release()
        grand = first.fork()
        try:
            kinds = _kinds(Path(grand.work_dir))
            assert "root-link" not in kinds and "pipe" not in kinds and "b.txt" in kinds
            assert grand.execute("print(x, open('a.txt').read())").output.split() == ["41", "child"]
        finally:
            grand.close()
        assert not Path(grand.work_dir).exists()
    finally:
        for child in forks:
            child.close()
    assert ex.execute("print(x)").output.strip() == "41"  # the session was undisturbed


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_container_lives_until_the_last_of_the_session_and_its_forks_closes(
    runtime: str, docker_client: docker.DockerClient
) -> None:
    require_runtime(docker_client, runtime)
    backend = forking_backend(runtime)
    marker = unique_seconds()
    ex = KernelExecutor(backend, timeout=60)
    forks: list[KernelExecutor] = []
    try:
        assert ex.execute("x = 7").ok
        forks = ex.fork(n=2)
        early, late = forks
        branches = backend._branches
        assert branches is not None and branches.is_dir()
        early.close()  # a fork closed first: the session and the other fork go on
        assert not Path(early.work_dir).exists()
        assert ex.execute("print(x)").output.strip() == "7"
        ex.close()  # the session closed while a fork runs: the fork goes on in the container
        assert len(containers_of(docker_client, backend.session)) == 1
        block = (
            "import subprocess\n"
            f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
            "print(x * 6)"
        )
        assert late.execute(block).output.strip() == "42"
        assert late.fork().close() is None  # a fork of it, after the session closed, too
    finally:
        ex.close()
        for child in forks:
            child.close()
    assert containers_of(docker_client, backend.session) == []  # the last one out removed it
    assert not branches.exists()  # and the folder its forks worked in
    assert host_processes_with(marker) == []  # and what a fork's block left running
