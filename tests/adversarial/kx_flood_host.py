"""A host process for the flood cases: ``python kx_flood_host.py BACKEND WORK_DIR REPORT``.

It runs one executor of ``BACKEND`` (built through the registry) through every flood in turn and
writes a JSON report: per case the result's fields, how long the block took, and the host's own
peak memory during it (the kernel's high-water mark, reset before each case through
``/proc/self/clear_refs``). Its own stdout carries nothing: whatever appears there leaked from a
block (a host whose stdout is a protocol channel would be corrupted by it).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from kernelexec import make_executor

TOKEN = "kxadv-host-stdout"

CASES: list[tuple[str, str, float, bool]] = [
    # name, code, timeout, kernels only
    (
        "stdout-100mb",
        "import sys\nchunk = ('x' * 99 + '\\n') * 10_000\nfor _ in range(100):\n"
        "    sys.stdout.write(chunk)\n",
        240,
        False,
    ),
    # (assigned: a kernel would show write()'s return value as the block's result)
    ("line-50mb", "import sys\n_ = sys.stdout.write('y' * 50_000_000 + '\\n')\n", 240, False),
    (
        "displays",
        "from IPython.display import HTML, display\nfor i in range(10_000):\n"
        "    display(HTML(f'<b>{i}</b>'))\n",
        240,
        True,
    ),
    # Every byte value but \r, \b and ESC: a kernel resolves the first two as a terminal would,
    # and escape sequences are stripped (both by design), so the count would not be exact.
    (
        "random-stdout",
        "import os, re\ndata = re.sub(b'[\\r\\b\\x1b]', b'.', os.urandom(1_000_000))\n"
        "print(data.decode('latin-1'))\n",
        60,
        False,
    ),
    (
        "host-stdout",
        "import os, subprocess, sys\n"
        f"os.write(1, b'{TOKEN}-fd\\n')\n"
        f"subprocess.run(['echo', '{TOKEN}-child'])\n"
        f"print('{TOKEN}-print', flush=True)\n",
        60,
        False,
    ),
    # Bytes that are not UTF-8 to fd 1, then a later write to fd 1 that must still arrive (13.2:
    # these bytes once wedged the Docker kernel's fd 1 for the rest of the session).
    ("random-fd1", "import os\nos.write(1, os.urandom(100_000))\nprint()\n", 5, False),
    ("later-fd1", "import os\nos.write(1, b'later\\n')\n", 5, False),
]


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in kB."""
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    assert match is not None, key
    return int(match[1])


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def main(backend: str, work_dir: str, report_path: str) -> None:
    report: dict[str, Any] = {}
    kernels = backend.endswith("kernel")
    with make_executor(backend, work_dir=work_dir, timeout=60) as ex:
        ex.execute("print('warm')")
        for name, code, timeout, kernels_only in CASES:
            if kernels_only and not kernels:
                continue
            _reset_peak()
            base = _status("VmRSS")
            started = time.monotonic()
            r = ex.execute(code, timeout=timeout)
            elapsed = time.monotonic() - started
            report[name] = {
                "elapsed": elapsed,
                "base_mb": base / 1024,
                "peak_mb": _status("VmHWM") / 1024,
                "exit_code": r.exit_code,
                "timed_out": r.timed_out,
                "truncated": r.truncated,
                "output": r.output,
                "stdout": r.stdout,
                # the kept displays; the omission marker is a display_data output of its own
                "displays": sum(
                    o.get("output_type") == "display_data"
                    and "kernelexec" not in (o.get("metadata") or {})
                    for o in r.outputs
                ),
                "html_files": sum(p.suffix == ".html" for p in r.files),
            }
    Path(report_path).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
