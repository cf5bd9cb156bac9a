"""A host process that forks (``os.fork``; multiprocessing's default start on Linux) while it
holds executors and fork servers: the child gets none of the parent's kernels or servers and
cannot hang on them."""

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


_FORKING_HOST = """
import logging, os, signal, sys, tempfile, time
logging.basicConfig(level=logging.WARNING, format="LOG %(message)s", stream=sys.stdout)
from kernelexec import make_executor
from kernelexec.backends import fork_kernel

def kernel(warm_up):
    return make_executor("fork-kernel", work_dir=tempfile.mkdtemp(), warm_up=warm_up)

ex = kernel(["numbers", "cmath"])
ours = int(ex.execute("import os; os.getppid()").output)
r, w = os.pipe()
fork_kernel._servers_lock.acquire()  # held at the fork, as another thread might hold it
pid = os.fork()
if pid == 0:
    code = 1
    signal.alarm(60)  # a child that hangs (the inherited lock) ends, and the test with it
    try:
        os.close(r)
        answers = []
        for warm_up in (["numbers", "cmath"], ["numbers", "colorsys"]):
            with kernel(warm_up) as child:
                answers.append(child.execute("import os; os.getppid()").output)
        os.write(w, " ".join(answers).encode())
        time.sleep(60)  # lives on, holding whatever it inherited, until the parent kills it
        code = 0
    finally:
        os._exit(code)
fork_kernel._servers_lock.release()
os.close(w)
theirs = [int(p) for p in os.read(r, 100).split()]
print("CHILD", *(p != ours for p in theirs))
print("STILL", ex.execute("6 * 7").output)
ex.close()
servers = list(fork_kernel._servers.values())
fork_kernel.stop_fork_servers()
print("ENDED", *(s._proc.returncode for s in servers))
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
"""


def test_a_child_forked_from_the_host_starts_servers_of_its_own(tmp_path: Path) -> None:
    """A host that forks (``os.fork``, multiprocessing's default start on Linux) after using
    fork kernels: the child starts its own server (even for the parent's warm-up list, and with
    the server lock held at the fork), says nothing of a server dying, and lets go of the
    parent's pipes, so the parent's server ends at its stop on end of input (status 0), not
    killed after a wait while the child lives on."""
    lines, said = _run_host(tmp_path, _FORKING_HOST)
    assert "CHILD True True" in lines, said
    assert "STILL 42" in lines
    assert "ENDED 0" in lines, said
    assert not [line for line in lines if line.startswith("LOG")], said
