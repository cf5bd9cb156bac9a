"""Forking a live session and live snapshots (issue 35, items 1 and 2), on real kernels.

A fork is a new executor whose kernel is the running kernel forked copy-on-write: same state,
its own process, process group, cgroup, sockets and work dir (a copy); the parent undisturbed.
A live snapshot is a paused fork, restored by forking it again into the session."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kx_containment import our_cgroups
from kx_fork import cgroup_of, gone_within, kernel_pid, running
from kx_snapshots import resign

from kernelexec import (
    ForkKernel,
    ForkUnsupported,
    KernelExecutor,
    KernelStartFailed,
    SessionBusy,
    SnapshotError,
    make_executor,
)
from kernelexec.backends.gateway_kernel import GatewayKernel

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def ex() -> Iterator[KernelExecutor]:
    """One local kernel holding a little state (a number, an array, a function, a file)."""
    with KernelExecutor(timeout=60) as executor:
        r = executor.execute(
            "import numpy as np\nx = 41\na = np.arange(10)\ndef f(v): return v * 2\n"
            "open('data.txt', 'w').write('parent data')\n"
        )
        assert r.exit_code == 0, r.output
        yield executor


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    """A fork-server kernel (another session, and the other back end that forks)."""
    work = tmp_path_factory.mktemp("fork-session")
    with make_executor("fork-kernel", work_dir=work, timeout=60) as executor:
        assert isinstance(executor, KernelExecutor)
        yield executor


def _our_fork_folders() -> set[Path]:
    """The fork folders this test process made (other xdist workers make theirs meanwhile)."""
    from kernelexec.backends._owner import OWNER_FILE, Owner

    found = set()
    for folder in Path(tempfile.gettempdir()).glob("kernelexec-fork-*"):
        try:
            owner = Owner.from_text((folder / OWNER_FILE).read_text())
        except OSError:
            continue
        if owner is not None and owner.pid == os.getpid():
            found.add(folder)
    return found


def test_a_fork_holds_the_state_and_the_two_diverge(ex: KernelExecutor) -> None:
    child = ex.fork()
    try:
        assert isinstance(child, KernelExecutor)
        r = child.execute("x += 1\nprint(x, a.sum(), f(4), open('data.txt').read())")
        assert r.exit_code == 0, r.output
        assert r.output.split() == ["42", "45", "8", "parent", "data"]
        # Its work dir is a copy: a write there is the child's alone, and the kernel runs in it.
        assert child.work_dir != ex.work_dir
        child.execute("open('data.txt', 'w').write('child data')")
        assert (ex.work_dir / "data.txt").read_text() == "parent data"
        assert child.execute("import os; print(os.getcwd())").output.strip() == str(child.work_dir)
        assert ex.execute("print(x)").output.strip() == "41"
        child.execute("only_in_child = 1")
        assert ex.execute("only_in_child").exit_code != 0
    finally:
        child.close()
    assert ex.execute("print(x + 1)").output.strip() == "42"  # the parent carries on


def test_a_fork_captures_output_and_keeps_state_on_interrupt(ex: KernelExecutor) -> None:
    """The child's own output capture (fd 1, a subprocess) and its own interrupt handling."""
    child = ex.fork()
    try:
        out = child.execute(
            "import os, subprocess\nos.write(1, b'fd-level\\n')\n"
            "_ = subprocess.run(['echo', 'from a subprocess'])"
        ).output
        assert out.split("\n")[:2] == ["fd-level", "from a subprocess"]
        stuck = child.execute("import time\nx = 2\ntime.sleep(60)", timeout=2)
        assert stuck.timed_out
        assert child.execute("print(x)").output.strip() == "2"
    finally:
        child.close()
    assert ex.execute("print(x)").output.strip() == "41"


def test_the_parent_is_undisturbed(ex: KernelExecutor) -> None:
    """No name, history entry, execution count or output of the fork in the parent."""
    probe = "print(len(In), sorted(k for k in globals() if 'kx' in k))"
    before = ex.execute(probe).output
    child = ex.fork()
    child.close()
    after = ex.execute(probe).output
    count_before, names_before = before.split(" ", 1)
    count_after, names_after = after.split(" ", 1)
    assert int(count_after) == int(count_before) + 1  # the probe itself, nothing else
    assert names_after == names_before  # no name of kernelexec's was added


def test_each_fork_is_its_own_process_group_and_cgroup(ex: KernelExecutor) -> None:
    parent = kernel_pid(ex)
    forks = ex.fork(n=3)
    try:
        assert len(forks) == 3
        pids = [kernel_pid(c) for c in forks]
        assert len({parent, *pids}) == 4
        for pid in pids:
            assert os.getpgid(pid) == pid  # it leads its own group: killed with it
            assert cgroup_of(pid) != cgroup_of(parent)
        values = [c.execute("print(x)").output for c in forks]
        assert values == ["41\n"] * 3
    finally:
        for c in forks:
            c.close()
    for pid in pids:
        assert gone_within(pid), f"fork {pid} still runs after close()"


def test_a_fork_of_a_fork_server_kernel(fx: KernelExecutor) -> None:
    fx.execute("z = [1, 2, 3]")
    child = fx.fork()
    try:
        assert child.execute("z.append(4); print(z)").output.strip() == "[1, 2, 3, 4]"
        grandchild = child.fork()  # a fork forks too
        try:
            assert grandchild.execute("print(len(z))").output.strip() == "4"
        finally:
            grandchild.close()
        assert fx.execute("print(z)").output.strip() == "[1, 2, 3]"
    finally:
        child.close()


def test_fork_while_a_block_runs_is_refused(ex: KernelExecutor) -> None:
    results = []
    block = "import time\ntime.sleep(2)\nprint('done')"
    runner = threading.Thread(target=lambda: results.append(ex.execute(block)))
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while not ex.aio._lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(SessionBusy, match="block is running"):
            ex.fork()
        with pytest.raises(SessionBusy):
            ex.snapshot()
        with pytest.raises(SessionBusy):
            ex.snapshot(Path("never-written.kx"), key=b"k" * 32)
    finally:
        runner.join()
    assert results[0].output.strip() == "done"  # the block was not disturbed


def test_a_failed_fork_leaves_nothing_and_the_parent_carries_on(fx: KernelExecutor) -> None:
    """The kernel's fork fails (as with no memory left: ENOMEM): a clear error, no folder, no
    cgroup, no process left, the session as it was. (os.fork is replaced inside the kernel:
    a real out-of-memory fork cannot be caused reliably on a shared machine.)"""
    fx.execute(
        "import os, errno\nkept = 7\n_real_fork = os.fork\n"
        "def _no_memory(): raise OSError(errno.ENOMEM, 'Cannot allocate memory')\n"
        "os.fork = _no_memory"
    )
    cgroups = set(our_cgroups())
    folders = _our_fork_folders()
    try:
        with pytest.raises(KernelStartFailed, match=r"could not fork.*Cannot allocate memory"):
            fx.fork()
        assert set(our_cgroups()) == cgroups
        assert _our_fork_folders() <= folders
    finally:
        fx.execute("os.fork = _real_fork")
    assert fx.execute("print(kept)").output.strip() == "7"


def test_nothing_is_left_running_after_close(tmp_path: Path) -> None:
    """A fork's block starts a process in a new session; closing parent and fork ends all,
    and removes every cgroup they made."""
    before = set(our_cgroups())
    parent = make_executor("fork-kernel", work_dir=tmp_path, timeout=60)
    assert isinstance(parent, KernelExecutor)
    parent.execute("x = 1")
    child = parent.fork()
    snap = parent.snapshot()
    pids = [kernel_pid(parent), kernel_pid(child), snap.aio._holder.backend.pid]
    escaped = child.execute(
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
        " start_new_session=True)\nprint(p.pid)"
    )
    pids.append(int(escaped.output))
    parent.close()  # its snapshot goes with it; the fork does not
    assert running(pids[1]) and running(pids[3])
    assert child.execute("print(x)").output.strip() == "1"
    child.close()
    for pid in pids:
        assert gone_within(pid), f"{pid} still runs"
    assert set(our_cgroups()) <= before


def test_snapshot_restore_release(ex: KernelExecutor) -> None:
    ex.execute("counter = 1\nopen('state.txt', 'w').write('one')")
    snap = ex.snapshot()
    assert not snap.released
    ex.execute("counter = 2\nopen('state.txt', 'w').write('two')\nopen('new.txt', 'w').close()")
    ex.restore(snap)
    assert ex.execute("print(counter, x)").output.split() == ["1", "41"]
    assert (ex.work_dir / "state.txt").read_text() == "one"
    assert not (ex.work_dir / "new.txt").exists()
    assert ex.execute("import os; print(os.getcwd())").output.strip() == str(ex.work_dir)
    ex.execute("counter = 3")
    ex.restore(snap)  # a snapshot restores as often as asked
    assert ex.execute("print(counter)").output.strip() == "1"
    snap.release()
    snap.release()  # twice is fine
    assert snap.released
    with pytest.raises(SnapshotError, match="released"):
        ex.restore(snap)
    assert ex.execute("print(counter)").output.strip() == "1"


def test_a_snapshot_of_another_session_is_refused(ex: KernelExecutor, fx: KernelExecutor) -> None:
    fx.execute("secret = 1")
    snap = fx.snapshot()
    try:
        with pytest.raises(SnapshotError, match="another session"):
            ex.restore(snap)
        with pytest.raises(SnapshotError, match="not a live snapshot"):
            ex.restore(42)  # type: ignore[arg-type]
        with pytest.raises(SnapshotError, match="cannot read the snapshot"):
            ex.restore("no such file.kx", key=KEY)
    finally:
        snap.release()
    assert ex.execute("secret").exit_code != 0


def test_a_fork_restores_its_parents_snapshot(ex: KernelExecutor) -> None:
    """Tree search: a snapshot of the root restores into any branch of it."""
    ex.execute("level = 'root'")
    snap = ex.snapshot()
    child = ex.fork()
    try:
        child.execute("level = 'branch'")
        child.restore(snap)
        assert child.execute("print(level)").output.strip() == "root"
    finally:
        child.close()
        snap.release()


def test_back_ends_that_cannot_fork_say_so(tmp_path: Path) -> None:
    """A live snapshot of a gateway's kernel is refused before any kernel starts (its fork
    goes through a durable snapshot; the Docker kernel's live snapshots:
    tests/docker/test_fork_docker.py)."""
    executor = KernelExecutor(GatewayKernel("http://127.0.0.1:9"), work_dir=tmp_path)
    local = KernelExecutor(work_dir=tmp_path / "local")
    try:
        with pytest.raises(ForkUnsupported):
            executor.snapshot()
        with pytest.raises(ForkUnsupported, match="process"):
            executor.fork(via="process")  # a gateway's kernel is not a process of ours
        with pytest.raises(ForkUnsupported, match="snapshot"):
            local.fork(via="snapshot")  # no fresh kernel of its kind to load one into
        with pytest.raises(ValueError, match="via"):
            local.fork(via="container")
        assert not local.aio._started  # each refused before any kernel started
    finally:
        executor.close()
        local.close()


def test_a_fork_restarts_into_a_fresh_kernel(ex: KernelExecutor) -> None:
    child = ex.fork()
    try:
        child.restart()
        assert child.execute("x").exit_code != 0  # state is lost, as with any restart
        assert child.execute("print(1 + 1)").output.strip() == "2"
    finally:
        child.close()


# -- durable snapshots ---------------------------------------------------------------------------
KEY = b"k" * 32


@pytest.fixture(scope="module")
def saved(ex: KernelExecutor, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A durable snapshot of a session holding what pickles and what cannot."""
    ex.execute(
        "import json as j\nkept = {'a': [1, 2]}\nclass Model:\n    k = 3\n"
        "def double(v): return v * 2\ngen = (i for i in range(3))\n"
        "import threading\nguard = threading.Lock()\nopen('notes.txt', 'w').write('saved')"
    )
    path = tmp_path_factory.mktemp("durable") / "session.kx"
    manifest = ex.snapshot(path, key=KEY)
    assert manifest.names["kept"] == "saved"
    assert manifest.imports["j"] == "json"
    return path


def test_a_durable_snapshot_resumes_in_a_fresh_kernel(saved: Path, tmp_path: Path) -> None:
    resumed = KernelExecutor.resume(
        saved, key=KEY, backend=ForkKernel(), work_dir=tmp_path, timeout=60
    )
    try:
        out = resumed.execute(
            "print(kept['a'], Model.k, double(4), j.dumps(1), x, open('notes.txt').read())"
        )
        assert out.output.split() == ["[1,", "2]", "3", "8", "1", "41", "saved"], out.output
        manifest = resumed.restored
        assert manifest is not None and manifest.names["double"] == "restored"
        why = manifest.not_restorable
        assert "generator" in why["gen"] and "lock" in why["guard"]  # nothing silently missing
        assert resumed.execute("gen").exit_code != 0
    finally:
        resumed.close()


def test_a_bad_snapshot_file_is_refused_before_anything_is_read(
    saved: Path, tmp_path: Path
) -> None:
    data = saved.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    cases = {
        "truncated": data[: len(data) - 7],
        "tampered": bytes(flipped),
        "unsigned": b"KXSNAP1\n" + bytes(32) + data[40:],
        "not a snapshot": b"print('hello')\n",
    }
    for name, content in cases.items():
        bad = tmp_path / f"{name.replace(' ', '-')}.kx"
        bad.write_bytes(content)
        with pytest.raises(SnapshotError, match=r"signature does not match|not a kernelexec"):
            KernelExecutor.resume(bad, key=KEY, backend=ForkKernel(), timeout=60)
    with pytest.raises(SnapshotError, match="signature does not match"):
        KernelExecutor.resume(saved, key=b"another key, 16+ bytes", backend=ForkKernel())
    other = tmp_path / "other-python.kx"
    resign(saved, other, {"python": [3, 99, 0]}, KEY)
    with pytest.raises(SnapshotError, match=r"written by Python 3\.99"):
        KernelExecutor.resume(other, key=KEY, backend=ForkKernel(), timeout=60)


def test_restore_of_a_durable_snapshot_replaces_the_session(
    saved: Path, fx: KernelExecutor
) -> None:
    fx.execute("only_here = 1")
    manifest = fx.restore(saved, key=KEY)
    assert manifest.names["kept"] == "restored"
    assert fx.execute("only_here").exit_code != 0  # a fresh kernel, then the snapshot
    assert fx.execute("print(double(kept['a'][1]))").output.strip() == "4"


def test_the_default_key_file_is_made_private(
    ex: KernelExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "keys" / "snapshot.key"
    monkeypatch.setenv("KERNELEXEC_SNAPSHOT_KEY", str(key_file))
    ex.snapshot(tmp_path / "s.kx")
    assert key_file.stat().st_mode & 0o777 == 0o600 and len(key_file.read_bytes()) == 32
    with pytest.raises(SnapshotError, match="signature does not match"):
        ex.restore(tmp_path / "s.kx", key=KEY)  # another key than the one it was signed with


# -- checkpoint="block" --------------------------------------------------------------------------
def test_a_block_that_kills_its_kernel_costs_only_itself(tmp_path: Path) -> None:
    with KernelExecutor(
        backend=ForkKernel(), work_dir=tmp_path, timeout=60, checkpoint="block"
    ) as ex:
        assert ex.execute("x = 1\nopen('f.txt', 'w').write('kept')").ok
        died = ex.execute("x = 5\nopen('f.txt', 'w').write('lost')\nimport os\nos._exit(3)")
        assert died.kernel_died and not died.state_lost
        assert died.recovered_from == "checkpoint after block 1"
        assert "only this block's effects were lost" in died.output
        assert ex.execute("print(x, open('f.txt').read())").output.split() == ["1", "kept"]
        crashed = ex.execute("import ctypes\nctypes.string_at(0)")  # a segfault
        assert crashed.kernel_died and crashed.recovered_from is not None
        assert ex.execute("print(x)").output.strip() == "1"


def test_checkpoint_needs_a_back_end_that_forks() -> None:
    with pytest.raises(ValueError, match="checkpoint"):
        KernelExecutor(checkpoint="always")
    with pytest.raises(ForkUnsupported):
        KernelExecutor(GatewayKernel("http://127.0.0.1:9"), checkpoint="block")


def test_a_fork_that_runs_out_of_memory_costs_only_itself(tmp_path: Path) -> None:
    """A real memory limit (a cgroup v1 memory controller) over the session: its fork shares
    it, and the copies the fork's writes make exceed it. The OOM killer takes the fork (its
    oom_score_adj says it goes first), the session carries on, nothing is left behind."""
    memory = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (memory / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and a cgroup v1 memory controller (this project's CI has both)")
    group = memory / f"kx-test-fork-oom-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        with make_executor("fork-kernel", work_dir=tmp_path, timeout=60) as ex:
            # 160 MiB written before the limit: charged outside it (charges do not move)
            assert ex.execute("import numpy as np\na = np.ones(20 * 2**20)").exit_code == 0
            parent = ex.backend.pid
            assert parent is not None
            (group / "cgroup.procs").write_text(str(parent))
            (group / "memory.limit_in_bytes").write_text(str(64 * 2**20))
            child = ex.fork()  # the fork itself copies no page: it fits
            try:
                pid = child.backend.pid
                assert pid is not None
                assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
                r = child.execute("a += 1\nprint('never')")  # copies 160 MiB: over the limit
                assert r.kernel_died and "never" not in r.output
                assert "for want of memory" in r.output  # the result says why
                assert gone_within(pid)
                # the session kept its state
                assert ex.execute("print(a[:2].sum())").output.strip() == "2.0"
            finally:
                child.close()
        assert gone_within(parent)
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                group.rmdir()  # empty: nothing was left in it
                break
            except OSError:
                time.sleep(0.05)
    assert not group.exists()
