"""``close()`` (or ``restart()``) of a command executor from another thread while a block runs
(issue 31.7), for every command back end: it stops the block instead of waiting for it."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

# The block starts a detached child (a session of its own) and then sleeps far past the test:
# close() must kill both, not wait. Each prints a marker once it runs.
CLOSE_BLOCK = """\
import subprocess, sys, time
subprocess.Popen(["sleep", "{seconds}"], start_new_session=True)
print("sleeping", flush=True)
time.sleep({seconds})
print("woke up", flush=True)
"""


def unique_seconds() -> str:
    """About 30 s, as a string no other process's command line holds (the child's marker)."""
    return f"30.{random.randint(10**5, 10**6 - 1)}"


def close_during_block(ex: Any, seconds: str, action: str = "close") -> tuple[float, Any]:
    """Run ``CLOSE_BLOCK`` on the sync executor ``ex`` in a thread, close (or restart) ``ex``
    from this one once the block prints, and return (how long that took, the block's result).
    After a restart the executor must still run a block; ``ex`` is closed in the end."""
    sleeping = threading.Event()

    def watch(output: dict[str, Any]) -> None:
        if "sleeping" in str(output.get("text", "")):
            sleeping.set()

    ex.aio.on_output = watch
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(ex.execute(CLOSE_BLOCK.format(seconds=seconds), timeout=60))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        assert sleeping.wait(60), f"the block never printed its marker: {errors}"
        started = time.monotonic()
        getattr(ex, action)()
        took = time.monotonic() - started
        runner.join(30)
        if action == "restart":
            assert ex.execute("print('after')").output == "after\n"
    finally:
        ex.close()
        runner.join(90)
    assert not errors, errors
    (result,) = results
    return took, result


def check_stopped_by_close(took: float, result: Any, action: str = "close") -> None:
    """close() returned well before the block's end and the result says why it ended."""
    assert took < 15, f"{action}() took {took:.1f} s: it waited for the block"
    assert "sleeping" in result.stdout and "woke up" not in result.stdout, result
    assert result.error is not None and result.error.ename == "Stopped", result
    assert result.exit_code == 137, result
    done = {"close": "closed", "restart": "restarted"}[action]
    assert f"the executor was {done} while the block ran" in result.output, result


def host_processes_with(marker: str, within: float = 10) -> list[int]:
    """The host processes whose command line still holds ``marker`` after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        found = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _holds(pid, marker)]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _holds(pid: str, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except OSError:
        return False
