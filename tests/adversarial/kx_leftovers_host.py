"""A host process that makes one kernel per back end named and is then killed (SIGKILL).

``python kx_leftovers_host.py STATUS WORK BACKEND...``

Each back end runs one block; STATUS (JSON) then says what each left on the machine: a local
kernel's and a forked kernel's private temp folder, a Docker kernel's session (its container's
label). The process then sleeps until it is killed, so nothing is cleaned up by it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kernelexec import make_executor


def main(status: str, work: str, *names: str) -> None:
    info: dict[str, Any] = {"pid": os.getpid()}
    keep = []
    for name in names:
        ex = make_executor(name, work_dir=os.path.join(work, name), timeout=60)
        result = ex.execute("print('ready')")
        assert result.exit_code == 0, result.output
        backend = ex.aio.backend
        info[name] = {
            "folder": getattr(backend, "_ipc_dir", None) or getattr(backend, "_dir", None),
            "session": getattr(backend, "session", None),
            # a Docker kernel's host folder for its live forks (mounted at /kx-branches)
            "branches": str(getattr(backend, "_branches", None) or ""),
        }
        keep.append(ex)
    Path(status).write_text(json.dumps(info))
    time.sleep(600)


if __name__ == "__main__":
    main(*sys.argv[1:])
