"""Bad input: unknown language, empty block, 5 MB of source, source that is not valid UTF-8, bad
timeouts, a work dir that is a file. Each is a clear result or an exception from the tree."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from kx_adversarial import ALL, SLACK, backends, pairs

from kernelexec import CodeBlock, InvalidTimeout, KernelExecError, make_executor

pytestmark = pytest.mark.usefixtures("nothing_left")

NAN = math.nan


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_unknown_or_missing_language_is_a_result(ex: Any) -> None:
    r = ex.execute("IDENTIFICATION DIVISION.", language="cobol")
    assert not r.ok and r.error is not None and r.error.ename == "UnsupportedLanguage"
    assert "cobol" in r.output
    r = ex.execute_block(CodeBlock(code="not python at all (", language=""))
    assert not r.ok and r.error is not None and r.error.ename == "UnknownLanguage"
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize(
    ("backend", "language"),
    pairs(ALL, ["python", "shell"]),
    indirect=["backend"],
)
def test_empty_block(ex: Any, language: str) -> None:
    r = ex.execute("", language)
    assert (r.exit_code, r.output, r.error) == (0, "", None)
    assert (r.stdout, r.stderr, r.outputs, r.files) == ("", "", [], [])
    assert not (r.timed_out or r.truncated or r.kernel_died)
    # An empty fence in a message is no block: nothing runs, and the result says so.
    r = ex.execute_message("```python\n```\n")
    assert (r.exit_code, r.error, r.files, r.block_results) == (0, None, [], [])
    assert r.output == "No code blocks found in the message; nothing was run.", r.output
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_five_mb_of_source(ex: Any) -> None:
    code = "s = '" + "a" * 5_000_000 + "'\nprint(len(s))\n"
    started = time.monotonic()
    r = ex.execute(code, timeout=60)
    assert time.monotonic() - started < 60 + SLACK
    assert (r.exit_code, r.output) == (0, "5000000\n"), r.output[:500]
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_source_that_is_not_utf8(ex: Any) -> None:
    # A lone surrogate: what a str holds when bytes that are not UTF-8 were decoded leniently.
    r = ex.execute("print('<\udcff>')\nprint('next')")
    assert r.exit_code == 0, r.output
    # The character is replaced (the back ends differ on the replacement), never lost.
    first, second = r.output.splitlines()
    assert len(first) == 3 and first[0] == "<" and first[2] == ">", r.output
    assert second == "next"
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_a_nul_byte_in_code_is_refused_and_nothing_runs(ex: Any) -> None:
    # Python refuses such source; a file or argv ends at the NUL: no back end can run it whole.
    for code, language in [
        ("open('ran-a', 'w').close()\x00open('ran-b', 'w').close()", "python"),
        ("touch ran-a\x00touch ran-b", "shell"),
        ("# filename: nul.py\nopen('ran-a', 'w').close()\n\x00\n", "python"),
    ]:
        r = ex.execute(code, language)
        assert r.not_run and r.exit_code == 1, r.output
        assert r.error is not None and r.error.ename == "InvalidBlock"
        assert "NUL byte" in r.output and "nothing was run" in r.output, r.output
        assert not any((ex.work_dir / n).exists() for n in ("ran-a", "ran-b", "nul.py"))
    assert ex.execute("print('usable')").output == "usable\n"


BAD_TIMEOUTS = [0, -1, NAN, math.inf, True, "5", b"5"]
BAD_IDS = ["zero", "negative", "nan", "inf", "bool", "str", "bytes"]


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=BAD_IDS)
def test_bad_per_call_timeout_is_refused(ex: Any, timeout: Any) -> None:
    with pytest.raises(InvalidTimeout, match="timeout"):
        ex.execute("print('ran')", timeout=timeout)
    with pytest.raises(InvalidTimeout, match="timeout"):
        ex.execute_message("```python\nprint('ran')\n```", timeout=timeout)
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=BAD_IDS)
def test_bad_executor_timeout_is_refused(backend: str, timeout: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidTimeout, match="timeout"):
        make_executor(backend, work_dir=tmp_path, timeout=timeout)


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_nan_executor_timeout_is_refused(backend: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeout"):
        ex = make_executor(backend, work_dir=tmp_path, timeout=NAN)
        ex.close()


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_a_work_dir_that_is_a_file(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    with pytest.raises(KernelExecError):
        ex = make_executor(backend, work_dir=path, timeout=10)
        try:
            ex.execute("print(1)")
        finally:
            ex.close()
    assert path.read_text() == "not a folder"
