"""``kernelexec gc`` and the Swarm services of provisioned kernels whose client was killed.

Two client processes (hosts) start a session each, in a driver container on the tests' overlay
network. One is SIGKILLed: gc run beside it (same pid namespace) lists and removes its service
and keeps the live one's. Then the other host is killed and the driver container ends: gc run on
this machine, outside that pid namespace, finds that host gone and removes its service.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kx_cluster import PROJECT, Swarm

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HOST = """
import os, sys, time
from kernelexec import KernelExecutor, ProvisionedKernel
backend = ProvisionedKernel(os.environ["KX_KERNEL"], username=os.environ["KX_USER"])
ex = KernelExecutor(backend, timeout=30, startup_timeout=90)
assert ex.execute("1 + 1").output == "2"
print(backend.kernel_id, flush=True)
time.sleep(600)
"""


def _gc(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    done = subprocess.run(
        [sys.executable, "-m", "kernelexec", "gc", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _services_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if "service(s)" in line]
    return line


def test_gc_removes_the_service_of_a_killed_client_and_keeps_a_live_ones(swarm: Swarm) -> None:
    r = swarm.run(
        f"""
        import subprocess
        def host():
            proc = subprocess.Popen([sys.executable, "-c", {HOST!r}], stdout=subprocess.PIPE,
                                    text=True)
            return proc, proc.stdout.readline().strip()
        live, live_id = host()
        dead, dead_id = host()
        dead.kill()
        dead.wait()
        report(live=live_id, dead=dead_id, before=services())
        def gc(*args):
            done = subprocess.run([sys.executable, "-m", "kernelexec", "gc", *args],
                                  capture_output=True, text=True, timeout=120)
            return done.returncode, done.stdout, done.stderr
        report(dry=gc("--dry-run"), after_dry=services())
        report(done=gc(), after_gc=services(), dead_containers=containers(dead_id))
        # Now the other host is killed too, and this container ends: its service stays behind.
        live.kill()
        live.wait()
        """
    )
    live, dead = f"kx-{r['live']}", f"kx-{r['dead']}"
    assert {live, dead} <= set(r["before"])
    status, out, err = r["dry"]
    assert status == 0, err
    line = _services_line(out)
    assert line.startswith("would remove 1 service(s)") and dead in line and live not in line
    assert {live, dead} <= set(r["after_dry"])  # a dry run removes nothing
    # The killed host's launcher log is listed too; the live host's is not.
    (temp,) = [line for line in out.splitlines() if "temp folder(s)" in line]
    assert temp.count("kernelexec-launcher-") == 1, temp
    status, out, err = r["done"]
    assert status == 0, err
    assert dead in _services_line(out) and live not in _services_line(out)
    assert dead not in r["after_gc"] and live in r["after_gc"]
    assert r["dead_containers"] == []

    # The other host was killed, its container is gone; gc here (another pid namespace)
    # finds it gone.
    assert live in swarm.services()
    line = _services_line(_gc("--dry-run"))
    assert live in line and live in swarm.services()
    assert live in _services_line(_gc())
    assert live not in swarm.services()
