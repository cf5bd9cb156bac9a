"""Blocks that run past their timeout: busy, asleep, or deaf to SIGINT."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kx_adversarial import ALL, KERNELS, SLACK, backends, wait_gone

TIMEOUT = 3.0

BUSY = "print('start', flush=True)\nwhile True:\n    pass\n"
ASLEEP = "import time\nprint('start', flush=True)\ntime.sleep(600)\n"
DEAF = (
    "import signal\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('start', flush=True)\n"
    "while True:\n"
    "    pass\n"
)


def _run_past_timeout(ex: Any, code: str, token: str) -> Any:
    # Saved under the token's name: a stateless block's process carries it in its command line.
    code = f"# filename: {token}.py\n{code}"
    started = time.monotonic()
    r = ex.execute(code, timeout=TIMEOUT)
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT + SLACK, f"returned after {elapsed:.1f} s"
    assert (r.exit_code, r.timed_out) == (124, True), r.output
    assert r.output.startswith("start\n"), r.output  # what it printed before is kept
    assert r.error is not None and r.error.ename == "Timeout"
    assert f"{TIMEOUT:g} s" in r.output  # the note says which limit was passed
    return r


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
@pytest.mark.parametrize("code", [BUSY, ASLEEP], ids=["busy-loop", "sleep"])
def test_past_the_timeout_state_is_kept(backend: str, ex: Any, code: str, token: str) -> None:
    stateful = backend in KERNELS
    ex.execute("kept = 'yes'")
    r = _run_past_timeout(ex, code, token)
    if stateful:
        assert not r.state_lost and "state were kept" in r.output, r.output
        assert ex.execute("print(kept)").output == "yes\n"
    else:
        assert "killed" in r.output
        assert wait_gone(token) == []
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_a_loop_deaf_to_sigint_loses_state_and_says_so(backend: str, ex: Any, token: str) -> None:
    ex.execute("kept = 'yes'")
    r = _run_past_timeout(ex, DEAF, token)
    if backend in KERNELS:
        # The interrupt cannot stop it: the kernel is replaced, and the result says so.
        assert r.state_lost, r.output
        assert "state was lost" in r.output, r.output
        assert ex.execute("print('kept' in dir())").output == "False\n"
    else:
        assert wait_gone(token) == []
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize(
    "backend",
    backends(ALL),
    indirect=True,
)
def test_the_timeout_error_says_timeout_once(backend: str, ex: Any) -> None:
    r = ex.execute("import time\ntime.sleep(600)", timeout=1)
    assert r.timed_out
    assert "Timeout: Timeout:" not in str(r.error)
