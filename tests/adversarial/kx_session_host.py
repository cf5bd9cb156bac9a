"""A host process to kill mid-session.

``KXADV_TOKEN=... python kx_session_host.py BACKEND WORK NOTEBOOK STATUS``

Runs two blocks with a session notebook, writes STATUS (JSON: the Docker session, the kernel pid),
then runs a block that starts a stubborn child carrying the token and sleeps: the test kills
this process with SIGKILL while that block runs. The token comes in the environment: in the
host's own command line it would make the host look like the child.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kx_adversarial import spawn_code

from kernelexec import make_executor


def main(backend: str, work: str, notebook: str, status: str) -> None:
    token = os.environ["KXADV_TOKEN"]
    ex = make_executor(backend, work_dir=work, timeout=600, notebook_path=notebook)
    ex.execute("print('one')")
    ex.execute("print('two')")
    core_backend = ex.aio.backend
    info = {
        "session": getattr(core_backend, "session", None),
        "kernel_pid": getattr(core_backend, "pid", None),
    }
    Path(status).write_text(json.dumps(info))
    ex.execute(spawn_code("child", token) + "import time\ntime.sleep(600)\n")


if __name__ == "__main__":
    main(*sys.argv[1:5])
