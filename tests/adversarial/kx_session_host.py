"""A host process to kill mid-session.

``KXADV_TOKEN=... python kx_session_host.py BACKEND WORK NOTEBOOK STATUS [branch]``

Runs two blocks with a session notebook, writes STATUS (JSON: the Docker session, the kernel pid),
then runs a block that starts a stubborn child carrying the token and sleeps: the test kills
this process with SIGKILL while that block runs. With ``branch``, the session first takes a
live snapshot and a fork, whose block starts a stubborn child too (STATUS names them). The token
comes in the environment: in the host's own command line it would make the host look like the
child.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kx_adversarial import spawn_code

from kernelexec import make_executor


def main(backend: str, work: str, notebook: str, status: str, mode: str = "") -> None:
    token = os.environ["KXADV_TOKEN"]
    ex = make_executor(backend, work_dir=work, timeout=600, notebook_path=notebook)
    ex.execute("print('one')")
    ex.execute("print('two')")
    core_backend = ex.aio.backend
    info = {
        "session": getattr(core_backend, "session", None),
        "kernel_pid": getattr(core_backend, "pid", None),
    }
    if mode == "branch":
        snapshot = ex.snapshot()
        fork = ex.fork()
        assert fork.execute(spawn_code("child", token)).ok
        info["branches"] = {
            "forked_via": fork.forked_via,
            "fork_pid": getattr(fork.aio.backend, "pid", None),
            "fork_session": getattr(fork.aio.backend, "session", None),
            "fork_work_dir": str(fork.work_dir),
            "snapshot_pid": getattr(snapshot.aio._holder.backend, "pid", None),
        }
    Path(status).write_text(json.dumps(info))
    ex.execute(spawn_code("child", token) + "import time\ntime.sleep(600)\n")


if __name__ == "__main__":
    main(*sys.argv[1:6])
