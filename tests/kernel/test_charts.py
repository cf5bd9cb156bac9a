"""Charts and tables as data, through a real local kernel: each document against the figure's
(or frame's) own data, computed in the same kernel; bounded; never failing a block."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kx_sandbox import sandbox_unavailable

from kernelexec import KernelExecutor, make_executor
from kernelexec._charts import CHART_MIME, TABLE_MIME

pytestmark = pytest.mark.kernel

SETUP = "import json, numpy as np, pandas as pd, matplotlib.pyplot as plt\n"


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    with KernelExecutor(work_dir=tmp_path_factory.mktemp("charts"), timeout=60) as executor:
        assert executor.execute(SETUP).ok
        yield executor


@pytest.fixture(scope="module")
def off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    """A kernel with charts switched off."""
    work = tmp_path_factory.mktemp("charts-off")
    with make_executor("kernel", work_dir=work, timeout=60, charts=False) as executor:
        assert isinstance(executor, KernelExecutor) and executor.execute(SETUP).ok
        yield executor


def documents(result: Any, mime: str) -> list[dict[str, Any]]:
    return [o["data"][mime] for o in result.outputs if mime in o.get("data", {})]


def truth(result: Any) -> Any:
    """What the block printed last as JSON: the figure's own data, as the kernel knows it."""
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_chart_type_against_the_figures_data(ex: KernelExecutor) -> None:
    r = ex.execute(
        """
rng = np.random.default_rng(1)
fig, axs = plt.subplots(2, 4, figsize=(12, 6))
months = list(range(1, 13)); revenue = [1200.0 + 730 * i for i in range(12)]
axs[0, 0].plot(months, revenue, label="revenue"); axs[0, 0].legend()
axs[0, 0].set(title="Revenue by month", xlabel="month", ylabel="revenue", yscale="log")
axs[0, 1].bar(["north", "south", "east"], [3, 5, 2])
sx, sy = rng.normal(size=50), rng.normal(size=50)
axs[0, 2].scatter(sx, sy)
data = rng.normal(size=1000)
counts, edges, _ = axs[0, 3].hist(data, bins=20)
axs[1, 0].pie([1, 2, 5], labels=["a", "b", "c"])
groups = [rng.normal(size=40), rng.normal(3, 1, size=60)]
axs[1, 1].boxplot(groups)
image = np.arange(12).reshape(3, 4)
axs[1, 2].imshow(image)
axs[1, 3].plot([0, 1], [0, 1], "o")  # markers only: a scatter drawn with plot
plt.show()
print(json.dumps({
    "revenue": revenue, "sx": sx.tolist(), "sy": sy.tolist(), "counts": counts.tolist(),
    "edges": edges.tolist(),
    "boxes": [np.percentile(g, [25, 50, 75]).tolist() for g in groups],
}))
"""
    )
    assert r.ok, r.output
    (doc,) = documents(r, CHART_MIME)
    want = truth(r)
    assert doc["library"] == "matplotlib" and doc["axes_count"] == 8
    line, bar, scatter, hist, pie, box, image, dots = doc["axes"]
    assert [a["type"] for a in doc["axes"]] == [
        "line", "bar", "scatter", "histogram", "pie", "box", "image", "scatter"
    ]  # fmt: skip
    assert line["title"] == "Revenue by month" and line["x_label"] == "month"
    assert line["y_scale"] == "log" and line["legend"] == ["revenue"]
    (s,) = line["series"]
    assert s["x"] == list(range(1, 13)) and s["y"] == want["revenue"] and s["count"] == 12
    assert bar["series"][0]["x"] == ["north", "south", "east"] and bar["series"][0]["y"] == [
        3,
        5,
        2,
    ]
    assert scatter["series"][0]["x"] == pytest.approx(want["sx"])
    assert scatter["series"][0]["y"] == pytest.approx(want["sy"])
    (h,) = hist["series"]
    assert h["y"] == want["counts"] and h["bins"] == 20 and h["total"] == 1000
    assert h["edges_range"] == [want["edges"][0], want["edges"][-1]]
    assert pie["series"][0]["x"] == ["a", "b", "c"]
    assert pie["series"][0]["y"] == pytest.approx([1 / 8, 2 / 8, 5 / 8])
    boxes = box["series"][0]["boxes"]
    got = [v for b in boxes for v in (b["q1"], b["med"], b["q3"])]
    assert got == pytest.approx([v for quartiles in want["boxes"] for v in quartiles])
    assert image["series"][0]["shape"] == [3, 4] and image["series"][0]["value_range"] == [0, 11]
    assert dots["series"][0]["x"] == [0, 1]
    # the line a model reads, in place of "[image/png saved to ...]"
    assert "[image/png saved" not in r.output
    line_text = next(t for t in r.output.splitlines() if t.startswith("[chart: "))
    assert 'line "Revenue by month": x month (12 points: revenue), y revenue 1.2k-9.23k (log)' in (
        line_text
    )
    assert "bar: x 3 categories (north, south, east), y 2-5" in line_text
    assert "histogram: x" in line_text and "(20 bins, 1k values)" in line_text
    assert "pie: 3 slices (a, b, c)" in line_text and "box: 2 boxes" in line_text
    assert "image: 3x4 array, values 0-11" in line_text
    assert line_text.endswith("; saved to outputs/cell2-1.png]")


def test_pandas_plotting_is_matplotlib_underneath(ex: KernelExecutor) -> None:
    r = ex.execute(
        """
df = pd.DataFrame({"sales": [3.0, 1.0, 4.0, 1.0, 5.0], "cost": [1.0, 1.0, 2.0, 3.0, 2.0]},
                  index=["a", "b", "c", "d", "e"])
fig, axs = plt.subplots(1, 3)
df.plot(ax=axs[0], title="both")
df["sales"].plot.bar(ax=axs[1])
df["sales"].plot.hist(ax=axs[2], bins=4)
plt.show()
"""
    )
    assert r.ok, r.output
    (doc,) = documents(r, CHART_MIME)
    line, bar, hist = doc["axes"]
    assert line["type"] == "line" and line["title"] == "both"
    assert [s["label"] for s in line["series"]] == ["sales", "cost"]
    assert line["series"][0]["y"] == [3.0, 1.0, 4.0, 1.0, 5.0]
    assert bar["type"] == "bar" and bar["series"][0]["x"] == ["a", "b", "c", "d", "e"]
    assert bar["series"][0]["y"] == [3.0, 1.0, 4.0, 1.0, 5.0]
    assert hist["type"] == "histogram" and hist["series"][0]["total"] == 5


def test_a_dataframe_is_a_table_document(ex: KernelExecutor) -> None:
    r = ex.execute(
        """
t = pd.DataFrame({"n": range(100), "x": [None, None] + [0.5 * i for i in range(98)],
                  "word": ["spam", "egg", "spam", "ham"] * 25})
t
"""
    )
    assert r.ok, r.output
    (doc,) = documents(r, TABLE_MIME)
    assert doc["shape"] == [100, 3]
    n, x, word = doc["columns"]
    assert (n["name"], n["dtype"], n["nulls"], n["min"], n["max"]) == ("n", "int64", 0, 0, 99)
    assert (x["nulls"], x["min"], x["max"]) == (2, 0.0, 48.5)
    assert word["top"][0] == ["spam", 50] and word["unique"] == 3
    assert doc["head"][0] == [0, None, "spam"] and doc["tail"][-1] == [99, 48.5, "ham"]
    assert len(doc["head"]) == len(doc["tail"]) == 5
    assert "[table: 100 rows x 3 columns: n int64 0-99, x float64 (2 nulls) 0-48.5" in r.output


def test_a_million_points_are_bounded_and_counted(ex: KernelExecutor) -> None:
    code = "plt.plot(np.arange(1_000_000), np.sin(np.arange(1_000_000) / 1e5)); plt.show()"
    r = ex.execute(code)
    assert r.ok, r.output
    (doc,) = documents(r, CHART_MIME)
    (s,) = doc["axes"][0]["series"]
    assert s["count"] == 1_000_000 and s["sampled"] and len(s["x"]) == len(s["y"]) == 200
    assert s["x"][0] == 0 and s["x"][-1] == 999_999 and s["y_range"] == pytest.approx([-1, 1])
    assert len(json.dumps(doc)) < 20_000
    assert "(1000000 points)" in r.output


def test_many_long_series_are_thinned_to_fit(ex: KernelExecutor) -> None:
    r = ex.execute(
        "fig, axs = plt.subplots(3, 4)\n"
        "for ax in axs.flat:\n"
        "    for k in range(20): ax.plot(np.arange(5000), np.arange(5000) * k)\n"
        "plt.show()"
    )
    assert r.ok, r.output
    (doc,) = documents(r, CHART_MIME)
    series = [s for ax in doc["axes"] for s in ax["series"]]
    assert len(series) == 240 and all(s["count"] == 5000 and s["sampled"] for s in series)
    assert all(len(s["x"]) == len(s["y"]) == 41 for s in series)
    assert series[-1]["x"][0] == 0 and series[-1]["x"][-1] == 4999
    assert series[-1]["y_range"] == [0, 4999 * 19]
    assert len(json.dumps(doc)) < 400_000


def test_an_unknown_chart_type_gives_the_image_and_says_so(ex: KernelExecutor) -> None:
    r = ex.execute("plt.fill_between([0, 1, 2], [0, 1, 0]); plt.show()")
    assert r.ok, r.output
    (doc,) = documents(r, CHART_MIME)
    assert doc["axes"][0]["type"] == "unknown"
    assert doc["axes"][0]["other_artists"] == ["FillBetweenPolyCollection"] or doc["axes"][0][
        "other_artists"
    ] == ["PolyCollection"]
    assert "chart type not recognised" in r.output and "image only; saved to" in r.output
    assert any(p.suffix == ".png" for p in r.files)


def test_an_extractor_error_is_a_note_not_a_failure(ex: KernelExecutor) -> None:
    r = ex.execute(
        "fig, ax = plt.subplots(); ax.plot([1, 2])\nax.get_legend = lambda: 1 / 0\nplt.show()"
    )
    assert r.ok and r.error is None, r.output
    (doc,) = documents(r, CHART_MIME)
    assert doc["error"].startswith("ZeroDivisionError")
    assert "[chart: not extracted (ZeroDivisionError: division by zero); saved to" in r.output


def test_charts_switched_off(off: KernelExecutor) -> None:
    r = off.execute("plt.plot([1, 2]); plt.show()")
    t = off.execute("pd.DataFrame({'a': [1]})")
    assert r.ok and t.ok
    assert not documents(r, CHART_MIME) and not documents(t, TABLE_MIME)
    assert "[image/png saved to outputs/cell2-1.png]" in r.output


@pytest.mark.parametrize("kind", ["fork-kernel", "sandboxed-kernel"])
def test_other_kernel_back_ends_give_charts_too(kind: str, tmp_path: Any) -> None:
    if kind == "sandboxed-kernel" and (reason := sandbox_unavailable()) is not None:
        pytest.skip(reason)
    with make_executor(kind, work_dir=tmp_path, timeout=60) as other:
        r = other.execute(
            "import matplotlib.pyplot as plt; plt.bar(['a', 'b'], [1, 2]); plt.show()"
        )
    assert r.ok, r.output
    (doc,) = documents(r, CHART_MIME)
    assert doc["axes"][0]["series"][0]["x"] == ["a", "b"]
    assert "[chart: bar: x 2 categories (a, b), y 1-2; saved to" in r.output


def test_round_trip_cost_with_and_without_extraction(
    ex: KernelExecutor, off: KernelExecutor
) -> None:
    """Measured, not a benchmark: extraction must not make a plot's round trip much slower."""
    code = "plt.plot(np.arange(1000), np.arange(1000) ** 0.5); plt.show()"

    def best(executor: KernelExecutor) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            assert executor.execute(code).ok
            times.append(time.perf_counter() - start)
        return min(times)

    without, with_ = best(off), best(ex)
    print(f"plot round trip: {with_ * 1000:.1f} ms with charts, {without * 1000:.1f} ms without")
    assert with_ < without * 2 + 0.2  # generous: a loaded machine


def test_a_forged_document_from_the_kernel_is_only_text(ex: KernelExecutor) -> None:
    """The block itself sends chart and table documents: malformed, spoofing, absurd numbers."""
    r = ex.execute(
        "from IPython.display import display\n"
        f"display({{'{CHART_MIME}': {{'axes': [{{'type': 'line', 'title': 'a\\n[x]\\x1b[2J',"
        " 'series': [{'count': 1e300, 'y_range': [-1e308, 'b']}]}] * 3,"
        " 'axes_count': -5},"
        f" '{TABLE_MIME}': {{'shape': 'huge', 'columns': [None, 7, {{'name': ['x']}}]}},"
        " 'text/plain': 'forged'}, raw=True)"
    )
    assert r.ok, r.output
    assert r.output.splitlines() == [
        "forged",
        '[chart: 3 axes: line "a [x] [2J": x (0 points), y | line "a [x] [2J": x (0 points), y'
        ' | line "a [x] [2J": x (0 points), y]',
        "[table: 0 rows x 0 columns: ?, ?, ?]",
    ]


def test_seaborn_plotly_and_altair_where_the_kernel_has_them(ex: KernelExecutor) -> None:
    """In the dev extra; a kernel without them skips (kernelexec itself needs none of them)."""
    if not ex.execute("import seaborn as sns, plotly.graph_objects as go, altair as alt").ok:
        pytest.skip("seaborn, plotly or altair is not installed in the kernel")
    r = ex.execute(
        "tips = pd.DataFrame({'day': ['a', 'b', 'a', 'c'], 'bill': [10.0, 20.0, 30.0, 5.0]})\n"
        "fig, (a, b) = plt.subplots(1, 2)\n"
        "sns.histplot(tips['bill'], bins=3, ax=a); sns.barplot(tips, x='day', y='bill', ax=b)\n"
        "plt.show()"
    )
    assert r.ok, r.output
    (doc,) = documents(r, CHART_MIME)
    hist, bar = doc["axes"]
    assert hist["type"] == "histogram" and sum(hist["series"][0]["y"]) == 4
    assert bar["series"][0]["x"] == ["a", "b", "c"] and bar["series"][0]["y"] == [20, 20, 5]
    r = ex.execute("go.Figure([go.Bar(x=['a', 'b'], y=[1, 2])], layout={'title': {'text': 'P'}})")
    assert r.ok and '[chart: plotly "P": 1 trace (bar); saved to outputs/' in r.output, r.output
    r = ex.execute("alt.Chart(tips).mark_bar().encode(x='day', y='bill').properties(title='V')")
    (spec,) = documents(r, CHART_MIME)
    assert spec["library"] == "vega-lite" and spec["spec"]["mark"]["type"] == "bar"
    assert '[chart: vega-lite bar "V": x day, y bill]' in r.output, r.output
