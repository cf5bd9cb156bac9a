"""A host process that forks (``os.fork``; multiprocessing's default start on Linux) while it
holds executors: the child gets none of the parent's kernels and cannot hang on them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_HOST = """
import os, signal, sys, tempfile
from kernelexec import ExecutorClosed, make_executor

ex = make_executor("kernel", work_dir=tempfile.mkdtemp())
kernel = ex.execute("import os; os.getpid()").output
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a child that hangs ends, and the parent reports it
    try:
        ex.execute("1")
    except ExecutorClosed as exc:
        print("REFUSED", "forked" in str(exc), flush=True)
    with make_executor("command", work_dir=tempfile.mkdtemp()) as own:
        print("OWN", own.execute("print(6 * 7)").output.strip(), flush=True)
    sys.exit(0)  # a normal exit: the inherited executor's close at exit runs here
_, status = os.waitpid(pid, 0)
print("CHILD", os.waitstatus_to_exitcode(status))
print("PARENT", ex.execute("import os; os.getpid()").output == kernel, ex.execute("6 * 7").output)
ex.close()
"""


def test_a_forked_child_neither_uses_nor_closes_the_parents_executors(tmp_path: Path) -> None:
    """The child is refused the parent's executor with a clear error (its event-loop thread is
    not in the child), makes its own, and exits normally: closing the inherited executor at exit
    waited for that missing thread and hung the child. The parent's kernel is untouched."""
    script = tmp_path / "host.py"
    script.write_text(_HOST)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    lines = out.stdout.splitlines()
    assert lines == ["REFUSED True", "OWN 42", "CHILD 0", "PARENT True 42"], (
        out.stdout + out.stderr[-2000:]
    )
