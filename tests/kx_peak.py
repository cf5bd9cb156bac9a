"""The host's peak memory while one block runs, measured in a fresh host process (issue 30.5).

``host_peak_mb(backend, code)`` starts ``python -c PROBE`` with this checkout first on its path:
the probe opens an executor of ``backend``, runs a warm-up block, resets the kernel's
high-water mark (``/proc/self/clear_refs``), runs ``code`` and reports how far its peak RSS
(``VmHWM``) rose above its RSS before the block.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_PROBE = """\
import sys
from pathlib import Path
from kernelexec import make_executor

def mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) // 1024

with make_executor(sys.argv[1], timeout=300) as ex:
    ex.execute("1")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the RSS now
    before = mb("VmRSS")
    result = ex.execute(sys.argv[2])
    print(mb("VmHWM") - before, result.exit_code, len(result.output))
"""


def host_peak_mb(backend: str, code: str) -> tuple[int, int, int]:
    """(peak growth in MB, the block's exit code, its output's length)."""
    root = Path(__file__).parents[1]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, backend, code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},  # this checkout
        check=True,
    )
    grew, exit_code, length = (int(v) for v in done.stdout.split()[-3:])
    return grew, exit_code, length
