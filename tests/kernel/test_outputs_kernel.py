"""Adversarial outputs through a real local kernel: nothing lost, counts true, text readable."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_peak import host_peak_mb

from kernelexec import InvalidTimeout, InvalidWorkDir, KernelExecutor

_OMITTED_CHARS = re.compile(r"\[\.\.\. (\d+) characters omitted")

DISPLAYS = """\
from IPython.display import display, HTML
for i in range({n}):
    display(HTML(f'<b>{{i}}</b>'))
"""


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    with KernelExecutor(work_dir=tmp_path_factory.mktemp("outputs"), timeout=60) as executor:
        yield executor


def body(output: str) -> str:
    return output.split("\n[full output in ")[0]


@pytest.mark.slow
def test_ten_thousand_displays_are_kept_or_counted(ex: KernelExecutor) -> None:
    result = ex.execute(DISPLAYS.format(n=10_000), timeout=300)
    assert result.exit_code == 0
    kept = [o["data"]["text/html"] for o in result.outputs if "text/html" in o.get("data", {})]
    omitted = sum(
        o["metadata"]["kernelexec"]["omitted_outputs"]
        for o in result.outputs
        if "kernelexec" in o.get("metadata", {})
    )
    assert len(kept) + omitted == 10_000  # every display: kept, or counted
    assert omitted > 0 and result.truncated
    assert f"[... {omitted} display outputs omitted ...]" in result.output
    assert kept[0] == "<b>0</b>" and kept[-1] == "<b>9999</b>"
    html_files = [p for p in result.files if p.suffix == ".html"]
    assert len(html_files) == len(kept)  # files only for the outputs kept


@pytest.mark.slow
def test_a_slow_reader_loses_no_display(ex: KernelExecutor) -> None:
    """zmq drops iopub messages past its high-water mark when the reader lags: not here."""
    seen: list[str] = []

    def slow(output: dict[str, Any]) -> None:
        seen.append(output["output_type"])
        time.sleep(0.002)  # a reader (an on_output callback) slower than the kernel writes

    ex.aio.on_output = slow
    try:
        result = ex.execute(DISPLAYS.format(n=3000), timeout=300)
    finally:
        ex.aio.on_output = None
    assert result.exit_code == 0
    assert seen.count("display_data") == 3000  # every message came through


def test_a_long_line_is_cut_once_with_the_true_count(ex: KernelExecutor) -> None:
    result = ex.execute("print('x' * 100_000)")
    [count] = [int(n) for n in _OMITTED_CHARS.findall(result.output)]
    assert count + body(result.output).count("x") == 100_000
    assert result.truncated


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf])
def test_a_bad_per_call_timeout_is_refused(ex: KernelExecutor, timeout: float) -> None:
    with pytest.raises(InvalidTimeout, match="timeout"):
        ex.execute("print('ran')", timeout=timeout)
    with pytest.raises(ValueError, match="timeout"):
        ex.execute("print('ran')", timeout=timeout)
    assert ex.execute("print('still usable')").output == "still usable\n"


def test_a_bad_constructor_timeout_is_the_same_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidTimeout):
        KernelExecutor(work_dir=tmp_path, timeout=0)


def test_a_work_dir_that_is_a_file_is_refused_clearly(tmp_path: Path) -> None:
    file = tmp_path / "not-a-dir"
    file.write_text("x")
    with pytest.raises(InvalidWorkDir, match="not-a-dir"):
        KernelExecutor(work_dir=file)
    with pytest.raises(InvalidWorkDir):
        KernelExecutor(work_dir=file / "below")


def test_a_work_dir_replaced_by_a_file_is_refused_clearly(ex: KernelExecutor) -> None:
    aside = ex.work_dir.with_name(ex.work_dir.name + "-aside")
    ex.work_dir.rename(aside)
    ex.work_dir.write_text("a file now")
    try:
        with pytest.raises(InvalidWorkDir, match="not a directory"):
            ex.execute("print(1)")
    finally:
        ex.work_dir.unlink()
        aside.rename(ex.work_dir)
    assert ex.execute("print(1)").output == "1\n"


def test_timeout_message_is_not_doubled(ex: KernelExecutor) -> None:
    result = ex.execute("import time; print('go', flush=True); time.sleep(30)", timeout=1)
    assert result.timed_out and result.error is not None
    assert "Timeout: Timeout" not in str(result.error)
    assert "Timeout: Timeout" not in json.dumps(result.to_dict())
    assert str(result.error).startswith("Timeout: the block ran longer than 1 s")


def test_binary_output_is_visible_not_raw(ex: KernelExecutor) -> None:
    result = ex.execute("import os, sys; sys.stdout.flush(); os.write(1, b'a\\x00b\\x07c\\n')")
    assert "\x00" not in result.output and "\x07" not in result.output
    assert "a\\x00b\\x07c" in result.output
    assert "\x00" in result.stdout  # the raw text, as documented


def test_traceback_lines_as_jupyter_shows_them(ex: KernelExecutor) -> None:
    result = ex.execute("def f():\n    1/0\nf()")
    assert result.error is not None
    raw = next(o for o in result.outputs if o["output_type"] == "error")["traceback"]
    assert any("\x1b[" in line for line in raw)  # the notebook keeps the colours
    text = json.dumps(result.to_dict()["error"])
    assert "\\u001b" not in text  # JSON has none
    joined = "\n".join(result.error.traceback)
    assert "\n\nCell In" in joined  # the blank line between frames is kept
    assert joined in result.output


def test_a_pil_image_gives_one_file(ex: KernelExecutor) -> None:
    result = ex.execute("from PIL import Image\nImage.new('RGB', (4, 4), 'red')")
    assert [p.suffix for p in result.files] == [".png"]
    assert {"image/png", "image/jpeg"} <= set(result.outputs[0]["data"])


_RSS_PROBE = """\
import sys
from kernelexec import KernelExecutor

def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024

with KernelExecutor(timeout=300) as ex:
    ex.execute("1")
    before = peak_mb()
    result = ex.execute(sys.argv[1])
    print(before, peak_mb(), result.exit_code, len(result.output))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize(
    "code",
    [
        "print('x' * 50_000_000)",
        "import sys\nfor _ in range(100): sys.stdout.write('y' * 1_000_000 + '\\n')",
    ],
    ids=["one-50MB-line", "100MB-of-lines"],
)
def test_host_memory_stays_bounded_under_a_flood(tmp_path: Path, code: str) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(_RSS_PROBE))
    done = subprocess.run(
        [sys.executable, str(probe), code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},  # this checkout
        check=True,
    )
    before, peak, exit_code, length = (int(v) for v in done.stdout.split()[-4:])
    assert exit_code == 0 and length < 30_000
    # Generous (measured: under 20 MB; 190 to 290 MB when a flood came as one message).
    assert peak - before < 100, f"host peak RSS grew by {peak - before} MB"


# -- 30.5: every output is bounded where it crosses; the session holds no huge text ----------------
def test_a_huge_error_is_cut_with_the_true_count_and_kept_in_full_on_disk(
    ex: KernelExecutor,
) -> None:
    n = 5_000_000  # past the 1 MiB a message string is decoded whole
    result = ex.execute(f"raise ValueError('#' * {n})")
    assert result.error is not None and result.error.ename == "ValueError"
    evalue = result.error.evalue
    [count] = [int(c) for c in _OMITTED_CHARS.findall(evalue)]
    assert count + evalue.count("#") == n  # cut, and the count is true
    assert len(evalue) < 21_000 and sum(map(len, result.error.traceback)) < 30_000
    assert len(result.output) < 25_000 and result.truncated
    assert result.full_output_file is not None
    assert result.full_output_file.read_text().count("#" * n) >= 1  # nothing lost
    cell = json.dumps(ex.notebook.cells[-1])
    assert len(cell) < 60_000  # the session notebook holds the bounded form


def test_a_huge_value_is_cut_with_the_true_count(ex: KernelExecutor) -> None:
    n = 5_000_000
    result = ex.execute(f"'#' * {n}")
    [shown] = [o["data"]["text/plain"] for o in result.outputs]
    [count] = [int(c) for c in _OMITTED_CHARS.findall(shown)]
    assert count + shown.count("#") + shown.count("'") == n + 2  # and the repr's quotes
    assert len(json.dumps(ex.notebook.cells[-1])) < 30_000
    assert result.full_output_file is not None
    assert result.full_output_file.read_text().count("#" * n) == 1


def test_a_huge_html_display_lives_only_in_its_file(ex: KernelExecutor) -> None:
    n = 5_000_000
    code = f"from IPython.display import HTML, display\ndisplay(HTML('<b>' + 'h' * {n} + '</b>'))"
    result = ex.execute(code)
    [out] = result.outputs
    assert "text/html" not in out["data"]
    assert out["metadata"]["kernelexec"]["omitted_data"] == {"text/html": n + 7}
    [html] = [p for p in result.files if p.suffix == ".html"]
    assert html.stat().st_size == n + 7
    assert f"[text/html saved to outputs/{html.name}]" in result.output
    assert len(json.dumps(ex.notebook.cells[-1])) < 10_000


# -- 31.10: carriage returns ---------------------------------------------------------------------
def test_stdout_keeps_carriage_returns_output_shows_the_terminal_view(ex: KernelExecutor) -> None:
    result = ex.execute(CARRIAGE_RETURNS)
    assert result.stdout == "a\rb\n12%\r50%\r100%\n"  # as written
    assert result.outputs[0]["text"] == result.stdout  # the notebook's, as Jupyter keeps it
    assert result.output == "b\n100%\n"  # what a terminal shows


CARRIAGE_RETURNS = "print('a\\rb'); import sys; _ = sys.stdout.write('12%\\r50%\\r100%\\n')"

_MEMORY_PROBE = """\
import ctypes, gc, json, sys
from kernelexec import KernelExecutor

def status_mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) // 1024

with KernelExecutor(timeout=300) as ex:
    ex.execute("1")
    gc.collect()
    before = status_mb("VmRSS")
    results = [ex.execute(sys.argv[1]) for _ in range(3)]
    peak = status_mb("VmHWM")
    sizes = [len(r.output) + len(json.dumps(r.outputs)) for r in results]
    del results
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)  # memory freed but kept by malloc is not held
    print(before, peak, status_mb("VmRSS"), max(sizes), len(json.dumps(ex.notebook.cells)))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize(
    ("code", "peak_bound"),
    [("raise ValueError('e' * 40_000_000)", 320), ("'v' * 40_000_000", 160)],
    ids=["40MB-error", "40MB-value"],
)
def test_host_memory_for_huge_outputs_is_bounded(
    tmp_path: Path, code: str, peak_bound: int
) -> None:
    """Three blocks with a huge output each: at its peak the host holds about the messages in
    flight, and nothing of them after. Measured peak growth for the error: 154 to 229 MB, by
    whether the iopub error and the reply are held at once (its text comes four times: value
    and traceback, in each); 610 MB before outputs were bounded. For the value: 77 MB (270
    before). The bounds sit between: timing moves the peak, not back to what it was.
    40 MB: past glibc's largest mmap threshold, freed memory leaves RSS."""
    probe = tmp_path / "probe.py"
    probe.write_text(_MEMORY_PROBE)
    done = subprocess.run(
        [sys.executable, str(probe), code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},  # this checkout
        check=True,
    )
    before, peak, after, result_size, notebook_size = (int(v) for v in done.stdout.split()[-5:])
    assert result_size < 100_000 and notebook_size < 300_000
    assert after - before < 20, f"the session kept {after - before} MB after the blocks"
    assert peak - before < peak_bound, f"host peak RSS grew by {peak - before} MB"


# -- 30.5 left open: the peak while one huge message is in flight --------------------------------
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs /proc")
def test_one_huge_message_is_held_once_at_its_peak() -> None:
    """One 100 MB message (a display whose text is 100 MB). Received without a copy, it is held
    once, in the buffer libzmq received it into: measured +99 MB (about +200 MB when frames were
    copied). One message only: an exception comes as two (the error and the reply), which a
    loaded machine may hold at the same moment (CI measured more than one's worth)."""
    code = (
        "from IPython.display import display\ndisplay({'text/plain': 'e' * 100_000_000}, raw=True)"
    )
    grew, exit_code, length = host_peak_mb("kernel", code)
    assert exit_code == 0 and length < 30_000
    assert grew < 150, f"host peak RSS grew by {grew} MB for one 100 MB message"
