"""Kernel messages -> nbformat outputs, with canned iopub messages (no kernel)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from kernelexec._outputs import OutputCollector, TerminalText, file_form, strip_ansi
from kernelexec._types import NbOutput

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def msg(kind: str, **content: Any) -> dict[str, Any]:
    return {"msg_type": kind, "content": content}


def stream(text: str, name: str = "stdout") -> dict[str, Any]:
    return msg("stream", name=name, text=text)


def collector(tmp_path: Path, *, limit: int = 20_000, cell: int = 3, **kw: Any) -> OutputCollector:
    return OutputCollector(
        work_dir=tmp_path,
        cell=cell,
        limit=limit,
        spill_path=tmp_path / ".kernelexec" / "out.txt",
        **kw,
    )


def assert_valid(outputs: list[NbOutput]) -> None:
    nb = new_notebook(cells=[new_code_cell("x", outputs=outputs, execution_count=1)])
    nbformat.validate(nbformat.from_dict(nb))


def resolve(*chunks: str) -> str:
    seen: list[str] = []
    term = TerminalText(seen.append, max_line=1000)
    for chunk in chunks:
        term.write(chunk)
    term.flush()
    return "".join(seen)


# -- terminal resolution ----------------------------------------------------------------------
def test_carriage_return_overwrites_the_line() -> None:
    assert resolve("10%\r20%\r100%\n") == "100%\n"
    assert resolve("abcdef\rXY\n") == "XYcdef\n"


def test_carriage_return_across_chunks_and_crlf() -> None:
    # Overwrite, as a terminal (and Jupyter) does: a shorter frame leaves the old tail.
    assert resolve("step 1", "\rstep 2", "\rdone\r\n", "next\n") == "done 2\nnext\n"


def test_backspace_steps_back() -> None:
    assert resolve("abc\b\bXY\n") == "aXY\n"
    assert resolve("\b\bok") == "ok"


def test_tqdm_style_progress_collapses_to_final_line() -> None:
    frames = [f"\r{i:3d}%|{'#' * (i // 10):<10}| {i}/100" for i in range(0, 101, 5)]
    assert resolve(*frames, "\n") == "100%|##########| 100/100\n"


def test_a_line_without_newline_is_bounded() -> None:
    seen: list[str] = []
    term = TerminalText(seen.append, max_line=100)
    for _ in range(50):
        term.write("x" * 30)
    assert len(term.pending) <= 130
    term.flush()
    assert sum(map(len, seen)) == 1500


# -- the collector ----------------------------------------------------------------------------
def test_streams_merge_and_split_by_name(tmp_path: Path) -> None:
    c = collector(tmp_path)
    for m in (stream("a\n"), stream("b\n"), stream("e\n", "stderr"), stream("c\n")):
        c.feed(m)
    done = c.finish()
    assert [(o["name"], o["text"]) for o in done.outputs] == [
        ("stdout", "a\nb\n"),
        ("stderr", "e\n"),
        ("stdout", "c\n"),
    ]
    assert done.output == "a\nb\ne\nc\n"
    assert (done.stdout, done.stderr) == ("a\nb\nc\n", "e\n")
    assert_valid(done.outputs)


def test_execute_result_text_and_count(tmp_path: Path) -> None:
    c = collector(tmp_path)
    c.feed(msg("execute_input", code="1+1", execution_count=7))
    c.feed(msg("execute_result", data={"text/plain": "2"}, metadata={}, execution_count=7))
    done = c.finish()
    assert done.output == "2"
    assert done.execution_count == 7
    assert done.outputs[0]["output_type"] == "execute_result"
    assert_valid(done.outputs)


SAID_AS_CHARTS = {
    "application/vnd.plotly.v1+json": "chart: plotly: 0 traces",
    "application/vnd.vegalite.v5+json": "chart: vega-lite bar",
}


@pytest.mark.parametrize(
    ("mime", "payload", "suffix", "expected"),
    [
        ("image/png", PNG, "png", base64.b64decode(PNG)),
        ("image/jpeg", PNG, "jpg", base64.b64decode(PNG)),
        ("image/gif", PNG, "gif", base64.b64decode(PNG)),
        ("application/pdf", PNG, "pdf", base64.b64decode(PNG)),
        ("image/svg+xml", "<svg/>", "svg", b"<svg/>"),
        ("text/html", "<b>hi</b>", "html", b"<b>hi</b>"),
        ("text/markdown", "# T", "md", b"# T"),
        ("text/latex", "$x$", "tex", b"$x$"),
        ("application/json", {"a": 1}, "json", None),
        ("application/vnd.plotly.v1+json", {"data": []}, "plotly.json", None),
        ("application/vnd.vegalite.v5+json", {"mark": "bar"}, "vl.json", None),
        ("application/vnd.vega.v5+json", {"marks": []}, "vg.json", None),
    ],
)
def test_every_mime_with_a_file_form_is_saved(
    tmp_path: Path, mime: str, payload: Any, suffix: str, expected: bytes | None
) -> None:
    c = collector(tmp_path)
    c.feed(msg("display_data", data={"text/plain": "<obj>", mime: payload}, metadata={}))
    done = c.finish()
    path = tmp_path / "outputs" / f"cell3-1.{suffix}"
    assert done.files == [path]
    if expected is None:
        assert json.loads(path.read_text()) == payload
    else:
        assert path.read_bytes() == expected
    saved = f"[{mime} saved to outputs/cell3-1.{suffix}]"
    if mime in SAID_AS_CHARTS:  # a chart's own spec: what it shows, then its file
        saved = f"[{SAID_AS_CHARTS[mime]}; saved to outputs/cell3-1.{suffix}]"
    # A bare repr beside a saved image (matplotlib's "<Figure size ...>") is noise: dropped.
    assert done.output == (saved if mime.startswith("image/") else f"<obj>\n{saved}")
    assert "iVBOR" not in done.output and PNG not in done.output
    assert_valid(done.outputs)


def test_unknown_mime_is_not_saved(tmp_path: Path) -> None:
    assert file_form("application/x-custom") is None
    c = collector(tmp_path)
    c.feed(msg("display_data", data={"application/x-custom": "z"}, metadata={}))
    done = c.finish()
    assert done.files == []
    assert done.output == "[application/x-custom output]"


def test_numbering_counts_rich_outputs(tmp_path: Path) -> None:
    c = collector(tmp_path, cell=5)
    c.feed(msg("display_data", data={"text/plain": "t"}, metadata={}))
    c.feed(msg("display_data", data={"image/png": PNG, "text/html": "<i/>"}, metadata={}))
    c.feed(msg("display_data", data={"image/png": PNG}, metadata={}))
    names = [p.name for p in c.finish().files]
    assert names == ["cell5-1.png", "cell5-1.html", "cell5-2.png"]


def test_update_display_data_replaces_by_display_id(tmp_path: Path) -> None:
    c = collector(tmp_path)
    c.feed(
        msg("display_data", data={"text/plain": "0%"}, metadata={}, transient={"display_id": "p"})
    )
    c.feed(msg("display_data", data={"text/plain": "other"}, metadata={}))
    for pct in ("50%", "100%"):
        c.feed(
            msg(
                "update_display_data",
                data={"text/plain": pct},
                metadata={},
                transient={"display_id": "p"},
            )
        )
    done = c.finish()
    assert [o["data"]["text/plain"] for o in done.outputs] == ["100%", "other"]
    assert done.output == "100%\nother"
    assert_valid(done.outputs)


def test_clear_output_now_and_with_wait(tmp_path: Path) -> None:
    c = collector(tmp_path)
    c.feed(stream("old\n"))
    c.feed(msg("clear_output", wait=False))
    c.feed(stream("kept\n"))
    c.feed(msg("clear_output", wait=True))
    assert c.finish().output == "kept\n"  # wait=True: nothing came after, nothing cleared yet

    c = collector(tmp_path)
    c.feed(stream("frame 1\n"))
    c.feed(msg("clear_output", wait=True))
    c.feed(stream("frame 2\n"))
    done = c.finish()
    assert done.output == "frame 2\n"
    assert len(done.outputs) == 1


def test_error_keeps_raw_traceback_and_strips_ansi_in_text(tmp_path: Path) -> None:
    tb = [
        "\x1b[0;31mZeroDivisionError\x1b[0m     Traceback",
        "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero",
    ]
    c = collector(tmp_path)
    c.feed(stream("before\n"))
    c.feed(msg("error", ename="ZeroDivisionError", evalue="division by zero", traceback=tb))
    done = c.finish()
    assert done.error is not None
    assert done.error.traceback == [strip_ansi(line) for line in tb]  # JSON has no ANSI codes
    assert done.outputs[-1]["traceback"] == tb  # the notebook keeps the colours
    assert "\x1b" not in done.output
    assert done.output.endswith("ZeroDivisionError: division by zero")
    assert done.output.startswith("before\n")
    assert_valid(done.outputs)


def test_pop_error_removes_an_error(tmp_path: Path) -> None:
    c = collector(tmp_path)
    c.feed(msg("error", ename="KeyboardInterrupt", evalue="", traceback=["KeyboardInterrupt"]))
    popped = c.pop_error("KeyboardInterrupt")
    assert popped is not None and popped.traceback == ["KeyboardInterrupt"]
    done = c.finish()
    assert done.outputs == [] and done.error is None


def test_strip_ansi() -> None:
    assert strip_ansi("\x1b[1;32mgreen\x1b[0m \x1b]0;title\x07x") == "green x"


def test_emits_each_output_as_it_arrives(tmp_path: Path) -> None:
    seen: list[NbOutput] = []
    c = collector(tmp_path, on_output=seen.append)
    c.feed(stream("a"))
    c.feed(msg("display_data", data={"text/plain": "d"}, metadata={}))
    assert [o["output_type"] for o in seen] == ["stream", "display_data"]


def test_huge_output_is_bounded_and_spilled(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=1000)
    line = "y" * 99 + "\n"
    for _ in range(2000):  # 200,000 characters in chunks, as ipykernel batches them
        c.feed(stream(line))
    done = c.finish()
    assert done.truncated
    assert "characters omitted" in done.output
    assert len(done.output) < 1500
    assert all(len(o["text"]) < 1200 for o in done.outputs)
    assert done.full_output_file is not None
    assert done.full_output_file.stat().st_size == 2000 * 100
    assert len(done.stdout) < 1200


def test_ten_thousand_tiny_displays_stay_cheap(tmp_path: Path) -> None:
    c = collector(tmp_path, limit=2000)
    started = time.perf_counter()
    for i in range(10_000):
        c.feed(msg("display_data", data={"text/plain": str(i)}, metadata={}))
    done = c.finish()
    assert time.perf_counter() - started < 10  # generous: linear work, not quadratic
    markers = [o["metadata"] for o in done.outputs if o["metadata"]]
    [marker] = [m["kernelexec"]["omitted_outputs"] for m in markers]
    assert len(done.outputs) - 1 + marker == 10_000  # kept, or counted in the marker
    assert done.truncated and len(done.output) < 2500
    assert done.output.startswith("0\n1\n")
    assert f"[... {marker} display outputs omitted ...]" in done.output
    assert "9998\n9999\n[full output in" in done.output
