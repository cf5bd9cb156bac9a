"""Detached blocks (``submit``) on real kernels: peek, wait, queue order, cancel, close, host death.

One kernel serves the module (state that matters is set by each test); the close and stubborn-block
tests take their own, as does the host-killed test (in a child process). Blocks wait on a gate
file in the work dir rather than on sleeps, so the tests do not depend on the machine's load.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest

from kernelexec import (
    AsyncCommandLineExecutor,
    AsyncKernelExecutor,
    AsyncSessionManager,
    CommandLineExecutor,
    ExecutionTimeout,
    JobNotFinished,
    JobStatus,
    KernelExecError,
    KernelExecutor,
    SessionOptions,
)

ROOT = Path(__file__).resolve().parents[2]

# Prints a marker, then waits until the file GATE exists in the work dir (the test opens it).
GATED = """\
import os, time
print('started {name}', flush=True)
while not os.path.exists('{gate}'):
    time.sleep(0.02)
print('finished {name}')
"""


def _until(check: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    work = tmp_path_factory.mktemp("jobs")
    with KernelExecutor(work_dir=work / "work", notebook_path=work / "session.ipynb") as executor:
        yield executor


def _gate(ex: KernelExecutor, name: str) -> tuple[str, Path]:
    path = ex.work_dir / f"gate-{name}"
    path.unlink(missing_ok=True)
    return GATED.format(name=name, gate=path.name), path


def _cells(ex: KernelExecutor) -> list[nbformat.NotebookNode]:
    path = ex.aio._notebook.path
    assert path is not None
    return list(nbformat.read(path, as_version=4).cells)  # type: ignore[no-untyped-call]


def test_submit_returns_at_once_peek_shows_outputs_and_notebook_follows(
    ex: KernelExecutor,
) -> None:
    code, gate = _gate(ex, "a")
    started = time.monotonic()
    job = ex.submit(code)
    assert time.monotonic() - started < 2.0  # it did not wait for the block
    assert job.id.startswith("job-")
    _until(lambda: "started a" in job.peek().output)
    assert not job.done() and job.status is JobStatus.RUNNING and job.result is None
    # The session notebook file shows the running job's cell, with what it printed so far.
    _until(lambda: any("started a" in str(c.outputs) for c in _cells(ex)))
    live = _cells(ex)[-1]
    assert live.metadata["kernelexec"]["job"] == job.id
    assert live.metadata["kernelexec"]["status"] == "running"
    gate.touch()
    result = job.wait(30)
    assert result.ok and "finished a" in result.output
    assert job.done() and job.peek() is result
    assert job.status.value == "done"  # (mypy narrowed .status to RUNNING above)
    final = _cells(ex)[-1]
    assert final.metadata["kernelexec"]["status"] == "done"
    assert final.metadata["kernelexec"]["job"] == job.id
    assert "finished a" in str(final.outputs)


def test_blocks_queue_behind_a_job_in_order_with_positions(ex: KernelExecutor) -> None:
    code, gate = _gate(ex, "b")
    first = ex.submit("order = [1]\n" + code)
    _until(lambda: "started b" in first.peek().output)
    second = ex.submit("order.append(2)")
    third = ex.submit("order.append(3); print(order)")
    assert (second.status, second.position) == (JobStatus.QUEUED, 1)
    assert third.position == 2
    assert first.position is None  # running
    gate.touch()
    assert third.wait(30).output.strip() == "[1, 2, 3]"
    assert second.status is JobStatus.DONE and second.position is None
    # A block sent right after a submit runs after the job, not before it.
    ex.submit("after_submit = 'job first'")
    assert ex.execute("print(after_submit)").output.strip() == "job first"


def test_wait_with_timeout_raises_and_the_job_runs_on(ex: KernelExecutor) -> None:
    code, gate = _gate(ex, "c")
    job = ex.submit(code)
    with pytest.raises(JobNotFinished) as caught:
        job.wait(0.3)
    assert isinstance(caught.value, ExecutionTimeout | TimeoutError | KernelExecError)
    assert job.id in str(caught.value)
    assert not job.done()
    gate.touch()
    assert "finished c" in job.wait(30).output
    with pytest.raises(ValueError):
        job.wait(-1)


def test_cancel_interrupts_keeps_state_and_twice_changes_nothing(ex: KernelExecutor) -> None:
    ex.execute("kept = 5")
    code, _ = _gate(ex, "never")
    job = ex.submit("kept = 6\n" + code)
    _until(lambda: "started never" in job.peek().output)
    result = job.cancel()
    assert job.status is JobStatus.CANCELLED and job.done()
    assert result.error is not None and result.error.ename == "JobCancelled"
    assert "started never" in result.output and "state is kept" in result.output
    assert not result.not_run and not result.state_lost
    assert job.cancel() is result  # twice: no-op, the same answer
    assert job.wait(5) is result  # waiting on a cancelled job: its result at once
    assert ex.execute("print(kept)").output.strip() == "6"  # the session's state is kept
    cell = next(c for c in _cells(ex) if c.metadata["kernelexec"].get("job") == job.id)
    assert cell.metadata["kernelexec"]["status"] == "cancelled"


def test_cancel_a_queued_job_and_it_never_runs(ex: KernelExecutor) -> None:
    code, gate = _gate(ex, "d")
    first = ex.submit(code)
    queued = ex.submit("queued_ran = True")
    result = queued.cancel()
    assert result.not_run and queued.status is JobStatus.CANCELLED
    assert "before it ran" in result.output
    gate.touch()
    first.wait(30)
    assert ex.execute("print('queued_ran' in globals())").output.strip() == "False"
    assert all(c.metadata["kernelexec"].get("job") != queued.id for c in _cells(ex))


def test_async_twin_a_stubborn_job_and_close_with_jobs_running(tmp_path: Path) -> None:
    """The async core's jobs; a block that ignores the interrupt gets its kernel replaced (the
    result says its state is gone); close() ends a running and a queued job as cancelled and
    leaves no kernel running."""

    async def scenario() -> None:
        ex = AsyncKernelExecutor(work_dir=tmp_path, interrupt_grace=1.0)
        await ex.start()
        try:
            stubborn = await ex.submit(
                "import time\nprint('holding', flush=True)\nwhile True:\n"
                "    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass\n"
            )
            while "holding" not in stubborn.peek().output:
                await asyncio.sleep(0.02)
            result = await stubborn.cancel()
            assert result.state_lost and "state is gone" in result.output
            running = await ex.submit("import time\nprint('up', flush=True)\ntime.sleep(60)")
            queued = await ex.submit("print('never')")
            while "up" not in running.peek().output:
                await asyncio.sleep(0.02)
            pid = getattr(ex.backend, "pid", None)
            assert pid is not None
        finally:
            await ex.close()
        assert running.status is JobStatus.CANCELLED and queued.status is JobStatus.CANCELLED
        assert running.result is not None and "executor was closed" in running.result.output
        assert queued.result is not None and queued.result.not_run
        assert ex.jobs == []
        assert not _alive(pid), "the kernel still runs after close()"

    asyncio.run(scenario())


def test_stateless_executor_jobs(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path) as cmd:
        job = cmd.submit("import time\nprint('hi', flush=True)\ntime.sleep(60)")
        _until(lambda: "hi" in job.peek().output)
        result = job.cancel()
        assert job.status is JobStatus.CANCELLED and "hi" in result.output
        assert cmd.submit("print(2 + 2)").wait(30).output.strip() == "4"
        late = cmd.submit("import time\nprint('late', flush=True)\ntime.sleep(60)")
        _until(lambda: "late" in late.peek().output)
    # closed with the job running: it ended cancelled, and its result stays readable
    assert late.status is JobStatus.CANCELLED
    assert late.wait() is late.result and late.cancel() is late.result
    assert late.result is not None and "executor was closed" in late.result.output


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


HOST = """\
import json, sys, time
from kernelexec import KernelExecutor
work, notebook, status = sys.argv[1:4]
ex = KernelExecutor(work_dir=work, notebook_path=notebook, timeout=600)
ex.execute("print('before')")
job = ex.submit("import time\\nfor i in range(3):\\n    print('step', i, flush=True)\\n"
                "time.sleep(600)")
while "step 2" not in job.peek().output:
    time.sleep(0.02)
with open(status, "w") as f:
    json.dump({"job": job.id, "kernel_pid": ex.aio.backend.pid}, f)
time.sleep(600)
"""


def test_host_killed_with_a_job_running_notebook_says_where(tmp_path: Path) -> None:
    notebook, status = tmp_path / "session.ipynb", tmp_path / "status.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_CURRENT_TEST", None)
    argv = [sys.executable, "-c", HOST, str(tmp_path / "work"), str(notebook), str(status)]
    host = subprocess.Popen(argv, env=env)
    info: dict[str, object] = {}
    try:
        _until(lambda: status.exists() and status.stat().st_size > 0, within=90)
        info = json.loads(status.read_text())
        # the outputs reach the file within the notebook's flush interval (0.5 s)
        _until(lambda: "step 2" in notebook.read_text(), within=10)
        host.send_signal(signal.SIGKILL)
        host.wait(30)
        nb = nbformat.read(notebook, as_version=4)  # type: ignore[no-untyped-call]
        nbformat.validate(nb)
        assert nb.cells[0].source == "print('before')"
        last = nb.cells[-1]
        assert last.metadata["kernelexec"]["job"] == info["job"]
        assert last.metadata["kernelexec"]["status"] == "running"
        assert "step 2" in "".join(o.get("text", "") for o in last.outputs)
    finally:
        host.kill()
        host.wait(30)
        pid = info.get("kernel_pid")
        if isinstance(pid, int) and _alive(pid):  # the orphan: this test's to end
            os.kill(pid, signal.SIGKILL)


def test_a_session_running_a_job_is_not_culled_as_idle(tmp_path: Path) -> None:
    """A job is use: the session manager does not cull its session while it runs, nor right
    after it ends (the agent has yet to read its output)."""

    async def scenario() -> None:
        manager = AsyncSessionManager(
            lambda: AsyncCommandLineExecutor(work_dir=tmp_path),
            options=SessionOptions(idle_timeout=0.3, cull_interval=3600),
        )
        try:
            ex = await manager.create("s")
            gate = tmp_path / "gate"
            job = await ex.submit(GATED.format(name="s", gate=str(gate)))
            while "started s" not in job.peek().output:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)  # past the idle timeout, the job still running
            assert await manager.cull_idle() == []
            gate.touch()
            assert (await job.wait(30)).ok
            assert await manager.cull_idle() == []  # it has just ended
            await asyncio.sleep(0.5)
            assert await manager.cull_idle() == ["s"]  # idle since: culled as usual
        finally:
            await manager.close()

    asyncio.run(scenario())
