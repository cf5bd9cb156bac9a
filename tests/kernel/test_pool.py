"""KernelPool with real local kernels (pool sizes 1-2: this machine has two cores)."""

from __future__ import annotations

import asyncio

import pytest

from kernelexec import (
    AsyncKernelPool,
    ExecutorClosed,
    KernelPool,
    KernelStartFailed,
    PoolExhausted,
    PoolOptions,
)
from kernelexec._kernel import AsyncKernelExecutor
from kernelexec.backends.local_kernel import LocalKernel


def pid_of(executor: AsyncKernelExecutor) -> int:
    """The pid of the kernel behind a pooled executor."""
    pid = executor.backend.inner.pid  # type: ignore[attr-defined]
    assert isinstance(pid, int)
    return pid


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="max_size"):
        PoolOptions(max_size=0)
    with pytest.raises(ValueError, match="min_size"):
        PoolOptions(min_size=3, max_size=2)
    with pytest.raises(ValueError, match="work_dir"):
        AsyncKernelPool(work_dir="/tmp")
    with pytest.raises(ValueError, match="back end"):
        AsyncKernelPool(backend=LocalKernel())


@pytest.mark.slow
def test_acquire_gives_a_ready_kernel_never_reused_and_refills() -> None:
    async def scenario() -> None:
        options = PoolOptions(min_size=1, max_size=2, warmup_code="import json\nWARM = 42")
        async with AsyncKernelPool(LocalKernel, options=options, timeout=30) as pool:
            await pool.wait_ready(timeout=60)
            assert pool.idle == 1

            first = await pool.acquire()
            result = await first.execute("print(WARM); secret = 'only mine'")
            assert result.ok, result.output
            assert result.output.strip() == "42"  # warm-up ran before the kernel was handed out
            first_pid = pid_of(first)

            await pool.wait_ready(timeout=60)  # refilled in the background
            assert pool.idle == 1 and pool.size == 2

            await first.close()  # the used kernel is shut down, never handed out again
            assert not await first.backend.inner.is_alive()  # type: ignore[attr-defined]
            assert not first.work_dir.exists()

            second = await pool.acquire()
            assert pid_of(second) != first_pid
            leftover = await second.execute("print('secret' in dir())")
            assert leftover.output.strip() == "False"
            await second.close()

    asyncio.run(scenario())


@pytest.mark.slow
def test_more_kernels_than_the_maximum_is_refused() -> None:
    async def scenario() -> None:
        options = PoolOptions(min_size=0, max_size=1)
        async with AsyncKernelPool(LocalKernel, options=options, timeout=30) as pool:
            held = await pool.acquire()  # min_size 0: started on demand
            with pytest.raises(PoolExhausted, match="1 kernels"):
                await pool.acquire()
            await held.close()
            again = await pool.acquire()  # the slot is free once the kernel is given back
            assert (await again.execute("1 + 1")).output.strip() == "2"

    asyncio.run(scenario())


@pytest.mark.slow
def test_close_shuts_down_idle_and_lent_kernels() -> None:
    async def scenario() -> None:
        pool = AsyncKernelPool(LocalKernel, options=PoolOptions(min_size=1, max_size=2))
        await pool.start()
        lent = await pool.acquire()
        await pool.wait_ready(timeout=60)
        idle_backend = pool._idle[0].backend.inner  # type: ignore[attr-defined]
        lent_backend = lent.backend.inner  # type: ignore[attr-defined]
        await pool.close()
        assert lent.closed
        assert not await idle_backend.is_alive()
        assert not await lent_backend.is_alive()
        with pytest.raises(ExecutorClosed):
            await pool.acquire()
        await pool.close()  # twice is fine

    asyncio.run(scenario())


@pytest.mark.slow
def test_failing_warmup_is_a_start_failure() -> None:
    async def scenario() -> None:
        options = PoolOptions(min_size=1, max_size=1, warmup_code="raise RuntimeError('no numpy')")
        async with AsyncKernelPool(LocalKernel, options=options) as pool:
            with pytest.raises(KernelStartFailed, match="no numpy"):
                await pool.wait_ready(timeout=60)
            with pytest.raises(KernelStartFailed, match="no numpy"):
                await pool.acquire()  # acquire starts its own and reports the same cause
            assert pool.size == 0  # nothing half-started is kept

    asyncio.run(scenario())


@pytest.mark.slow
def test_sync_pool_hands_out_the_waiting_kernel() -> None:
    with KernelPool(LocalKernel, options=PoolOptions(min_size=1, max_size=2), timeout=30) as pool:
        pool.wait_ready(timeout=60)
        waiting = pool.aio._idle[0]
        executor = pool.acquire()
        with executor:
            # The kernel handed out is the one that was waiting, not a cold start.
            assert executor.aio is waiting
            assert executor.execute("print(6 * 7)").output.strip() == "42"
    assert executor.closed
