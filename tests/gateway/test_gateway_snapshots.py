"""Durable snapshots and fork on a gateway kernel (Kernel Gateway's venv has no cloudpickle).

The kernel does not share the host's disk as far as kernelexec knows (``shares_work_dir`` is
False): the pickles and the work dir's files travel through the kernel, and the host ships its
own cloudpickle to the kernel as source text. A kernel given its own ``working_dir`` (distinct
from the executor's local work dir) shows that files went over the protocol.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_servers import Gateway
from kx_snapshots import resign

from kernelexec import ForkUnsupported, KernelExecutor, SessionBusy, SnapshotError
from kernelexec.backends.fork_kernel import ForkKernel

KEY = b"g" * 32
STATE = (
    "import json as j\nkept = {'a': [1, 2]}\nclass Model:\n    k = 3\n"
    "def double(v): return v * 2\nimport threading\nguard = threading.Lock()\n"
    "import os\nos.makedirs('sub', exist_ok=True)\nopen('sub/notes.txt', 'w').write('saved')"
)
CHECK = "print(kept['a'], Model.k, double(4), j.dumps(1), open('sub/notes.txt').read())"
EXPECTED = ["[1,", "2]", "3", "8", "1", "saved"]


@pytest.fixture(scope="module")
def ex(
    kernel_gateway: Gateway, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KernelExecutor]:
    work = tmp_path_factory.mktemp("gw-snap-work")
    with KernelExecutor(kernel_gateway.backend(), work_dir=work, timeout=60) as executor:
        # the precondition that makes shipping cloudpickle necessary (else the test proves little)
        probe = executor.execute("import importlib.util as u; print(u.find_spec('cloudpickle'))")
        assert probe.output.strip() == "None", probe.output
        assert executor.execute(STATE).ok
        yield executor


@pytest.fixture(scope="module")
def saved(ex: KernelExecutor, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gw-snap") / "session.kx"
    manifest = ex.snapshot(path, key=KEY)
    assert manifest.kind == "gateway-kernel" and manifest.files == 1
    assert manifest.names["double"] == "saved" and manifest.names["Model"] == "saved"
    assert "lock" in manifest.not_restorable["guard"]
    return path


def test_a_gateway_snapshot_resumes_in_a_kernel_with_its_own_folder(
    saved: Path, kernel_gateway: Gateway, tmp_path: Path
) -> None:
    there, here = tmp_path / "remote-side", tmp_path / "local-side"
    backend = kernel_gateway.backend(working_dir=str(there))
    resumed = KernelExecutor.resume(saved, key=KEY, backend=backend, work_dir=here, timeout=60)
    try:
        assert resumed.execute(CHECK).output.split() == EXPECTED
        assert resumed.restored is not None and resumed.restored.names["double"] == "restored"
        assert (there / "sub" / "notes.txt").read_text() == "saved"  # through the kernel
        assert not (here / "sub").exists()
        assert not [p for p in (there / ".kernelexec").rglob("*.pkl")]  # its scratch is gone
        # ... and a snapshot of it is read through the kernel too: resumed on a local kernel
        resumed.execute("open('sub/notes.txt', 'w').write('changed'); kept['b'] = 5")
        again = resumed.snapshot(tmp_path / "again.kx", key=KEY)
        assert again.files == 1
    finally:
        resumed.close()
    with KernelExecutor.resume(
        tmp_path / "again.kx", key=KEY, backend=ForkKernel(), timeout=60
    ) as local:
        out = local.execute("print(kept['b'], double(2), open('sub/notes.txt').read())")
        assert out.output.split() == ["5", "4", "changed"], out.output


def test_fork_goes_through_a_snapshot(ex: KernelExecutor) -> None:
    (child,) = ex.fork(n=1)
    try:
        assert child.forked_via == "snapshot"
        assert child.restored is not None and "lock" in child.restored.not_restorable["guard"]
        assert child.execute(CHECK).output.split() == EXPECTED
        assert child.work_dir != ex.work_dir
        child.execute("kept['a'].append(3); open('sub/notes.txt', 'w').write('child')")
        assert child.backend.kernel_id != ex.backend.kernel_id  # type: ignore[attr-defined]
    finally:
        child.close()
    # the parent is undisturbed: its state and its files
    assert ex.execute(CHECK).output.split() == EXPECTED


def test_a_fork_leaves_no_snapshot_behind(
    ex: KernelExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The durable snapshot a fork goes through (the session's whole namespace, pickled) is
    removed once the fork is loaded; the fork's kernel started while it was taken."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    child = ex.fork()
    try:
        assert child.execute(CHECK).output.split() == EXPECTED
    finally:
        child.close()
    assert not list(tmp_path.rglob("*.kx"))


def test_fork_of_a_kernel_with_a_fixed_folder_is_refused(
    kernel_gateway: Gateway, tmp_path: Path
) -> None:
    backend = kernel_gateway.backend(working_dir=str(tmp_path / "fixed"))
    with pytest.raises(ForkUnsupported, match="fixed folder"):
        backend.fresh_copy()


def test_a_bad_snapshot_is_refused_on_a_gateway(
    saved: Path, kernel_gateway: Gateway, tmp_path: Path
) -> None:
    data = saved.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    for name, content in {"truncated": data[:-7], "tampered": bytes(flipped)}.items():
        bad = tmp_path / f"{name}.kx"
        bad.write_bytes(content)
        with pytest.raises(SnapshotError, match="signature does not match"):
            KernelExecutor.resume(bad, key=KEY, backend=kernel_gateway.backend(), timeout=60)
    other = tmp_path / "other-python.kx"
    resign(saved, other, {"python": [3, 99, 0]}, KEY)
    with pytest.raises(SnapshotError, match=r"written by Python 3\.99"):
        KernelExecutor.resume(other, key=KEY, backend=kernel_gateway.backend(), timeout=60)


def test_snapshot_and_fork_while_a_block_runs_are_refused(ex: KernelExecutor) -> None:
    import threading
    import time

    runner = threading.Thread(target=ex.execute, args=("import time; time.sleep(3)",))
    runner.start()
    try:
        time.sleep(0.5)
        with pytest.raises(SessionBusy):
            ex.fork()
        with pytest.raises(SessionBusy):
            ex.snapshot(Path("/nonexistent/never-written.kx"), key=KEY)
    finally:
        runner.join()
