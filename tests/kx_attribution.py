"""Output a child process writes at a block's last line belongs to that block (issue 31.3).

A kernel moves what is written to fd 1 / fd 2 into its output from a reader thread. Where only
that thread moved it, a block could end (its idle status sent) before the thread took a child's
last lines: they went to the next block, or were sent under the ended block's header and
dropped. How often depended on how soon the thread ran (51 of 100 blocks under gVisor, a few
under runc). Here every fd reader is made to take its time after each read, so a block that
relies on the thread loses every time; the kernel must empty the fd pipe itself before it ends
a block.
"""

from __future__ import annotations

from typing import Any

#: reads by any thread but the kernel's main one return 0.1 s late (set in the kernel)
SLOW_FD_READERS = """\
import os as _kx_os, threading as _kx_threading, time as _kx_time
def _kx_slow_read(fd, size, _read=_kx_os.read, _threading=_kx_threading, _sleep=_kx_time.sleep):
    data = _read(fd, size)
    if _threading.current_thread() is not _threading.main_thread():
        _sleep(0.1)
    return data
_kx_os.read = _kx_slow_read
del _kx_os, _kx_threading, _kx_time, _kx_slow_read
import subprocess
"""


def child_block(i: int) -> str:
    """A block whose last line is a child writing one line to each of stdout and stderr."""
    return f"subprocess.run(['sh', '-c', 'echo A{i}; echo B{i} >&2'])"


def check_child_output_stays_in_its_block(ex: Any, blocks: int = 10) -> None:
    """Each block's stdout and stderr are exactly its child's lines, none lost or moved."""
    assert ex.execute(SLOW_FD_READERS).exit_code == 0
    wrong = []
    for i in range(blocks):
        r = ex.execute(child_block(i))
        if (r.exit_code, r.stdout, r.stderr) != (0, f"A{i}\n", f"B{i}\n"):
            wrong.append((i, r.exit_code, r.stdout, r.stderr))
    assert wrong == [], f"{len(wrong)} of {blocks} blocks wrong: {wrong}"
