"""Timeouts, kernel death, exit(), restart and clean shutdown: each test owns its kernel."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kx_python import relative_python

from kernelexec import (
    AsyncKernelExecutor,
    BackendUnavailable,
    ExecutorClosed,
    KernelDied,
    KernelExecutor,
    KernelStartFailed,
    LocalKernel,
    make_async_executor,
    make_executor,
)


def kernel_pid(executor: KernelExecutor) -> int:
    pid = executor.backend.pid  # type: ignore[attr-defined]
    assert isinstance(pid, int)
    return pid


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is gone for our purposes once reaped or defunct.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# -- Part 5: timeouts -------------------------------------------------------------------------
@pytest.mark.slow
def test_timeout_interrupts_and_keeps_state(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        ex.execute("x = 'still here'")
        pid = kernel_pid(ex)
        started = time.monotonic()
        r = ex.execute("import time\nprint('started', flush=True)\ntime.sleep(60)", timeout=1)
        assert time.monotonic() - started < 5
        assert (r.exit_code, r.timed_out, r.state_lost) == (124, True, False)
        assert r.output.startswith("started\n")
        assert "interrupted" in r.output and "state were kept" in r.output
        assert "KeyboardInterrupt" not in r.output
        assert r.error is not None and r.error.ename == "Timeout"
        assert ex.execute("print(x)").output == "still here\n"
        assert kernel_pid(ex) == pid  # the same kernel


@pytest.mark.slow
def test_timeout_restarts_a_kernel_that_ignores_the_interrupt(tmp_path: Path) -> None:
    code = (
        "import time\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(0.1)\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n"
    )
    with KernelExecutor(work_dir=tmp_path, timeout=30, interrupt_grace=1.0) as ex:
        ex.execute("x = 1")
        pid = kernel_pid(ex)
        started = time.monotonic()
        r = ex.execute(code, timeout=1)
        assert time.monotonic() - started < 15
        assert (r.exit_code, r.timed_out, r.state_lost) == (124, True, True)
        assert "restarted" in r.output and "state was lost" in r.output
        assert kernel_pid(ex) != pid
        assert process_gone(pid)
        # The new kernel is idle: nothing left queued from the stuck block.
        assert ex.execute("'x' in globals()").output == "False"


def test_a_block_that_never_returns_returns_at_the_timeout(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=1) as ex:
        started = time.monotonic()
        r = ex.execute("while True: pass")
        assert time.monotonic() - started < 5
        assert r.exit_code == 124 and r.timed_out
        assert ex.execute("1 + 1", timeout=10).output == "2"


# -- Part 6: kernel death ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "code",
    [
        "import os; os._exit(1)",
        "import ctypes; ctypes.string_at(0)",  # segfault
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    ],
    ids=["os-exit", "segfault", "sigkill"],
)
def test_kernel_death_is_noticed_fast_and_the_kernel_restarted(tmp_path: Path, code: str) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=60) as ex:
        ex.execute("x = 1")
        started = time.monotonic()
        r = ex.execute(code)
        assert time.monotonic() - started < 15  # not the 60 s timeout (a loaded CI machine: 5.05 s)
        assert r.kernel_died and r.state_lost and r.exit_code == 1
        assert "kernel died" in r.output and "restarted" in r.output
        assert r.error is not None and r.error.ename == "KernelDied"
        after = ex.execute("'x' in globals()")
        assert after.ok and after.output == "False"


@pytest.mark.slow
def test_death_reason_names_the_signal(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=60) as ex:
        r = ex.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        assert "SIGKILL" in r.output


def test_killed_from_outside_while_idle_then_used(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        os.kill(kernel_pid(ex), signal.SIGKILL)
        time.sleep(0.2)
        r = ex.execute("print('hi')")
        assert r.kernel_died and r.exit_code == 1
        assert ex.execute("print('hi')").output == "hi\n"


def test_without_restart_on_death_the_next_call_raises(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30, restart_on_death=False) as ex:
        r = ex.execute("import os; os._exit(1)")
        assert r.kernel_died and not r.state_lost
        assert "not restarted" in r.output
        with pytest.raises(KernelDied):
            ex.execute("1")
        ex.restart()  # an explicit restart brings a kernel back
        assert ex.execute("1 + 1").output == "2"


@pytest.mark.slow
@pytest.mark.parametrize("code", ["exit()", "quit()"])
def test_exit_and_quit_are_reported_and_never_hang(tmp_path: Path, code: str) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        ex.execute("x = 1")
        started = time.monotonic()
        r = ex.execute(f"print('before'); {code}")
        assert time.monotonic() - started < 10
        assert r.state_lost and "called exit()" in r.output
        assert r.output.startswith("before")
        assert ex.execute("print('after')").output == "after\n"


def test_sys_exit_is_an_error_result_and_keeps_state(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        ex.execute("x = 5")
        r = ex.execute("import sys; sys.exit(3)")
        assert r.exit_code == 1
        assert r.error is not None and (r.error.ename, r.error.evalue) == ("SystemExit", "3")
        assert ex.execute("x").output == "5"


# -- Part 1: restart --------------------------------------------------------------------------
def test_restart_gives_a_clean_kernel(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        ex.execute("x = 1")
        old = kernel_pid(ex)
        ex.restart()
        assert kernel_pid(ex) != old
        assert process_gone(old)
        assert ex.execute("'x' in globals()").output == "False"
        # Set-up ran again: the kernel's interpreter first on PATH for shell blocks.
        r = ex.execute("command -v python", "sh")
        assert Path(r.output.strip()).parent == Path(sys.executable).parent


# -- Part 11: lifecycle -----------------------------------------------------------------------
def _socket_count() -> int:
    return len([fd for fd in os.listdir("/proc/self/fd") if _is_socket(fd)])


def _is_socket(fd: str) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    except OSError:
        return False


def test_close_leaves_no_process_thread_or_socket(tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    sockets_before = _socket_count()
    ex = KernelExecutor(work_dir=tmp_path, timeout=30)
    ex.execute(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    )
    child = int(ex.execute("child.pid").output)
    pid = kernel_pid(ex)
    ipc_dir = Path(ex.backend._ipc_dir)  # type: ignore[attr-defined]
    assert ipc_dir.is_dir()
    ex.close()
    ex.close()  # twice is fine
    assert process_gone(pid)
    deadline = time.monotonic() + 5
    while not process_gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_gone(child)  # what the block started went with the kernel
    assert set(threading.enumerate()) <= threads_before
    assert _socket_count() <= sockets_before
    assert not ipc_dir.exists()
    with pytest.raises(ExecutorClosed):
        ex.execute("1")


def test_async_context_manager_and_interrupt(tmp_path: Path) -> None:
    async def main() -> None:
        running = asyncio.Event()

        def watch(output: dict[str, Any]) -> None:
            if "sleeping" in output.get("text", ""):
                running.set()

        async with AsyncKernelExecutor(work_dir=tmp_path, timeout=30, on_output=watch) as ex:
            code = "import time; print('sleeping', flush=True); time.sleep(30)"
            ex_task = asyncio.ensure_future(ex.execute(code))
            await asyncio.wait_for(running.wait(), 30)  # the block is running: no guessed sleep
            await ex.interrupt()
            r = await asyncio.wait_for(ex_task, 10)
            assert r.error is not None and r.error.ename == "KeyboardInterrupt"
        assert ex.closed
        with pytest.raises(ExecutorClosed):
            await ex.execute("1")

    asyncio.run(main())


@pytest.mark.parametrize("name", ["kernel", "fork-kernel"])
def test_a_cancelled_block_is_stopped_and_the_next_one_runs_at_once(
    tmp_path: Path, name: str
) -> None:
    """``asyncio.wait_for(ex.execute(...), 1)``: the block ran on in the kernel, and the next
    block queued behind it until its own timeout ("ran longer than 10 s"); interrupted without
    waiting, the next block met ipykernel's abort of requests that arrive while it handles the
    interrupt (an empty "Error"). The cancelled block is stopped and followed to its end."""

    async def main() -> None:
        async with make_async_executor(name, work_dir=tmp_path, timeout=10) as ex:
            await ex.execute("kept = 7")
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ex.execute("import time; time.sleep(60)"), 1)
            assert time.monotonic() - started < 9
            r = await ex.execute("kept + 1")
            assert (r.ok, r.output) == (True, "8"), r
            r = await ex.execute("print('after'); kept")
            assert r.output == "after\n7", r.output

    asyncio.run(main())


@pytest.mark.parametrize("action", ["close", "restart"])
def test_close_or_restart_from_another_thread_interrupts_the_running_block(
    tmp_path: Path, action: str
) -> None:
    """They waited for the running block to end (its whole timeout, for a long one)."""
    sleeping = threading.Event()

    def watch(output: dict[str, Any]) -> None:
        if "sleeping" in output.get("text", ""):
            sleeping.set()

    ex = KernelExecutor(work_dir=tmp_path, timeout=60, on_output=watch)
    results: list[Any] = []
    code = "import time; print('sleeping', flush=True); time.sleep(60)"
    runner = threading.Thread(target=lambda: results.append(ex.execute(code)))
    runner.start()
    try:
        assert sleeping.wait(30)
        started = time.monotonic()
        getattr(ex, action)()
        assert time.monotonic() - started < 30
        runner.join(30)
        (result,) = results
        assert result.error is not None and result.error.ename == "KeyboardInterrupt"
        if action == "restart":
            assert ex.execute("1 + 1").output == "2"
    finally:
        ex.close()
        runner.join(60)


@pytest.mark.parametrize("name", ["kernel", "fork-kernel"])
def test_a_flood_to_the_kernels_file_descriptors_does_not_fill_its_log(
    tmp_path: Path, name: str
) -> None:
    """What reaches fd 2 (C code, child processes) is shown as stderr and, as ipykernel does,
    also written where fd 2 went before: the kernel's log, which took all 30 MB."""
    flood = "head -c 30000000 /dev/zero | tr '\\0' x >&2"
    with make_executor(name, work_dir=tmp_path, timeout=60) as ex:
        r = ex.execute(f"import subprocess; subprocess.run({flood!r}, shell=True); print('done')")
        assert r.ok and "done" in r.stdout and "xxxx" in r.stderr
        backend = ex.backend
        folder = getattr(backend, "_dir", None) or getattr(backend, "_ipc_dir", None)
        assert folder is not None
        assert os.path.getsize(os.path.join(folder, "kernel.log")) <= 1024 * 1024 + 65536


def test_owned_temp_work_dir_is_removed(tmp_path: Path) -> None:
    with KernelExecutor(timeout=30) as ex:
        work = ex.work_dir
        assert ex.execute("import os; os.getcwd()").output == repr(str(work))
    assert not work.exists()


# -- back end options -------------------------------------------------------------------------
def test_python_interpreter_option(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30, python=sys.executable) as ex:
        assert ex.execute("import sys; sys.executable").output == repr(sys.executable)


@pytest.mark.parametrize("form", ["interpreter", "virtualenv"])
def test_relative_python_is_resolved_against_the_callers_cwd(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 14.8: relative to the caller's cwd, not to the work dir the kernel starts in.
    relative = relative_python(form, tmp_path, monkeypatch)
    backend = LocalKernel(python=relative)
    with KernelExecutor(backend, work_dir=tmp_path / "deeper" / "work", timeout=60) as ex:
        monkeypatch.chdir(tmp_path)  # a later cwd change does not matter either
        result = ex.execute("import sys\nprint(sys.prefix)")
        ex.restart()  # a restarted kernel uses the same interpreter
        again = ex.execute("import sys\nprint(sys.prefix)")
    assert result.ok and again.ok, (result.output, again.output)
    assert result.output.strip() == again.output.strip() == sys.prefix


def test_python_without_ipykernel_is_backend_unavailable(tmp_path: Path) -> None:
    fake = tmp_path / "venv" / "bin"
    fake.mkdir(parents=True)
    script = fake / "python"
    script.write_text("#!/bin/sh\necho 'No module named ipykernel' >&2\nexit 1\n")
    script.chmod(0o755)
    with pytest.raises(BackendUnavailable, match="ipykernel"):
        KernelExecutor(work_dir=tmp_path, python=tmp_path / "venv").start()


def test_unknown_kernelspec_is_start_failure(tmp_path: Path) -> None:
    ex = KernelExecutor(work_dir=tmp_path, kernel_name="no-such-kernel-xyz")
    with pytest.raises(KernelStartFailed, match="no-such-kernel-xyz"):
        ex.start()
    ex.close()


def test_a_kernel_that_exits_at_once_is_start_failure(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    # Imports fine (the check passes) but dies as a kernel.
    fake.write_text(
        f'#!/bin/sh\ncase "$2" in ipykernel_launcher) exit 7;; esac\nexec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    backend = LocalKernel(python=fake)
    ex = KernelExecutor(backend, work_dir=tmp_path / "w", timeout=30)
    with pytest.raises(KernelStartFailed, match="exit status 7"):
        ex.start()
    ex.close()
    assert backend.pid is None
