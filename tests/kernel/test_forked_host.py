"""A host process that forks (``os.fork``; multiprocessing's default start on Linux) while it
holds executors: the child gets none of the parent's kernels and cannot hang on them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _run_host(tmp_path: Path, code: str) -> tuple[list[str], str]:
    """``code`` run as a host script: the lines it printed, and all it said (for a failure)."""
    script = tmp_path / "host.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    return out.stdout.splitlines(), out.stdout + out.stderr[-2000:]


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
    lines, said = _run_host(tmp_path, _HOST)
    assert lines == ["REFUSED True", "OWN 42", "CHILD 0", "PARENT True 42"], said


_ASYNC_HOST = """
import asyncio, os, signal, tempfile
from kernelexec import ExecutorClosed, make_async_executor

async def start():
    ex = make_async_executor("kernel")  # a work dir of its own, removed by its close()
    return ex, (await ex.execute("import os; os.getpid()")).output

loop = asyncio.new_event_loop()
ex, kernel = loop.run_until_complete(start())
pid = os.fork()
if pid == 0:
    signal.alarm(60)

    async def child():
        try:
            await ex.execute("1")
        except ExecutorClosed as exc:
            print("REFUSED", "forked" in str(exc), flush=True)
        await ex.close()

    asyncio.run(child())
    os._exit(0)
_, status = os.waitpid(pid, 0)
alive = os.path.exists(f"/proc/{kernel}")
print("CHILD", os.waitstatus_to_exitcode(status), ex.work_dir.is_dir(), alive)

async def after():
    again = (await ex.execute("import os; os.getpid()")).output
    print("PARENT", again == kernel)
    await ex.close()

loop.run_until_complete(after())
print("CLOSED", ex.work_dir.exists())
"""


def test_a_forked_childs_close_leaves_the_parents_kernel_and_work_dir(tmp_path: Path) -> None:
    """An async executor in a forked child: refused with a clear error (its sockets are the
    parent's; using them hung), and its close() there removes nothing: not the parent's
    kernel, not the work dir the parent's executor made."""
    lines, said = _run_host(tmp_path, _ASYNC_HOST)
    assert lines == ["REFUSED True", "CHILD 0 True True", "PARENT True", "CLOSED False"], said
