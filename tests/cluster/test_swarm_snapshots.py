"""Durable snapshots and fork of a Swarm-provisioned kernel (one short session: Swarm is slow).

The kernel runs in a Swarm service from the image ``kernelexec/python`` (no cloudpickle there:
the host ships its own) and shares no disk with the client: the pickles and the files travel
through the kernel. Its process cannot be forked: ``fork()`` makes a second service and loads a
durable snapshot into it.
"""

from __future__ import annotations

import pytest
from kx_cluster import Swarm

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_snapshot_resume_and_fork_through_a_snapshot(swarm: Swarm) -> None:
    r = swarm.run(
        """
        from kernelexec import SnapshotError
        key = b"s" * 32
        with session() as ex:
            ex.execute("def double(v): return v * 2\\nkept = [1, 2]\\nimport threading\\n"
                       "guard = threading.Lock()\\nopen('notes.txt', 'w').write('saved')")
            m = ex.snapshot("/tmp/s.kx", key=key)
            report(saved=m.names, files=m.files, local=os.path.exists(ex.work_dir / "notes.txt"))
            child = ex.fork()
            try:
                out = child.execute("kept.append(3); print(double(kept[1]), kept,"
                                    " open('notes.txt').read())")
                report(via=child.forked_via, lost=child.restored.not_restorable,
                       child=out.output, two=len({ex.backend.kernel_id,
                                                   child.backend.kernel_id}))
            finally:
                child.close()
            report(parent=ex.execute("print(kept)").output)
            with open("/tmp/s.kx", "rb") as f:
                data = f.read()
            with open("/tmp/bad.kx", "wb") as f:
                f.write(data[:-9])
            try:
                fresh = ProvisionedKernel(KERNEL, username=os.environ["KX_USER"])
                KernelExecutor.resume("/tmp/bad.kx", key=key, backend=fresh)
            except SnapshotError as exc:
                report(bad=str(exc))
        report(left=services())
        """
    )
    assert r["saved"]["double"] == "saved" and "lock" in r["saved"]["guard"]
    assert r["files"] == 1 and r["local"] is False  # the file came through the kernel
    assert r["via"] == "snapshot" and list(r["lost"]) == ["guard"]
    assert r["child"].split() == ["4", "[1,", "2,", "3]", "saved"], r["child"]
    assert r["two"] == 2 and r["parent"].strip() == "[1, 2]"
    assert "signature does not match" in r["bad"]
    assert r["left"] == []
