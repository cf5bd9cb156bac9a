"""``kernelexec repl`` without ``--work-dir`` through a real terminal (pexpect): it names its
temp folder at the start and, at Ctrl-D, keeps what the session made and says where; a
session that made nothing leaves nothing (issue 34, item 2)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]  # this checkout's kernelexec
PROMPT = ">>>"


def spawn(tmp: Path) -> pexpect.spawn:
    env = {
        **os.environ,
        "TMPDIR": str(tmp),
        "PROMPT_TOOLKIT_NO_CPR": "1",  # no cursor-position query: pexpect would not answer it
        "KERNELEXEC_HISTORY": str(tmp.with_name("history")),
    }
    child = pexpect.spawn(
        sys.executable,
        ["-m", "kernelexec", "repl"],
        cwd=str(ROOT),
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 200),
        env=env,
    )
    child.expect(r"work dir (\S+) \(a new folder")
    return child


def test_ctrl_d_keeps_what_the_session_made_and_says_where(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = spawn(tmp)
    folder = Path(child.match.group(1))
    assert folder.parent == tmp and folder.is_absolute()
    child.expect_exact(PROMPT)
    child.send("open('made.txt', 'w').write('kept')\r")
    child.expect_exact("saved: made.txt")
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect_exact(f"files kept in {folder}")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (folder / "made.txt").read_text() == "kept"


def test_a_session_that_made_nothing_leaves_nothing(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = spawn(tmp)
    child.expect_exact(PROMPT)
    child.send("print(6 * 7)\r")
    child.expect_exact("42")
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect_exact("nothing was made: removed")
    child.expect(pexpect.EOF)
    child.close()
    assert list(tmp.iterdir()) == []
