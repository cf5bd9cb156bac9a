"""SessionManager with real local kernels: isolation, ordering, limits, culling, threads, tasks.

At most two kernels run at once (two cores).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from kernelexec import (
    AsyncKernelPool,
    AsyncSessionManager,
    PoolOptions,
    SessionExists,
    SessionLimitReached,
    SessionManager,
    SessionNotFound,
    SessionOptions,
)
from kernelexec.backends.local_kernel import LocalKernel

# Each call appends its start and end to a list kept in the kernel, sleeping in between: if two
# calls interleaved, the list would show it. The start is also printed at once, so a test can wait
# for a call to be running (an output marker, not a sleep).
MARK = """\
EVENTS = globals().get('EVENTS', [])
EVENTS.append('{0}>')
print('started {0}', flush=True)
import time
time.sleep({1})
EVENTS.append('<{0}')
print(EVENTS)"""


def _last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def _marker_watch(set_event: Any, label: str) -> Any:
    """An ``on_output`` callback calling ``set_event`` when call ``label`` has started."""

    def watch(output: dict[str, Any]) -> None:
        if output.get("output_type") == "stream" and f"started {label}" in output.get("text", ""):
            set_event()

    return watch


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="max_sessions"):
        SessionOptions(max_sessions=0)
    with pytest.raises(ValueError, match="idle_timeout"):
        SessionOptions(idle_timeout=0)
    assert SessionOptions(idle_timeout=8).check_every == 2
    assert SessionOptions(idle_timeout=None).check_every is None


@pytest.mark.slow
def test_sessions_from_asyncio_tasks() -> None:
    async def scenario() -> None:
        options = SessionOptions(max_sessions=2, idle_timeout=None)
        running = asyncio.Event()
        watch = _marker_watch(running.set, "1")
        async with AsyncSessionManager(options=options, timeout=30, on_output=watch) as sessions:
            await asyncio.gather(sessions.create("a"), sessions.create("b"))
            assert sorted(sessions.names()) == ["a", "b"]

            # Separate kernels: state in one is not in the other.
            assert (await sessions.execute("a", "x = 1")).ok
            missing = await sessions.execute("b", "x")
            assert missing.error is not None and missing.error.ename == "NameError"

            # Two concurrent calls on one session queue in order and never interleave;
            # a call on another session meanwhile is not held up by them.
            slow = asyncio.create_task(sessions.execute("a", MARK.format("1", 1.0)))
            await asyncio.wait_for(running.wait(), 30)  # the first call is running
            queued = asyncio.create_task(sessions.execute("a", MARK.format("2", 0)))
            other = await sessions.execute("b", "print('b ran')")
            assert other.output.strip() == "b ran"
            assert not slow.done()
            first, second = await slow, await queued
            assert _last_line(first.output) == "['1>', '<1']"
            assert _last_line(second.output) == "['1>', '<1', '2>', '<2']"

            with pytest.raises(SessionLimitReached, match="2 sessions"):
                await sessions.create("c")
            with pytest.raises(SessionExists, match="exists"):
                await sessions.create("a")

            await sessions.close_session("b")
            with pytest.raises(SessionNotFound, match="no session named 'b'"):
                await sessions.execute("b", "1")
            await sessions.create("c")  # room again

    asyncio.run(scenario())


@pytest.mark.slow
def test_sessions_from_threads() -> None:
    running = threading.Event()
    options = SessionOptions(max_sessions=1, idle_timeout=None)
    with SessionManager(options=options, on_output=_marker_watch(running.set, "1")) as sessions:
        sessions.create("t")
        results: dict[str, str] = {}

        def call(label: str, pause: float) -> None:
            results[label] = _last_line(sessions.execute("t", MARK.format(label, pause)).output)

        first = threading.Thread(target=call, args=("1", 1.0))
        first.start()
        assert running.wait(30)  # the first call is running; the second queues behind it
        second = threading.Thread(target=call, args=("2", 0))
        second.start()
        first.join(30)
        second.join(30)
        assert results == {"1": "['1>', '<1']", "2": "['1>', '<1', '2>', '<2']"}
        with pytest.raises(SessionLimitReached):
            sessions.create("u")


@pytest.mark.slow
def test_idle_sessions_are_culled_busy_ones_are_not() -> None:
    async def scenario() -> None:
        options = SessionOptions(max_sessions=2, idle_timeout=0.5, cull_interval=0.1)
        async with AsyncSessionManager(options=options, timeout=30) as sessions:
            idle = await sessions.create("idle")
            await sessions.create("busy")
            # Busy for three idle timeouts: a running call keeps its session.
            result = await sessions.execute("busy", "import time; time.sleep(1.5); print('done')")
            assert result.output.strip() == "done"
            assert "busy" in sessions
            assert "idle" not in sessions and idle.closed  # culled, its kernel closed
            with pytest.raises(SessionNotFound, match=r"closed after 0\.5 s idle"):
                await sessions.execute("idle", "1")
            await asyncio.sleep(1.0)
            assert sessions.names() == []

    asyncio.run(scenario())


@pytest.mark.slow
def test_sessions_take_kernels_from_a_pool() -> None:
    async def scenario() -> None:
        pool = AsyncKernelPool(LocalKernel, options=PoolOptions(min_size=1, max_size=2))
        async with pool, AsyncSessionManager(pool=pool) as sessions:
            await pool.wait_ready(timeout=60)
            waiting = pool._idle[0]
            kernel = waiting.backend.inner  # type: ignore[attr-defined]
            executor = await sessions.create("s")
            assert executor is waiting
            assert (await sessions.execute("s", "print(1)")).output.strip() == "1"
            await sessions.close_session("s")
            assert not await kernel.is_alive()  # a session's kernel is not reused

    asyncio.run(scenario())
