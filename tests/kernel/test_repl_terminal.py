"""``kernelexec repl`` driven through a real terminal (pexpect), as a user types (issue 13.8).

Ctrl-C while a block runs interrupts that block (state kept, prompt back); Ctrl-C at the prompt
drops the line being typed; Ctrl-D quits with status 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

ROOT = Path(__file__).resolve().parents[2]  # this checkout's kernelexec
PROMPT = ">>> "


def spawn(executor: str, tmp_path: Path) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "kernelexec", "repl", "--executor", executor, "--work-dir", str(tmp_path)],
        cwd=str(ROOT),
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 200),
    )
    child.expect_exact(PROMPT)
    return child


@pytest.fixture
def repl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[pexpect.spawn]:
    child = spawn(request.param, tmp_path / "work")
    try:
        yield child
    finally:
        if child.isalive():
            child.terminate(force=True)
        child.close()


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


SLEEPER = "import time; open('started', 'w').close(); time.sleep(30)"


def run(child: pexpect.spawn, line: str) -> None:
    """Type ``line`` and a blank line (which runs the block)."""
    child.sendline(line)
    child.expect_exact(["... ", PROMPT])  # the continuation prompt
    child.sendline("")


@pytest.mark.parametrize("repl", ["kernel"], indirect=True)
def test_ctrl_c_interrupts_the_block_and_keeps_state(repl: pexpect.spawn, tmp_path: Path) -> None:
    run(repl, "kept = 41")
    repl.expect_exact(PROMPT)
    run(repl, SLEEPER)
    wait_for(tmp_path / "work" / "started")
    repl.sendintr()
    repl.expect_exact("KeyboardInterrupt", timeout=15)
    repl.expect_exact(PROMPT, timeout=15)
    run(repl, "print(kept + 1)")
    repl.expect_exact("42")
    repl.expect_exact(PROMPT)
    assert "ZMQError" not in (repl.before or "")
    repl.sendeof()
    repl.expect(pexpect.EOF, timeout=30)
    repl.close()
    assert repl.exitstatus == 0


@pytest.mark.parametrize("repl", ["command"], indirect=True)
def test_ctrl_c_stops_a_command_block_and_the_repl_goes_on(
    repl: pexpect.spawn, tmp_path: Path
) -> None:
    run(repl, SLEEPER)
    wait_for(tmp_path / "work" / "started")
    repl.sendintr()
    repl.expect_exact("KeyboardInterrupt", timeout=15)
    repl.expect_exact(PROMPT, timeout=15)
    run(repl, "print(6 * 7)")
    repl.expect_exact("42")
    repl.expect_exact(PROMPT)
    repl.sendeof()
    repl.expect(pexpect.EOF, timeout=30)
    repl.close()
    assert repl.exitstatus == 0


@pytest.mark.parametrize("repl", ["kernel"], indirect=True)
def test_ctrl_c_at_the_prompt_drops_the_pending_input(repl: pexpect.spawn) -> None:
    repl.sendline("x = 'first line of a block'")
    repl.expect_exact(["... ", PROMPT])
    repl.send("print('never run')")
    repl.sendintr()
    repl.expect_exact("KeyboardInterrupt")
    repl.expect_exact(PROMPT)
    run(repl, "print('x' in dir())")  # the dropped block never ran
    repl.expect_exact("False")
    repl.expect_exact(PROMPT)
    assert "never run" not in (repl.before or "")
    repl.sendeof()
    repl.expect(pexpect.EOF, timeout=30)
    repl.close()
    assert repl.exitstatus == 0
