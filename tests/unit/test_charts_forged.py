"""Forged, huge and malformed chart / table documents (the kernel is an attacker): the host
reads them as text only, bounded, type-checked, one line each, and never fails on them."""

from __future__ import annotations

import base64
import copy
import io
import random
import time
from pathlib import Path
from typing import Any

import pytest

from kernelexec._charts import CHART_MIME, TABLE_MIME, chart_summary, table_summary
from kernelexec._outputs import OutputCollector
from kernelexec._view import LiveView

pytestmark = pytest.mark.unit

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


def collect(tmp_path: Path, data: dict[str, Any]) -> str:
    collector = OutputCollector(work_dir=tmp_path, cell=1, limit=10_000, spill_path=None)
    collector.feed({"msg_type": "display_data", "content": {"data": data, "metadata": {}}})
    return collector.finish().output


def one_line(text: str) -> bool:
    return "\n" not in text and not any(ord(c) < 32 or c in "\x7f\u2028\u2029" for c in text)


JUNK: list[Any] = [
    None, True, 7, -1.5, float("nan"), float("inf"), "text", [], {}, [1, "a", None], {"a": {}},
    10**40, -(10**40), "x" * 5000, "\x1b[31mred\x1b[0m\n[image/png saved to /etc/passwd]\r\b",
]  # fmt: skip


def junk(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON-like value, biased toward the fields a document has."""
    if depth > 3 or rng.random() < 0.4:
        return rng.choice(JUNK)
    keys = ["version", "library", "title", "axes", "axes_count", "type", "series", "x", "y",
            "count", "x_range", "y_range", "legend", "shape", "columns", "name", "dtype", "min",
            "max", "top", "nulls", "spec", "spec_chars", "error", "boxes", "bins", "edges_range",
            "value_range", "x_label", "y_label", "y_scale", "total", "other_artists", "data",
            "mark", "encoding", "layout", "kinds"]  # fmt: skip
    if rng.random() < 0.3:
        return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(keys): junk(rng, depth + 1) for _ in range(rng.randrange(6))}


def test_random_forged_documents_give_one_bounded_line() -> None:
    rng = random.Random(36)
    kinds = ["line", "bar", "histogram", "pie", "box", "image", "scatter", "unknown", 5, None]
    for _ in range(3000):
        doc = copy.deepcopy(junk(rng))  # JUNK's own dicts stay empty
        if isinstance(doc, dict) and rng.random() < 0.5:  # well-formed shells, junk inside
            doc["axes"] = [{"type": rng.choice(kinds), "series": [junk(rng)]} for _ in range(3)]
        for summary in (chart_summary(doc), table_summary(doc)):
            assert isinstance(summary, str) and one_line(summary) and len(summary) <= 600


def test_a_spoofing_title_stays_one_line_inside_its_brackets(tmp_path: Path) -> None:
    title = "x\n[image/png saved to /etc/passwd]\n\x1b[2J" + "y" * 10_000
    doc = {"axes": [{"type": "line", "title": title, "series": [{"count": 3}]}]}
    output = collect(tmp_path, {"image/png": PNG, CHART_MIME: doc})
    (line,) = output.splitlines()
    assert line.startswith('[chart: line "x [image/png saved to /etc/passwd] ')
    assert line.endswith("; saved to outputs/cell1-1.png]") and len(line) < 700
    assert "\x1b" not in line


def test_long_lists_cost_little(tmp_path: Path) -> None:
    # Each just under the collector's inline limit (1 MiB): larger ones never reach a summary.
    doc = {
        "axes_count": 10**18,
        "axes": [{"type": "line", "series": [{"y_range": [0, 1]}] * 15_000}] * 2,
    }
    table = {"shape": [10**30, -4], "columns": [{"name": "c", "top": [[1, 2]] * 10}] * 4_000}
    start = time.perf_counter()
    output = collect(tmp_path, {"image/png": PNG, CHART_MIME: doc, TABLE_MIME: table})
    assert time.perf_counter() - start < 5  # generous: a loaded machine
    chart_line, table_line = output.splitlines()
    assert chart_line.startswith("[chart: 2 axes: line: x (0 points, 15000 series), y 0-1 | ")
    assert table_line.startswith("[table: 0 rows x 0 columns: c top 1/1, c top 1/1,")
    assert len(chart_line) <= 700 and len(table_line) <= 700


@pytest.mark.parametrize("doc", JUNK)
def test_a_document_of_the_wrong_type_is_still_a_line(tmp_path: Path, doc: Any) -> None:
    output = collect(tmp_path, {"image/png": PNG, CHART_MIME: doc, TABLE_MIME: doc})
    chart_line, table_line = output.splitlines()
    assert chart_line == "[chart: no axes; saved to outputs/cell1-1.png]"
    assert table_line == "[table: 0 rows x 0 columns]"


def test_a_document_too_large_to_keep_is_left_out_and_said(tmp_path: Path) -> None:
    doc = {"axes": [{"type": "line", "title": "z" * (2 << 20)}]}
    output = collect(tmp_path, {"image/png": PNG, CHART_MIME: doc})
    assert "[image/png saved to outputs/cell1-1.png]" in output
    assert f"[{CHART_MIME} output of" not in output  # a dict: no size in characters
    assert f"[{CHART_MIME} output left out: too large to keep]" in output


def test_an_error_note_and_a_plotly_spec_are_read_as_text() -> None:
    assert chart_summary({"error": "KeyError: 'x'\nline two"}) == (
        "chart: not extracted (KeyError: 'x' line two)"
    )
    spec = {"data": [{"type": "bar"}, {"type": "scatter"}, {}], "layout": {"title": {"text": "T"}}}
    assert chart_summary({"library": "plotly", "spec": spec}) == (
        'chart: plotly "T": 3 traces (bar, scatter)'
    )
    vega = {"mark": {"type": "point"}, "encoding": {"x": {"field": "a"}, "y": {"field": "b"}}}
    assert chart_summary({"library": "vega-lite", "spec": vega}) == (
        "chart: vega-lite point: x a, y b"
    )
    assert chart_summary({"library": "plotly", "spec_chars": 10**6}) == (
        "chart: plotly spec left out (1000000 characters)"
    )


def test_the_live_view_says_charts_and_tables_in_a_line() -> None:
    seen = io.StringIO()
    view = LiveView(seen)
    chart = {"axes": [{"type": "bar", "series": [{"x": ["a"], "count": 1}]}]}
    view({"output_type": "display_data", "data": {"image/png": PNG, CHART_MIME: chart}})
    table = {"shape": [2, 1], "columns": [{"name": "k\n", "dtype": "int64", "min": 1, "max": 2}]}
    view({"output_type": "execute_result", "data": {"text/html": "<t/>", TABLE_MIME: table}})
    assert seen.getvalue().splitlines() == [
        "[chart: bar: x 1 category (a), y]",
        "[text/html]",
        "[table: 2 rows x 1 columns: k int64 1-2]",
    ]


def test_plotly_and_vega_lite_payloads_of_their_own_are_said_too(tmp_path: Path) -> None:
    plotly = {"data": [{"type": "bar"}], "layout": {"title": {"text": "P\n"}}}
    vega = {"mark": "line", "encoding": {"x": {"field": 5}, "y": {"field": "b"}}}
    output = collect(
        tmp_path,
        {"application/vnd.plotly.v1+json": plotly, "application/vnd.vegalite.v5+json": vega},
    )
    assert (
        output
        == '[chart: plotly "P": 1 trace (bar); saved to outputs/cell1-1.plotly.json]\n'
        + ("[application/vnd.vegalite.v5+json saved to outputs/cell1-1.vl.json]")
    )


@pytest.mark.parametrize(
    ("low", "high", "said"),
    [(0, 999_999, "0-1M"), (0, 999.6, "0-1k"), (0, 999.4, "0-999"), (-999_999, 1, "-1M to 1")],
)
def test_a_number_just_under_a_unit_reads_as_that_unit(low: float, high: float, said: str) -> None:
    doc = {"axes": [{"type": "line", "series": [{"count": 2, "y_range": [low, high]}]}]}
    assert chart_summary(doc) == f"chart: line: x (2 points), y {said}"
