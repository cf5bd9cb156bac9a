"""Jobs on a fork: ``submit(code, on_fork=True)`` (issue 35, item 3) on real kernels.

The job runs on a fork of the session taken when it is submitted: the session stays free for
other blocks meanwhile, the job's state is the fork's, and the fork is closed when the job ends
(unless kept, then with the session)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from kx_containment import gone_within

from kernelexec import AsyncKernelExecutor, ForkKernel, JobStatus, KernelExecutor, SessionBusy

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def ex() -> Iterator[KernelExecutor]:
    with KernelExecutor(timeout=60) as executor:
        assert executor.execute("x = 1").exit_code == 0
        yield executor


def test_a_job_on_a_fork_leaves_the_session_free(ex: KernelExecutor) -> None:
    job = ex.submit("import time\nx += 100\ntime.sleep(3)\nprint('job', x)", on_fork=True)
    fork = job.fork
    assert isinstance(fork, KernelExecutor)
    pid = fork.aio.backend.pid
    started = time.monotonic()
    assert ex.execute("print(x + 1)").output.strip() == "2"  # not queued behind the job
    assert time.monotonic() - started < 2.5
    assert job.status is JobStatus.RUNNING
    result = job.wait(60)
    assert result.output == "job 101\n"
    assert ex.execute("print(x)").output.strip() == "1"  # the job's state was the fork's
    # the fork is closed when the job ends, before wait() returns its result
    assert fork.aio.closed and not fork.work_dir.exists()
    assert pid is not None and gone_within(pid, 5)
    assert not job.fork_kept


def test_a_kept_fork_holds_the_jobs_state_and_closes_with_the_session() -> None:
    with KernelExecutor(ForkKernel(), timeout=60) as ex:  # a fork-server kernel: quick to start
        ex.execute("x = 2")
        job = ex.submit("y = x * 10", on_fork=True, keep_fork=True)
        assert job.wait(60).exit_code == 0
        fork = job.fork
        assert isinstance(fork, KernelExecutor) and job.fork_kept
        assert fork.execute("print(y)").output.strip() == "20"
        assert "NameError" in ex.execute("y").output
        pid = fork.aio.backend.pid
    assert fork.aio.closed
    assert pid is not None and gone_within(pid, 5)


def test_cancelling_a_job_on_a_fork_twice(ex: KernelExecutor) -> None:
    job = ex.submit("import time\nprint('started', flush=True)\ntime.sleep(60)", on_fork=True)
    deadline = time.monotonic() + 30
    while "started" not in job.peek().output and time.monotonic() < deadline:
        time.sleep(0.05)
    first = job.cancel()
    assert job.status is JobStatus.CANCELLED
    assert first.error is not None and first.error.ename == "JobCancelled"
    second = job.cancel()  # again: nothing changes
    assert second.output == first.output and job.status is JobStatus.CANCELLED
    assert job.fork.aio.closed  # type: ignore[union-attr]
    assert ex.execute("print(x)").output.strip() == "1"


def test_a_job_on_a_fork_is_refused_while_a_block_runs(ex: KernelExecutor) -> None:
    with pytest.raises(ValueError, match="on_fork"):
        ex.submit("1", keep_fork=True)
    block = threading.Thread(target=ex.execute, args=("import time; time.sleep(3)",))
    block.start()
    try:
        deadline = time.monotonic() + 20
        while not ex.aio._lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(SessionBusy):
            ex.submit("1", on_fork=True)
    finally:
        block.join()


def test_the_async_twin() -> None:
    async def scenario() -> None:
        async with AsyncKernelExecutor(ForkKernel(), timeout=60) as ex:
            await ex.execute("n = 5")
            job = await ex.submit(
                "import asyncio\nn *= 2\nawait asyncio.sleep(1)\nprint(n)", on_fork=True
            )
            assert isinstance(job.fork, AsyncKernelExecutor)
            assert (await ex.execute("print(n)")).output.strip() == "5"
            assert (await job.wait(60)).output.strip() == "10"
            assert job.fork.closed

    asyncio.run(scenario())
