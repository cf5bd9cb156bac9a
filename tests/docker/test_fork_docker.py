"""Live snapshots, restore and ``checkpoint="block"`` on the Docker kernel (runc and gVisor).

A snapshot is a paused fork of the kernel process inside the session's own container; a restore
makes a fresh fork of it the session's kernel (the container's first kernel retires into a
holder that only serves the reaper). The code inside is the attacker: it plants a link to / and
a FIFO in /workspace before the snapshot and the restore, kills the snapshot's process, and
kills its own kernel in a block; each ends in a clear error from the tree or a result that
says what happened, with nothing followed, opened or left running.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from kx_docker_helpers import (
    FORK_RUNTIMES,
    PLANT_LINK_AND_FIFO,
    containers_of,
    forking_backend,
    forking_session,
    require_runtime,
)

from kernelexec import ForkUnsupported, KernelExecutor, SessionBusy, SnapshotError
from kernelexec.backends.docker_kernel import DockerKernel

RUNTIMES = FORK_RUNTIMES
# A tree of the container's stopped processes (a paused snapshot is one): their pids.
_STOPPED = (
    "import os\n"
    "def stopped():\n"
    "    found = []\n"
    "    for p in os.listdir('/proc'):\n"
    "        try:\n"
    "            if p.isdigit() and open(f'/proc/{p}/stat').read().rsplit(') ', 1)[1][0] == 'T':\n"
    "                found.append(int(p))\n"
    "        except OSError:\n"
    "            pass\n"
    "    return found\n"
)


@pytest.fixture(scope="module", params=RUNTIMES)
def session(
    request: pytest.FixtureRequest, docker_client: docker.DockerClient
) -> Iterator[KernelExecutor]:
    with forking_session(docker_client, request.param) as ex:
        assert ex.execute(_STOPPED).ok
        yield ex


def test_restore_brings_the_snapshot_back_and_follows_no_planted_link(
    session: KernelExecutor,
) -> None:
    ex = session
    assert ex.execute(PLANT_LINK_AND_FIFO + "x = 1\nopen('a.txt', 'w').write('before')").ok
    started = time.monotonic()
    snap = ex.snapshot()
    took = time.monotonic() - started
    try:
        copy = Path(snap.aio._holder.work_dir)
        kinds = {p.name: stat.S_IFMT(p.lstat().st_mode) for p in copy.iterdir()}
        assert kinds.get("a.txt") == stat.S_IFREG  # the regular file was copied ...
        assert "root-link" not in kinds and "pipe" not in kinds  # ... the link and FIFO not
        pids = ex.execute("print(stopped())").output.strip()
        assert pids != "[]", "the snapshot is a paused process of the container"
        after = "x = 2\nopen('a.txt', 'w').write('after')\nopen('b.txt', 'w').write('new')\n"
        assert ex.execute(PLANT_LINK_AND_FIFO + after).ok
        ex.restore(snap)
        out = ex.execute(
            "print(x, open('a.txt').read(), os.path.exists('b.txt'), os.getcwd(),"
            " os.path.lexists('root-link'), open('/proc/self/oom_score_adj').read().strip())"
        )
        assert out.output.split() == ["1", "before", "False", "/workspace", "False", "1000"]
        assert not (Path(ex.work_dir) / "root-link").is_symlink()
        # the restored kernel is interrupted as any kernel (its state kept)
        slow = ex.execute("import time\ntime.sleep(30)", timeout=2)
        assert slow.exit_code != 0 and not slow.kernel_died
        assert ex.execute("print(x)").output.strip() == "1"
        ex.restore(snap)  # as often as asked
        assert ex.execute("print(x)").output.strip() == "1"
        child = ex.fork(via="snapshot")  # the route kept for a container of its own
        try:
            assert child.forked_via == "snapshot"
            # a.txt came in through the durable snapshot: the container user owns it again
            write = "open('c.txt', 'w').write('child'); open('a.txt', 'w').write('c'); print(x)"
            assert child.execute(write).output == "1\n"
        finally:
            child.close()
        assert not (Path(ex.work_dir) / "c.txt").exists()  # the child's folder is its own
    finally:
        snap.release()
    assert ex.execute("print(stopped())").output.strip() == "[]"  # its process was ended
    with pytest.raises(SnapshotError, match="released"):
        ex.restore(snap)
    print(f"snapshot took {took:.2f} s")


def test_a_snapshot_killed_by_the_code_cannot_be_restored(session: KernelExecutor) -> None:
    ex = session
    ex.execute("kept = 'session'")
    snap = ex.snapshot()
    try:
        # killed, then waited for: a loaded machine shows a killed process a while longer
        kill = "import signal, time\nfor p in stopped():\n    os.kill(p, signal.SIGKILL)\n"
        wait = "while stopped():\n    time.sleep(0.05)"
        out = ex.execute(kill + wait)
        assert out.ok, out.output
        with pytest.raises(SnapshotError, match="ended"):
            ex.restore(snap)
        assert ex.execute("print(kept)").output.strip() == "session"
    finally:
        snap.release()


def test_foreign_snapshots_and_a_running_block_are_refused(
    session: KernelExecutor, tmp_path: Path
) -> None:
    ex = session
    snap = ex.snapshot()
    other = KernelExecutor(work_dir=tmp_path)  # never started: refused before any kernel
    try:
        with pytest.raises(SnapshotError, match="another session"):
            other.restore(snap)
        job = ex.submit("import time\ntime.sleep(2)")
        with pytest.raises(SessionBusy):
            ex.snapshot()
        with pytest.raises(SessionBusy):
            ex.restore(snap)
        with pytest.raises(SessionBusy):
            ex.fork()
        assert job.wait(60).ok
    finally:
        other.close()
        snap.release()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_block_that_kills_its_kernel_costs_only_itself(
    runtime: str, docker_client: docker.DockerClient
) -> None:
    require_runtime(docker_client, runtime)
    backend = forking_backend(runtime)
    with KernelExecutor(backend, timeout=60, checkpoint="block") as ex:
        assert ex.execute("x = 1\nopen('kept.txt', 'w').write('1')").ok
        died = ex.execute("x = 2\nimport os\nos._exit(3)")
        assert died.kernel_died and not died.state_lost
        assert died.recovered_from == "checkpoint after block 1"
        assert ex.execute("print(x, open('kept.txt').read())").output.split() == ["1", "1"]
        crashed = ex.execute("import ctypes\nctypes.string_at(0)")  # a segfault
        assert crashed.kernel_died and crashed.recovered_from is not None
        assert ex.execute("print(x)").output.strip() == "1"
        first = backend.container.id
        ex.restart()  # a fresh container, the old one (its forks, its checkpoint) gone
        assert ex.execute("print('x' in dir())").output.strip() == "False"
        assert [c.id for c in containers_of(docker_client, backend.session)] != [first]
        assert len(containers_of(docker_client, backend.session)) == 1
    assert containers_of(docker_client, backend.session) == []


def test_gvisor_with_a_low_pids_limit_refuses_a_snapshot_and_a_fork(
    docker_client: docker.DockerClient,
) -> None:
    """Under gVisor the sandbox's own threads count against pids_limit: a fork under 256 was
    seen to end the whole container; it is refused instead, the session untouched, and a plain
    fork() goes through a snapshot into a container of its own."""
    require_runtime(docker_client, "runsc")
    backend = DockerKernel(runtime="runsc")
    with KernelExecutor(backend, timeout=60) as ex:
        ex.execute("y = 5")
        with pytest.raises(ForkUnsupported, match="pids_limit"):
            ex.snapshot()
        with pytest.raises(ForkUnsupported, match="pids_limit"):
            ex.fork(via="process")  # a live fork too, before any folder is made for it
        assert backend._branches is not None and list(backend._branches.iterdir()) == []
        assert ex.execute("print(y)").output.strip() == "5"
        child = ex.fork()  # a plain fork() takes the snapshot route instead, and says so
        try:
            assert child.forked_via == "snapshot"
            assert child.execute("print(y)").output.strip() == "5"
        finally:
            child.close()
        assert list(backend._branches.iterdir()) == []
