"""Durable snapshots of the Docker kernel (runc and gVisor) and of the sandboxed kernel.

The image ``kernelexec/python`` has no cloudpickle: the host ships its own as source text, so
functions and classes of the session are saved by value and load again. A snapshot moves from
one back end to another of the same Python minor (runc -> gVisor -> bubblewrap sandbox); a bad
file is refused before anything in it is read, and the session it was offered to keeps its state.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from kx_docker_helpers import containers_of, require_runtime
from kx_snapshots import resign

from kernelexec import ForkUnsupported, KernelExecutor, SnapshotError
from kernelexec._errors import BackendUnavailable
from kernelexec.backends import _sandbox
from kernelexec.backends.docker_kernel import DockerKernel
from kernelexec.backends.sandboxed import SandboxedKernel

KEY = b"d" * 32
STATE = (
    "import json as j\nkept = {'a': [1, 2]}\nclass Model:\n    k = 3\n"
    "def double(v): return v * 2\ngen = (i for i in range(3))\n"
    "import os\nos.makedirs('sub', exist_ok=True)\nopen('sub/notes.txt', 'w').write('saved')"
)
CHECK = "print(kept['a'], Model.k, double(4), j.dumps(1), open('sub/notes.txt').read())"
EXPECTED = ["[1,", "2]", "3", "8", "1", "saved"]


@pytest.fixture(scope="module")
def saved(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot of a runc Docker kernel holding what pickles and what cannot."""
    path = tmp_path_factory.mktemp("docker-snap") / "session.kx"
    with KernelExecutor(DockerKernel(), timeout=60) as ex:
        # what makes shipping cloudpickle necessary (else the test proves little)
        probe = ex.execute("import importlib.util as u; print(u.find_spec('cloudpickle'))")
        assert probe.output.strip() == "None", probe.output
        assert ex.execute(STATE).ok
        manifest = ex.snapshot(path, key=KEY)
    assert manifest.kind == "docker-kernel" and manifest.files == 1
    assert manifest.names["double"] == "saved" and manifest.names["Model"] == "saved"
    assert "generator" in manifest.not_restorable["gen"]
    assert not list(Path(ex.work_dir).rglob("*.pkl"))  # the scratch folder is gone
    return path


@pytest.fixture(scope="module")
def gvisor(
    docker_client: docker.DockerClient, saved: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KernelExecutor]:
    """The runc snapshot resumed in a gVisor Docker kernel."""
    require_runtime(docker_client, "runsc")
    work = tmp_path_factory.mktemp("gvisor-work")
    backend = DockerKernel(runtime="runsc")
    ex = KernelExecutor.resume(saved, key=KEY, backend=backend, work_dir=work, timeout=60)
    try:
        (container,) = containers_of(docker_client, backend.session)
        assert container.attrs["HostConfig"]["Runtime"] == "runsc"
        yield ex
    finally:
        ex.close()


def test_a_runc_snapshot_resumes_under_gvisor(gvisor: KernelExecutor) -> None:
    assert gvisor.execute(CHECK).output.split() == EXPECTED
    manifest = gvisor.restored
    assert manifest is not None and manifest.names["double"] == "restored"
    assert "generator" in manifest.not_restorable["gen"]  # nothing silently missing
    assert gvisor.execute("gen").exit_code != 0


def test_a_gvisor_snapshot_resumes_in_the_sandbox(gvisor: KernelExecutor, tmp_path: Path) -> None:
    try:
        _sandbox.check_sandbox()
    except BackendUnavailable as exc:
        if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
            raise
        pytest.skip(str(exc))
    gvisor.execute("kept['b'] = 'from gvisor'")
    gvisor.snapshot(tmp_path / "g.kx", key=KEY)
    with KernelExecutor.resume(
        tmp_path / "g.kx", key=KEY, backend=SandboxedKernel(), timeout=60
    ) as sandboxed:
        out = sandboxed.execute("print(kept['b'], double(kept['a'][1]), Model.k)")
        assert out.output.split() == ["from", "gvisor", "4", "3"], out.output
        assert sandboxed.restored is not None and sandboxed.restored.kind == "docker-kernel"


def test_a_docker_kernel_forks_through_a_snapshot(
    gvisor: KernelExecutor, docker_client: docker.DockerClient
) -> None:
    gvisor.execute("import threading\nguard = threading.Lock()\nforked = 'yes'")
    child = gvisor.fork(via="snapshot")  # a container of its own (a live fork: the same one)
    try:
        assert child.forked_via == "snapshot"
        assert child.restored is not None and "lock" in child.restored.not_restorable["guard"]
        out = child.execute("kept['a'].append(9); print(forked, kept['a'], double(2))")
        assert out.output.split() == ["yes", "[1,", "2,", "9]", "4"], out.output
        session = child.backend.session  # type: ignore[attr-defined]
        (container,) = containers_of(docker_client, session)
        assert container.attrs["HostConfig"]["Runtime"] == "runsc"  # the parent's options
    finally:
        child.close()
    assert containers_of(docker_client, session) == []
    assert gvisor.execute("print(kept['a'])").output.strip() == "[1, 2]"
    with pytest.raises(ForkUnsupported, match="bind_dir"):
        DockerKernel(bind_dir="/srv/fixed").fresh_copy()


def test_a_bad_snapshot_leaves_the_session_as_it_was(
    gvisor: KernelExecutor, saved: Path, tmp_path: Path
) -> None:
    data = saved.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    gvisor.execute("marker = 'still here'")
    for name, content in {"truncated": data[:-7], "tampered": bytes(flipped)}.items():
        bad = tmp_path / f"{name}.kx"
        bad.write_bytes(content)
        with pytest.raises(SnapshotError, match="signature does not match"):
            gvisor.restore(bad, key=KEY)
    other = tmp_path / "other-python.kx"
    resign(saved, other, {"python": [3, 99, 0]}, KEY)
    with pytest.raises(SnapshotError, match=r"written by Python 3\.99"):
        gvisor.restore(other, key=KEY)
    assert gvisor.execute("print(marker)").output.strip() == "still here"
