"""Sessions through gateway_provisioners' Docker Swarm provisioner on a real single-node Swarm.

Each kernel is a Swarm service made by the package's launcher from the launcher image; the
session's client runs on the tests' overlay network (see conftest). Nothing here is faked: the
kernel, the service, the interrupt through the launcher's listener and the removal are real.
"""

from __future__ import annotations

import base64

import pytest
from kx_cluster import Swarm

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_one_session_end_to_end(swarm: Swarm) -> None:
    """State across blocks, a plot, the files API, a timeout that keeps state, and close
    removing the service: one session, where state carries over on purpose."""
    r = swarm.run(
        """
        with session() as ex:
            kid = ex.backend.kernel_id
            report(kernel_id=kid, running=services(kid))
            ex.execute("x = 41")
            r = ex.execute("import socket; print(socket.gethostname()); x + 1")
            report(state=r.output, host=r.stdout.strip())
            r = ex.execute(
                "import matplotlib.pyplot as plt\\n"
                "plt.plot([1, 3, 2]); plt.show()"
            )
            report(plot=[o["data"].get("image/png", "") for o in r.outputs
                         if o.get("output_type") == "display_data"])
            ex.write_file("in/data.bin", b"\\x00kx\\xff")
            r = ex.execute("open('in/data.bin', 'rb').read().hex()")
            report(kernel_read=r.output, local_copy=(ex.work_dir / "in/data.bin").exists())
            ex.execute("open('made.txt', 'w').write('from the kernel')")
            report(read_back=ex.read_file("made.txt").decode())
            r = ex.execute("import time\\nx += 1\\ntime.sleep(60)", timeout=3)
            report(timed_out=r.timed_out, state_lost=r.state_lost, error=r.error.ename)
            report(after_timeout=ex.execute("x").output)
        report(after_close=services(kid), containers=containers(kid))
        """
    )
    assert r["running"] == [f"kx-{r['kernel_id']}"]  # a Swarm service, named by the launcher
    assert r["host"] == f"kx-{r['kernel_id']}" and r["state"].endswith("42")
    png = base64.b64decode(r["plot"][0])
    assert png.startswith(b"\x89PNG")
    assert r["kernel_read"] == "'006b78ff'" and r["local_copy"] is False  # no shared disk
    assert r["read_back"] == "from the kernel"
    assert r["timed_out"] and not r["state_lost"] and r["error"] == "Timeout"
    assert r["after_timeout"] == "42"  # interrupted through the launcher's listener
    assert r["after_close"] == [] and r["containers"] == []


def test_kernel_death_is_noticed_and_a_new_service_replaces_it(swarm: Swarm) -> None:
    r = swarm.run(
        """
        with session() as ex:
            first = ex.backend.kernel_id
            ex.execute("x = 1")
            r = ex.execute("import os; os._exit(3)")
            report(died=r.kernel_died, lost=r.state_lost, ok=r.ok, note=r.output)
            second = ex.backend.kernel_id
            report(first_left=services(first), second_runs=services(second))
            report(after=ex.execute("'x' in dir()").output)
        report(second_left=services(second), first=first, second=second)
        report(containers=containers(first) + containers(second))
        """
    )
    assert r["died"] and r["lost"] and not r["ok"]
    assert "died" in r["note"] and "restarted" in r["note"]
    assert r["first"] != r["second"]
    assert r["first_left"] == [] and r["second_runs"] == [f"kx-{r['second']}"]
    assert r["after"] == "False"
    assert r["second_left"] == [] and r["containers"] == []


def test_two_sessions_at_once(swarm: Swarm) -> None:
    r = swarm.run(
        """
        import threading
        results = {}
        def one(name):
            with session() as ex:
                ex.execute(f"who = {name!r}")
                results[name] = (ex.backend.kernel_id, ex.execute("who").output)
        threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
        for t in threads: t.start()
        for t in threads: t.join()
        report(results=results, left=services())
        report(containers=[c for kid, _ in results.values() for c in containers(kid)])
        """
    )
    (id_a, out_a), (id_b, out_b) = r["results"]["a"], r["results"]["b"]
    assert out_a == "'a'" and out_b == "'b'" and id_a != id_b
    assert not [s for s in r["left"] if id_a in s or id_b in s]
    assert r["containers"] == []
