"""Every block sent runs, or its result says plainly that it did not and why (issue 31.1, 31.9).

ipykernel aborts (answers ``status: aborted``, runs nothing) an execute request that arrives in
its abort window after a request that failed with ``stop_on_error``; the window's length is
``kernel.stop_on_error_timeout``, set to 2 s here so that a follow-up block lands in it every
time (the image's ipykernel 6.17 under load did it by chance). A kernel killed between blocks
is reported as dead before the next block, which did not run.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any

import nbformat
import pytest
from kx_fidelity import KERNELS, make, params

# A kernel that aborts an execute request whenever it fails, for 2 s, as ipykernel does with
# stop_on_error; set again after each restart (a new kernel has ipykernel's default).
WIDE_ABORT_WINDOW = "get_ipython().kernel.stop_on_error_timeout = 2.0"
COUNTED = "runs = globals().get('runs', 0) + 1; print('run', runs)"

# The kernel aborts the next ``n`` (non-silent) execute requests, as in its abort window, then
# stops aborting: the same on ipykernel 6 and 7 (``_aborting`` is what their dispatch reads).
ABORT_NEXT = """\
def _abort_next(n):
    k = get_ipython().kernel
    send = k._send_abort_reply
    left = [n]

    def counted(stream, msg, idents):
        r = send(stream, msg, idents)
        if not msg["content"].get("silent"):
            left[0] -= 1
            if left[0] == 0:
                k._aborting = False
                del k._send_abort_reply
        return r

    k._send_abort_reply = counted
    k._aborting = True
_abort_next({n})
del _abort_next
"""

# The same for kernelexec's own requests (silent ones too): the next ``n`` requests with code
# (not the empty marker the executor may send after a block) are aborted.
ABORT_OWN = ABORT_NEXT.replace(
    'if not msg["content"].get("silent"):', 'if msg["content"].get("code"):'
)

# ipykernel's abort window, opened as a request that failed with stop_on_error opens it, with
# ``stop_on_error_timeout`` raised to 3 s so that everything sent in those 3 s is aborted:
# ipykernel 6 (the image's) by its own call; ipykernel 7 closes its window with a message, not
# a timer, so there a timer closes it.
OPEN_ABORT_WINDOW = """\
def _open_window(k=get_ipython().kernel):
    import threading
    k.stop_on_error_timeout = 3.0
    if getattr(k, "shell_channel_thread", None) is None:
        k._abort_queues()
    else:
        k._aborting = True
        threading.Timer(k.stop_on_error_timeout, setattr, (k, "_aborting", False)).start()
_open_window()
del _open_window
"""


def _follow_up_runs(ex: Any, before: int) -> None:
    r = ex.execute(COUNTED)
    assert (r.exit_code, r.output, r.error, r.not_run) == (0, f"run {before + 1}\n", None, False)


@pytest.mark.parametrize("backend", params(KERNELS), indirect=True)
def test_the_block_after_a_failure_runs(ex: Any) -> None:
    ex.execute("runs = 0")
    assert ex.execute(WIDE_ABORT_WINDOW).ok
    for i in range(3):
        r = ex.execute("undefined_name")
        assert r.error is not None and r.error.ename == "NameError", r.output
        _follow_up_runs(ex, i)


@pytest.mark.parametrize("backend", params(KERNELS), indirect=True)
def test_the_block_after_a_timeout_or_an_interrupt_runs(ex: Any) -> None:
    ex.execute("runs = 0")
    assert ex.execute(WIDE_ABORT_WINDOW).ok
    r = ex.execute("import time; time.sleep(30)", timeout=1)
    assert r.timed_out and not r.state_lost, r.output
    _follow_up_runs(ex, 0)
    timer = threading.Timer(1.0, ex.interrupt)
    timer.start()
    r = ex.execute("import time; time.sleep(30)")
    timer.join()
    assert r.error is not None and r.error.ename == "KeyboardInterrupt", r.output
    _follow_up_runs(ex, 1)


@pytest.mark.parametrize("backend", params(KERNELS), indirect=True)
def test_the_block_after_a_restart_and_a_failure_runs(ex: Any) -> None:
    ex.restart()
    ex.execute("runs = 0")
    assert ex.execute(WIDE_ABORT_WINDOW).ok
    assert not ex.execute("1 / 0").ok
    _follow_up_runs(ex, 0)


@pytest.mark.parametrize("backend", params(KERNELS), indirect=True)
def test_a_request_the_kernel_aborted_once_is_sent_again(ex: Any) -> None:
    ex.execute("runs = 0")
    assert ex.execute(ABORT_NEXT.format(n=1)).ok
    _follow_up_runs(ex, 0)  # aborted, sent again: ran once


@pytest.mark.parametrize("backend", params(KERNELS), indirect=True)
def test_a_request_the_kernel_keeps_aborting_says_not_run(ex: Any) -> None:
    ex.execute("runs = 0")
    cells = len(ex.notebook.cells)
    assert ex.execute(ABORT_NEXT.format(n=2)).ok
    r = ex.execute(COUNTED)
    assert r.not_run and r.exit_code == 1 and not r.kernel_died and not r.state_lost
    assert r.error is not None and r.error.ename == "NotRun", r.error
    assert r.output.startswith("Not run: the kernel aborted the request"), r.output
    assert r.output == r.error.evalue and "run 1" not in r.output
    assert r.to_reply().startswith("exitcode: 1 (not run)")
    # The session notebook has the set-up cell and a note for the block, not a fake error cell.
    added = ex.notebook.cells[cells:]
    assert [c.cell_type for c in added] == ["code", "markdown"], added
    assert "not run" in added[1].source and COUNTED in added[1].source
    nbformat.validate(ex.notebook)
    _follow_up_runs(ex, 0)  # it never ran: the counter is where it was


@pytest.mark.parametrize("backend", params(KERNELS), indirect=True)
def test_a_kernel_killed_while_idle_is_told_apart(backend: str, tmp_path: Any) -> None:
    with make(backend, tmp_path, timeout=30) as ex:
        ex.execute("kept = 1")
        # The kernel kills itself half a second after this block has ended.
        assert ex.execute(
            "import os, signal, threading\n"
            "threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()"
        ).ok
        deadline = time.monotonic() + 30
        while ex.run(ex.backend.is_alive) and time.monotonic() < deadline:
            time.sleep(0.2)
        r = ex.execute("print('sent after the death')")
        assert r.not_run and r.kernel_died and r.state_lost and r.exit_code == 1, r.output
        assert r.error is not None and r.error.ename == "KernelDied"
        assert "while idle, before this block was sent" in r.output, r.output
        assert "while running" not in r.output and "sent after" not in r.output
        assert ex.execute("print('kept' in dir())").output == "False\n"
        # A kernel that dies in the block is still reported as dying there.
        r = ex.execute("import os, signal; print('in', flush=True); os.kill(os.getpid(), 9)")
        assert r.kernel_died and not r.not_run and "while running this block" in r.output
        assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", params(KERNELS), indirect=True)
def test_an_own_request_the_kernel_aborted_once_is_sent_again(ex: Any) -> None:
    ex.execute("runs = 0")
    assert ex.execute(ABORT_OWN.format(n=1)).ok
    # The work dir is gone: kernelexec puts the kernel back in it with a silent request first,
    # which the kernel aborts; sent again, it runs, and so does the block.
    shutil.rmtree(ex.work_dir)
    _follow_up_runs(ex, 0)
    assert ex.work_dir.is_dir()


@pytest.mark.parametrize("backend", params(KERNELS), indirect=True)
def test_an_own_request_in_a_wide_abort_window_says_not_run(ex: Any) -> None:
    ex.execute("runs = 0")
    assert ex.execute(OPEN_ABORT_WINDOW).ok
    shutil.rmtree(ex.work_dir)
    r = ex.execute(COUNTED)
    assert r.not_run and r.exit_code == 1 and not r.kernel_died, r.output
    assert r.error is not None and r.error.ename == "NotRun", r.error
    assert r.output.startswith("Not run: the kernel aborted the request twice"), r.output
    time.sleep(3.5)  # the window closes
    _follow_up_runs(ex, 0)  # it never ran: the counter is where it was


# A line printed after text went to fd 1 (os.write, a child that has ended) comes after that
# text in the result. Kernels of ipykernel 7 (local, forked, sandboxed); the Docker image's
# ipykernel 6.17 moves each write through its iopub thread and still mixes some (see docs).
ORDERED = (
    "import os, subprocess\n"
    "for i in range(30):\n"
    "    print(f'p{i}')\n"
    "    _ = os.write(1, f'f{i}\\n'.encode())\n"
    "    if i % 10 == 0: _ = subprocess.run(['echo', f'c{i}'])\n"
)


@pytest.mark.parametrize(
    "backend", params(("kernel", "fork-kernel", "sandboxed-kernel")), indirect=True
)
def test_fd_text_and_prints_keep_the_order_written(ex: Any) -> None:
    want = "".join(f"p{i}\nf{i}\n" + (f"c{i}\n" if i % 10 == 0 else "") for i in range(30))
    for _ in range(5):
        r = ex.execute(ORDERED)
        assert (r.stdout, r.output) == (want, want)


@pytest.mark.parametrize("backend", params(("kernel", "docker-kernel")), indirect=True)
def test_blocks_that_exit_or_leave_a_printing_child_say_so(ex: Any) -> None:
    r = ex.execute("kept = 1\nprint('before')\nimport sys; sys.exit(3)")
    assert r.error is not None and r.error.ename == "SystemExit" and not r.kernel_died, r.output
    assert r.stdout == "before\n" and ex.execute("print(kept)").output == "1\n"
    # A child forked by the block prints after the block ended: in no block, least of all
    # the next one.
    r = ex.execute(
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(0.5); print('KXLATECHILD', flush=True); os._exit(0)\n"
        "print('parent')"
    )
    assert r.ok and r.output == "parent\n", r.output
    r = ex.execute("import time; time.sleep(1.5); print('next')")
    assert r.output == "next\n", r.output
    r = ex.execute("import os; os._exit(0)")
    assert r.kernel_died and r.state_lost and not r.not_run and r.exit_code == 1, r.output
    assert "while running this block" in r.output
    assert ex.execute("print('kept' in dir())").output == "False\n"
