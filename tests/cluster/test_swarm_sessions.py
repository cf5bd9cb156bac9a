"""Sessions through gateway_provisioners' Docker Swarm provisioner on a real single-node Swarm.

Each kernel is a Swarm service made by the package's launcher from the launcher image; the
session's client runs on the tests' overlay network (see conftest). Nothing here is faked: the
kernel, the service, the interrupt through the launcher's listener and the removal are real.
"""

from __future__ import annotations

import base64
import textwrap

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


#: a stand-in for the engine's socket that can be taken away: the engine "restarting"
_ENGINE_PROXY = """
import socket, threading
PROXY = "/tmp/engine.sock"
class Engine:
    def up(self):
        if os.path.exists(PROXY):
            os.unlink(PROXY)
        self.server, self.open = socket.socket(socket.AF_UNIX), []
        self.server.bind(PROXY)
        self.server.listen(64)
        threading.Thread(target=self._serve, args=(self.server,), daemon=True).start()
    def down(self):
        self.server.close()
        os.unlink(PROXY)
        for s in self.open:  # the SDK's kept-alive connections go too
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    def _serve(self, server):
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX)
            engine.connect("/var/run/docker.sock")
            self.open += [client, engine]
            for a, b in ((client, engine), (engine, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()
def _pipe(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
"""


def test_the_engine_going_away_mid_session_is_a_clear_error(swarm: Swarm) -> None:
    """The engine's socket disappears and the kernel's container is killed, as when dockerd
    restarts without live-restore (simulated: restarting the real engine would take down every
    other user of it). The next block ends promptly with an error naming the engine; once the
    engine is back, a restart works and the dead kernel's service is removed."""
    r = swarm.run(
        _ENGINE_PROXY
        + textwrap.dedent(
            """
        engine = Engine()
        engine.up()
        os.environ["DOCKER_HOST"] = "unix://" + PROXY
        with session(timeout=20) as ex:
            first = ex.backend.kernel_id
            ex.execute("x = 1")
            engine.down()
            for c in _engine.containers.list(filters={"label": "kernel_id=" + first}):
                c.kill()
            started = time.monotonic()
            try:
                r = ex.execute("x")
                report(outcome="result", output=r.output)
            except Exception as exc:
                report(outcome=type(exc).__name__, message=str(exc))
            report(seconds=time.monotonic() - started)
            engine.up()
            ex.restart()
            report(after=ex.execute("2 + 2").output, second=ex.backend.kernel_id)
            report(first_left=services(first))
        report(second_left=services(ex.backend.kernel_id or "none"), first=first)
        """
        )
    )
    assert r.get("outcome") == "DockerUnavailable", r
    assert "No Docker engine answers" in r["message"]
    assert r["seconds"] < 30
    assert r["after"] == "4" and r["second"] != r["first"]
    assert r["first_left"] == [] and r["second_left"] == []


def test_bytes_that_are_not_utf8_leave_the_sessions_output_whole(swarm: Swarm) -> None:
    """The launcher image's ipykernel (6.17) decoded fd output strictly: one byte that is not
    UTF-8 killed its reader, that line and every later child's output were lost, and a large
    one filled the pipe and hung to the timeout (issue 31.4). The bytes come through as
    U+FFFD, as on the other back ends, and the session goes on. Then a child's output at a
    block's end, as on the Docker kernel (same ipykernel: ``kx_attribution``)."""
    r = swarm.run(
        r"""
        with session() as ex:
            r = ex.execute("import os, subprocess; os.write(1, b'bad \\xff byte\\n')")
            report(bad=[r.exit_code, r.stdout])
            r = ex.execute("subprocess.run(['sh', '-c', 'echo child; echo child-err >&2'])")
            report(child=[r.exit_code, r.stdout, r.stderr])
            r = ex.execute("subprocess.run(['seq', '200000']);", timeout=20)
            report(seq=[r.exit_code, r.timed_out, r.stdout[:4], r.stdout[-14:]])
            started = time.monotonic()
            r = ex.execute(
                "import random; os.write(1, random.Random(7).randbytes(2_000_000))", timeout=20
            )
            report(noise=[r.exit_code, r.timed_out, "\ufffd" in r.stdout])
            report(noise_took=time.monotonic() - started)
            report(after=ex.execute("subprocess.run(['echo', 'still here']);").stdout)
            # A child's lines at a block's end stay in that block here too (issue 31.3).
            sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"], "tests"))
            from kx_attribution import check_child_output_stays_in_its_block
            check_child_output_stays_in_its_block(ex)
            kid = ex.backend.kernel_id
        report(left=services(kid))
        """
    )
    assert r["bad"] == [0, "bad \ufffd byte\n"], r
    assert r["child"] == [0, "child\n", "child-err\n"]
    assert r["seq"] == [0, False, "1\n2\n", "199999\n200000\n"]
    assert r["noise"] == [0, False, True] and r["noise_took"] < 15
    assert r["after"] == "still here\n" and r["left"] == []


def test_every_block_sent_runs_or_says_it_did_not(swarm: Swarm) -> None:
    """Issue 31: the block after a failure runs (the kernel's abort window after a failed
    request, 2 s here, is never opened by kernelexec's requests); code with a NUL byte is
    refused, nothing run; a kernel that died while idle is reported so, the block not run."""
    r = swarm.run(
        """
        import time
        with session() as ex:
            ex.execute("get_ipython().kernel.stop_on_error_timeout = 2.0\\nruns = 0")
            ex.execute("undefined_name")
            r = ex.execute("runs += 1; print('run', runs)")
            report(after_failure=[r.exit_code, r.output, r.not_run])
            r = ex.execute("runs += 1\\x00print('cut')")
            report(nul=[r.not_run, r.error.ename, ex.execute("print(runs)").output])
            ex.execute("import os, threading\\nthreading.Timer(0.5, os._exit, (1,)).start()")
            time.sleep(8)  # past the idle time after which a remote kernel is asked
            r = ex.execute("print('sent after the death')")
            report(idle=[r.not_run, r.kernel_died, r.state_lost, r.output])
        """
    )
    assert r["after_failure"] == [0, "run 1\n", False]
    assert r["nul"] == [True, "InvalidBlock", "1\n"]
    not_run, died, lost, note = r["idle"]
    assert not_run and died and lost, note
    assert "while idle, before this block was sent" in note and "sent after" not in note
