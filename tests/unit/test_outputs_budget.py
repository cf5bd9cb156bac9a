"""The collector's budget over display outputs and stream text, with canned iopub messages.

Nothing is dropped silently: an output past the budget is counted in a visible marker.
"""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from kernelexec._outputs import OutputCollector, visible_text
from kernelexec._types import NbOutput
from kernelexec._view import LiveView

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\npng").decode()
JPEG = base64.b64encode(b"\xff\xd8\xffjpeg").decode()
_OMITTED_DISPLAYS = re.compile(r"\[\.\.\. (\d+) display outputs omitted \.\.\.\]")
_OMITTED_CHARS = re.compile(r"\[\.\.\. (\d+) characters omitted")


def msg(kind: str, **content: Any) -> dict[str, Any]:
    return {"msg_type": kind, "content": content}


def collector(tmp_path: Path, *, limit: int = 20_000) -> OutputCollector:
    return OutputCollector(
        work_dir=tmp_path, cell=3, limit=limit, spill_path=tmp_path / ".kernelexec" / "o.txt"
    )


def assert_valid(outputs: list[NbOutput]) -> None:
    nb = new_notebook(cells=[new_code_cell("x", outputs=outputs, execution_count=1)])
    nbformat.validate(nbformat.from_dict(nb))


def body(output: str) -> str:
    """``output`` without its last line naming the spill file."""
    return output.split("\n[full output in ")[0]


def omitted_displays(text: str) -> int:
    return sum(int(n) for n in _OMITTED_DISPLAYS.findall(text))


# -- 13.1: display outputs are kept or counted ----------------------------------------------------
def test_displays_past_the_budget_are_counted_in_a_marker(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=2000)
    for i in range(10_000):
        c.feed(msg("display_data", data={"text/plain": f"d{i}"}, metadata={}))
    done = c.finish()
    kept = [o["data"]["text/plain"] for o in done.outputs if "kernelexec" not in o["metadata"]]
    markers = [o for o in done.outputs if "kernelexec" in o["metadata"]]
    assert len(markers) == 1
    omitted = markers[0]["metadata"]["kernelexec"]["omitted_outputs"]
    assert len(kept) + omitted == 10_000
    assert omitted > 0 and done.truncated
    assert kept[0] == "d0" and kept[-1] == "d9999"  # the first and the last are kept
    assert omitted_displays(done.output) == omitted
    assert len(done.output) < 2500
    assert_valid(done.outputs)


def test_files_are_written_only_for_kept_displays(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=3000)
    for i in range(2000):
        data = {"text/plain": "h", "text/html": f"<b>{i}</b>"}
        c.feed(msg("display_data", data=data, metadata={}))
    done = c.finish()
    kept = [o for o in done.outputs if "text/html" in o["data"]]
    written = sorted((tmp_path / "outputs").iterdir())
    assert len(written) == len(kept) == len(done.files) < 2000
    # Numbered by arrival: the last display keeps its own number, the gap shows the omission.
    assert (tmp_path / "outputs" / "cell3-2000.html").read_text() == "<b>1999</b>"
    assert (tmp_path / "outputs" / "cell3-1.html").read_text() == "<b>0</b>"
    assert len(kept) + omitted_displays(done.output) == 2000


def test_update_display_reaches_a_kept_display(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=2000)
    c.feed(
        msg("display_data", data={"text/plain": "0%"}, metadata={}, transient={"display_id": "p"})
    )
    for i in range(3000):
        c.feed(msg("display_data", data={"text/plain": f"d{i}"}, metadata={}))
    c.feed(
        msg(
            "update_display_data",
            data={"text/plain": "100%"},
            metadata={},
            transient={"display_id": "p"},
        )
    )
    done = c.finish()
    assert done.outputs[0]["data"]["text/plain"] == "100%"
    assert done.output.startswith("100%\nd0\n")


def test_under_the_budget_nothing_is_omitted(tmp_path: Path) -> None:
    c = collector(tmp_path)
    for i in range(50):
        c.feed(msg("display_data", data={"text/plain": f"d{i}"}, metadata={}))
    done = c.finish()
    assert len(done.outputs) == 50 and not done.truncated
    assert "omitted" not in done.output


# -- 13.5: streams are cut once, with the true count ----------------------------------------------
def test_a_long_stream_is_cut_once_with_the_true_count(tmp_path: Path) -> None:
    c = collector(tmp_path)
    c.feed(msg("stream", name="stdout", text="x" * 100_000 + "\n"))
    done = c.finish()
    counts = [int(n) for n in _OMITTED_CHARS.findall(done.output)]
    assert len(counts) == 1
    assert counts[0] + body(done.output).count("x") == 100_000
    stdout_counts = [int(n) for n in _OMITTED_CHARS.findall(done.stdout)]
    assert stdout_counts == counts


def test_mixed_outputs_over_the_budget_report_the_true_count(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=1000)
    c.feed(msg("stream", name="stdout", text="a" * 5000 + "\n"))
    c.feed(msg("stream", name="stderr", text="b" * 5000 + "\n"))
    c.feed(msg("display_data", data={"text/plain": "D"}, metadata={}))
    c.feed(msg("stream", name="stdout", text="c" * 5000 + "\n"))
    done = c.finish()
    counts = [int(n) for n in _OMITTED_CHARS.findall(done.output)]
    assert len(counts) == 1
    total = 3 * 5001 + len("D\n")  # the display starts a line of its own, as in a notebook
    assert counts[0] == total - 1000  # the head and the tail fill the budget; the rest counted
    assert done.output.startswith("a" * 100) and body(done.output).endswith("c" * 100 + "\n")


# -- 13.10: control characters are made visible in ``output`` -------------------------------------
def test_control_characters_are_visible_in_output_raw_in_stdout(tmp_path: Path) -> None:
    c = collector(tmp_path)
    c.feed(msg("stream", name="stdout", text="a\x00b\x07c\x1b\tz\ufffd\n"))
    done = c.finish()
    assert done.output == "a\\x00b\\x07c\\x1b\tz\ufffd\n"
    assert "\x00" in done.stdout  # stdout is the raw text


def test_visible_text_keeps_newlines_and_tabs() -> None:
    assert visible_text("x\n\ty\x7f\x0c") == "x\n\ty\\x7f\\x0c"
    assert visible_text("plain") == "plain"
    assert visible_text("a\r\nb\rc") == "a\nb\\x0dc"


# -- 13.10 / 14.12: tracebacks --------------------------------------------------------------------
def test_traceback_keeps_its_lines_and_loses_ansi(tmp_path: Path) -> None:
    tb = [
        "\x1b[0;31m---\x1b[0m",
        "Cell \x1b[0;32mIn[1], line 3\x1b[0m\n----> 3 f()\n",
        "Cell In[1], line 2, in f()\n----> 2     1/0\n",
        "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero",
    ]
    c = collector(tmp_path)
    c.feed(msg("error", ename="ZeroDivisionError", evalue="division by zero", traceback=tb))
    done = c.finish()
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in tb]
    assert done.output == "\n".join(plain)  # what Jupyter shows: blank lines between frames
    assert "\n\nCell In[1], line 2" in done.output
    assert done.error is not None and done.error.traceback == plain
    err = next(o for o in done.outputs if o["output_type"] == "error")
    assert err["traceback"] == tb  # the notebook keeps the colours


# -- 14.13: one image file per rich output ------------------------------------------------------
def test_one_image_file_per_output(tmp_path: Path) -> None:
    c = collector(tmp_path)
    data = {"text/plain": "<PIL.Image>", "image/png": PNG, "image/jpeg": JPEG}
    c.feed(msg("display_data", data=data, metadata={}))
    done = c.finish()
    assert [p.name for p in done.files] == ["cell3-1.png"]
    assert set(done.outputs[0]["data"]) == set(data)  # every form stays in the outputs
    assert done.output == "[image/png saved to outputs/cell3-1.png]"  # a bare repr is noise


def test_jpeg_alone_is_still_saved(tmp_path: Path) -> None:
    c = collector(tmp_path)
    c.feed(msg("display_data", data={"image/jpeg": JPEG, "text/html": "<i/>"}, metadata={}))
    assert [p.name for p in c.finish().files] == ["cell3-1.jpg", "cell3-1.html"]


def test_printing_between_displays_stays_a_bounded_list(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=2000)
    for i in range(5000):
        c.feed(msg("stream", name="stdout", text=f"{i}\n"))
        c.feed(msg("display_data", data={"text/plain": f"d{i}"}, metadata={}))
    done = c.finish()
    assert len(done.outputs) < 1000  # bounded by the budget, not by the loop (10,000)
    [gap] = [o for o in done.outputs if o.get("metadata", {}).get("kernelexec")]
    counts = gap["metadata"]["kernelexec"]
    kept_displays = [o for o in done.outputs if o["output_type"] == "display_data"]
    assert len(kept_displays) - 1 + counts["omitted_outputs"] == 5000
    kept_text = sum(len(o["text"]) for o in done.outputs if o["output_type"] == "stream")
    printed = sum(len(f"{i}\n") for i in range(5000))
    assert kept_text + counts["omitted_stream_characters"] == printed  # every character counted
    assert gap["data"]["text/plain"] in done.output
    assert_valid(done.outputs)


# -- 30.5: every output is bounded where it is collected -----------------------------------------
_COUNT = re.compile(r"\[\.\.\. (\d+) characters omitted")


def spill_text(tmp_path: Path) -> str:
    return (tmp_path / ".kernelexec" / "o.txt").read_bytes().decode()  # no newline translation


def test_a_huge_error_is_cut_with_the_true_count_and_spilled(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=2000)
    huge = "#" * 1_000_000
    tb = ["\x1b[0;31m---\x1b[0m", "Cell In[1], line 1\n----> 1 raise E\n", f"E: {huge}"]
    c.feed(msg("error", ename="E", evalue=huge, traceback=tb))
    done = c.finish()
    assert done.error is not None
    [count] = [int(n) for n in _COUNT.findall(done.error.evalue)]
    assert count + done.error.evalue.count("#") == 1_000_000
    assert sum(map(len, done.error.traceback)) < 2000 + 400
    assert done.error.traceback[0] == "---" and done.error.traceback[-1].startswith("E: ###")
    [err] = done.outputs
    assert len(err["evalue"]) < 2200 and err["traceback"][0].startswith("\x1b")  # colours kept
    [count] = [int(n) for n in _COUNT.findall(body(done.output))]
    assert count + body(done.output).count("#") == 1_000_000  # the output's count is true too
    assert len(done.output) < 2500 and done.truncated
    assert spill_text(tmp_path).count(huge) == 1  # the full text, once
    assert_valid(done.outputs)


def test_a_huge_repr_is_cut_with_the_true_count_and_spilled(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=2000)
    c.feed(msg("execute_result", data={"text/plain": "#" * 100_000}, metadata={}))
    done = c.finish()
    shown = done.outputs[0]["data"]["text/plain"]
    [count] = [int(n) for n in _COUNT.findall(shown)]
    assert count + shown.count("#") == 100_000 and len(shown) < 2200
    [count] = [int(n) for n in _COUNT.findall(body(done.output))]
    assert count + body(done.output).count("#") == 100_000
    assert spill_text(tmp_path).count("#" * 100_000) == 1
    assert_valid(done.outputs)


def test_payloads_over_the_inline_limit_live_only_in_their_file(tmp_path: Path) -> None:
    c = OutputCollector(work_dir=tmp_path, cell=3, limit=2000, spill_path=None, inline_limit=1000)
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(3000)).decode()
    data = {"text/plain": "<Figure>", "image/png": png, "text/html": "h" * 5000}
    c.feed(msg("display_data", data=data, metadata={}))
    c.feed(msg("display_data", data={"text/html": "<i>small</i>"}, metadata={}))
    done = c.finish()
    big, small = done.outputs
    assert set(big["data"]) == {"text/plain"}  # nothing of the payloads held
    assert big["metadata"]["kernelexec"]["omitted_data"] == {
        "image/png": len(png),
        "text/html": 5000,
    }
    assert (tmp_path / "outputs" / "cell3-1.png").read_bytes() == base64.b64decode(png)
    assert (tmp_path / "outputs" / "cell3-1.html").read_text() == "h" * 5000
    assert small["data"] == {"text/html": "<i>small</i>"}  # under the limit: inline, as before
    assert "[image/png saved to outputs/cell3-1.png]" in done.output
    assert "[text/html saved to outputs/cell3-1.html]" in done.output
    assert_valid(done.outputs)


def test_a_block_keeps_a_bounded_sum_of_payloads_inline(tmp_path: Path) -> None:
    c = OutputCollector(
        work_dir=tmp_path, cell=1, limit=20_000, spill_path=None, inline_block_limit=2500
    )
    for i in range(5):
        c.feed(msg("display_data", data={"text/html": f"{i}" * 1000}, metadata={}))
    done = c.finish()
    inline = [o for o in done.outputs if "text/html" in o["data"]]
    assert len(inline) == 2  # then the block's budget is spent: the rest only in files
    assert len(list((tmp_path / "outputs").iterdir())) == 5


def test_an_update_is_bounded_too(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=2000)
    first = msg(
        "display_data", data={"text/plain": "0"}, metadata={}, transient={"display_id": "d"}
    )
    c.feed(first)
    update = {"text/plain": "#" * 50_000}
    c.feed(msg("update_display_data", data=update, metadata={}, transient={"display_id": "d"}))
    shown = c.finish().outputs[0]["data"]["text/plain"]
    [count] = [int(n) for n in _COUNT.findall(shown)]
    assert count + shown.count("#") == 50_000


def test_huge_metadata_is_not_kept(tmp_path: Path) -> None:
    c = OutputCollector(work_dir=tmp_path, cell=1, limit=2000, spill_path=None, inline_limit=100)
    c.feed(msg("display_data", data={"text/plain": "x"}, metadata={"m": "y" * 1000}))
    [out] = c.finish().outputs
    assert out["metadata"] == {"kernelexec": {"omitted_metadata": 1000 + 2 + 1 + 2 + 2}}


# -- 31.10: stdout, the outputs and the spill file keep what was written -------------------------
def test_carriage_returns_are_kept_raw_and_resolved_only_in_output(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=100)
    c.feed(msg("stream", name="stdout", text="a\rb\n12%\r50%\r100%\n"))
    c.feed(msg("stream", name="stdout", text="".join(f"\r{i}%" for i in range(100)) + "\n"))
    done = c.finish()
    assert done.stdout.startswith("a\rb\n12%\r50%\r100%\n\r0%\r1%")  # as written
    assert done.outputs[0]["text"].startswith("a\rb\n12%\r50%\r100%\n\r0%")
    assert body(done.output) == "b\n100%\n99%\n"  # what a terminal shows
    assert spill_text(tmp_path).startswith("a\rb\n12%\r50%\r100%\n\r0%\r1%")
    assert spill_text(tmp_path).endswith("\r99%\n")


def test_the_live_view_names_a_payload_kept_only_in_its_file(tmp_path: Path) -> None:
    seen = io.StringIO()
    c = OutputCollector(
        work_dir=tmp_path,
        cell=1,
        limit=2000,
        spill_path=None,
        on_output=LiveView(seen),
        inline_limit=100,
    )
    c.feed(msg("display_data", data={"text/plain": "<HTML>", "text/html": "h" * 500}, metadata={}))
    assert seen.getvalue() == "[text/html]\n"  # not "<HTML>": the HTML is in its file
