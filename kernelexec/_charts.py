"""Charts and tables as data: the kernel side's set-up, and the host's one-line summaries.

Inside the kernel (``kernelexec/_resources/kernelexec_charts.py``) a matplotlib figure shown by a
block also comes back as a chart document and a DataFrame as a table document (the schema is in
docs/charts.md). Here, on the host, those documents become the line a model reads in ``output``
(``[chart: line "Revenue": x month (12 points), y revenue 1.2k-9.8k; saved to ...]``).

A document is the kernel's word, and the kernel is an attacker: it is read as untrusted JSON,
every field type-checked, every list and string bounded, and nothing in it is ever acted on
beyond being written down as text.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

CHART_MIME = "application/vnd.kernelexec.chart+json"
TABLE_MIME = "application/vnd.kernelexec.table+json"
DATA_MIMES = (CHART_MIME, TABLE_MIME)

_SOURCE = (Path(__file__).with_name("_resources") / "kernelexec_charts.py").read_text("utf-8")

# Run in the kernel by the set-up code. It wraps IPython's display formatter (classes are matched
# by name: nothing is imported for them) and adds an import hook that waits for matplotlib's axes
# module; the extractor's own code (the source above) is compiled only when a figure or a frame
# is first shown.
_STUB = """\
def _kx_charts(source):
    import sys
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is None:
        return
    displays = shell.display_formatter
    if getattr(displays.format, "_kx_charts", False):
        return
    loaded = {}

    def module():
        if not loaded:
            exec(compile(source, "<kernelexec charts>", "exec"), loaded)
        return loaded

    # (module, class name) of an object's class or a base -> (MIME type, extractor); pandas 3
    # names DataFrame's module "pandas".
    targets = {
        ("matplotlib.figure", "Figure"): ("%(chart)s", "matplotlib"),
        ("plotly.basedatatypes", "BaseFigure"): ("%(chart)s", "plotly"),
        ("altair.vegalite.v4.api", "TopLevelMixin"): ("%(chart)s", "altair"),
        ("altair.vegalite.v5.api", "TopLevelMixin"): ("%(chart)s", "altair"),
        ("altair.vegalite.v6.api", "TopLevelMixin"): ("%(chart)s", "altair"),
        ("pandas.core.frame", "DataFrame"): ("%(table)s", "pandas"),
        ("pandas", "DataFrame"): ("%(table)s", "pandas"),
    }
    seen = {}  # type -> its target or None: one dict lookup per display after the first

    def target(cls):
        if cls in seen:
            return seen[cls]
        found = None
        for base in getattr(cls, "__mro__", ())[:64]:
            key = (getattr(base, "__module__", None), getattr(base, "__name__", None))
            if key in targets:
                found = targets[key]
                break
        if len(seen) > 4096:  # classes made on the fly must not grow it for ever
            seen.clear()
        seen[cls] = found
        return found

    original = displays.format

    # Every display and every cell's value is formatted here: the documents are added to what
    # IPython's own formatters gave (after them, so a figure's PNG is drawn first). One wrapper
    # rather than two more formatters: any other object pays one dict lookup, nothing more.
    def format(obj, include=None, exclude=None):
        data, metadata = original(obj, include=include, exclude=exclude)
        hit = target(type(obj))
        if hit is None or (include and hit[0] not in include) or (exclude and hit[0] in exclude):
            return data, metadata
        try:
            doc = module()["format"](hit[1], obj)
        except Exception as exc:  # never fail the block
            doc = {"version": 1, "library": hit[1], "error": type(exc).__name__}
        if isinstance(data, dict) and doc is not None:
            data[hit[0]] = doc
        return data, metadata

    format._kx_charts = True
    format.__wrapped__ = original
    displays.format = format

    class AxesHook:
        # Waits for matplotlib's axes module, to wrap hist and bxp (see the source).
        def find_spec(self, name, path=None, target=None):
            if name != "matplotlib.axes._axes":
                return None
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                return module()["axes_spec"](name)
            except Exception:
                return None  # the usual finders load it, unwrapped

    axes = sys.modules.get("matplotlib.axes._axes")
    if axes is None:
        sys.meta_path.insert(0, AxesHook())
    else:
        try:
            module()["wrap_axes"](axes)
        except Exception:
            pass


try:
    _kx_charts(%(source)r)
except Exception:
    pass
del _kx_charts
""".replace("%(chart)s", CHART_MIME).replace("%(table)s", TABLE_MIME)
_STUB = _STUB.replace("%(source)r", repr(_SOURCE))  # last: the source's text is not searched


def kernel_setup_code() -> str:
    """The code that makes a kernel give chart and table documents (run once per kernel)."""
    return _STUB


# -- the host's reading of a document (attacker data) -------------------------------------------
_MAX_ITEMS = 8  # axes, series or columns named in one line
_MAX_WORD = 60  # characters of a title, label or name in the line
_MAX_LINE = 600
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")


_PLOTLY_MIME = "application/vnd.plotly.v1+json"
_VEGALITE_MIME = re.compile(r"^application/vnd\.vegalite\.v\d+\+json$")


def data_summaries(data: dict[str, Any]) -> tuple[str | None, str | None]:
    """(the chart's line, the table's line) of one output's data, None where it has none.
    A Plotly figure displays itself (``_ipython_display_``), past the kernel's formatters: its
    own JSON, and a Vega-Lite spec under its own MIME type, are read here the same way."""
    table = table_summary(data[TABLE_MIME]) if TABLE_MIME in data else None
    if CHART_MIME in data:
        return chart_summary(data[CHART_MIME]), table
    for mime, value in data.items():
        if mime == _PLOTLY_MIME:
            return chart_summary({"library": "plotly", "spec": value}), table
        if _VEGALITE_MIME.match(mime):
            return chart_summary({"library": "vega-lite", "spec": value}), table
    return None, table


def is_chart_form(mime: str) -> bool:
    """A MIME type whose saved file a chart's line names (its image, or its own spec)."""
    return mime.startswith("image/") or mime == _PLOTLY_MIME or bool(_VEGALITE_MIME.match(mime))


def chart_summary(doc: Any) -> str:
    """One line for a chart document: ``chart: line "Title": x month (12 points), y ...``."""
    doc = _dict(doc)
    error = _text(doc.get("error"))
    if error:
        return f"chart: not extracted ({error})"
    library = _text(doc.get("library"))
    if "spec" in doc or "spec_chars" in doc:
        return _cut(f"chart: {_spec_summary(library, doc)}")
    axes = [_axes_summary(_dict(a)) for a in _list(doc.get("axes"))[:_MAX_ITEMS]]
    count = _count(doc.get("axes_count"), len(axes))
    if not axes:
        return "chart: no axes"
    title = _quoted(doc.get("title"))
    head = "chart: " + (f"{title}: " if title else "")
    if count > 1:
        more = f"; {count - len(axes)} more" if count > len(axes) else ""
        return _cut(f"{head}{count} axes: " + " | ".join(axes) + more)
    return _cut(head + axes[0])


def table_summary(doc: Any) -> str:
    """One line for a table document: ``table: 100 rows x 3 columns: a int64 1-99, ...``."""
    doc = _dict(doc)
    error = _text(doc.get("error"))
    if error:
        return f"table: not extracted ({error})"
    shape = _list(doc.get("shape"))
    rows = _count(shape[0] if shape else None, 0)
    columns = _count(shape[1] if len(shape) > 1 else None, 0)
    parts = [_column_summary(_dict(c)) for c in _list(doc.get("columns"))[:_MAX_ITEMS]]
    more = f", {columns - len(parts)} more" if columns > len(parts) and parts else ""
    described = ": " + ", ".join(parts) + more if parts else ""
    return _cut(f"table: {rows} rows x {columns} columns{described}")


def _axes_summary(ax: dict[str, Any]) -> str:
    kind = _text(ax.get("type")) or "unknown"
    title = _quoted(ax.get("title"))
    listed = _list(ax.get("series"))
    series = [_dict(s) for s in listed[: _MAX_ITEMS * 4]]
    name = f"{kind} {title}" if title else kind
    if kind == "unknown" or not series:
        others = ", ".join(_text(o) for o in _list(ax.get("other_artists"))[:_MAX_ITEMS])
        found = f" (found {others})" if others else ""
        return f"{name}: chart type not recognised{found}, image only"
    first = series[0]
    if kind == "pie":
        labels = ", ".join(_text(x) for x in _list(first.get("x"))[:_MAX_ITEMS])
        return f"{name}: {_many(_count(first.get('count'), 0), 'slice')} ({labels})"
    if kind == "image":
        shape = "x".join(str(_count(n, 0)) for n in _list(first.get("shape"))[:3])
        values = _span(first.get("value_range"))
        return f"{name}: {shape} array" + (f", values {values}" if values else "")
    if kind == "box":
        boxes = _list(first.get("boxes"))
        count = _many(_count(first.get("count"), len(boxes)), "box", "boxes")
        return f"{name}: {count}, {_y_part(ax, series)}"
    x_label = _labelled("x", ax.get("x_label"))
    if kind == "bar" and not _span(first.get("x_range")):  # categories
        names = [_text(v) for v in _list(first.get("x"))[:_MAX_ITEMS]]
        more = ", ..." if _count(first.get("count"), 0) > len(names) else ""
        count = _many(_count(first.get("count"), 0), "category", "categories")
        categories = f"{count} ({', '.join(names)}{more})"
        return f"{name}: {x_label} {categories}, {_y_part(ax, series)}"
    if kind == "histogram":
        bins = _count(first.get("bins"), _count(first.get("count"), 0))
        total = _number(first.get("total"))
        values = f", {_fmt(total)} values" if total is not None else ""
        edges = _span(first.get("edges_range")) or _span(first.get("x_range"))
        where = f" {edges}" if edges else ""
        counts = _y_part(ax, series, default="count")
        return f"{name}: {x_label}{where} ({bins} bins{values}), {counts}"
    points = _count(first.get("count"), 0)
    lines = f", {len(listed)} series" if len(listed) > 1 else ""
    legend = [_text(v) for v in _list(ax.get("legend"))[:_MAX_ITEMS]]
    named = f": {', '.join(v for v in legend if v)}" if any(legend) else ""
    return f"{name}: {x_label} ({points} points{lines}{named}), {_y_part(ax, series)}"


def _y_part(ax: dict[str, Any], series: list[dict[str, Any]], default: str = "") -> str:
    label = _labelled("y", ax.get("y_label") or default)
    spans = [_list(s.get("y_range")) for s in series[: _MAX_ITEMS * 4]]
    lows = [n for s in spans if len(s) == 2 and (n := _number(s[0])) is not None]
    highs = [n for s in spans if len(s) == 2 and (n := _number(s[1])) is not None]
    if not lows or not highs:
        return label
    scale = _text(ax.get("y_scale"))
    log = " (log)" if scale == "log" else ""
    return f"{label} {_between(min(lows), max(highs))}{log}"


def _many(count: int, word: str, words: str = "") -> str:
    return f"{count} {word if count == 1 else (words or word + 's')}"


def _labelled(axis: str, label: Any) -> str:
    text = _text(label)
    return f"{axis} {text}" if text else axis


def _spec_summary(library: str, doc: dict[str, Any]) -> str:
    spec = _dict(doc.get("spec"))
    if not spec:
        chars = _count(doc.get("spec_chars"), 0)
        return f"{library or 'unknown library'} spec left out ({chars} characters)"
    if library == "plotly":
        traces = [_dict(t) for t in _list(spec.get("data"))]
        kinds = sorted({_text(t.get("type")) or "scatter" for t in traces[:100]})
        layout = _dict(spec.get("layout"))
        title = _quoted(_dict(layout.get("title")).get("text") or layout.get("title"))
        named = f" {title}" if title else ""
        listed = f" ({', '.join(kinds[:_MAX_ITEMS])})" if kinds else ""
        return f"plotly{named}: {_many(len(traces), 'trace')}{listed}"
    mark = spec.get("mark")
    mark_text = _text(_dict(mark).get("type") if isinstance(mark, dict) else mark) or "layered"
    encoding = _dict(spec.get("encoding"))
    fields = [
        f"{axis} {_text(_dict(encoding.get(axis)).get('field'))}"
        for axis in ("x", "y", "color")
        if _text(_dict(encoding.get(axis)).get("field"))
    ]
    title = _quoted(_dict(spec.get("title")).get("text") or spec.get("title"))
    named = f" {title}" if title else ""
    return f"vega-lite {mark_text}{named}" + (f": {', '.join(fields)}" if fields else "")


def _column_summary(column: dict[str, Any]) -> str:
    name = _text(column.get("name")) or "?"
    dtype = _text(column.get("dtype"))
    nulls = _count(column.get("nulls"), 0)
    words = [name, dtype] if dtype else [name]
    if nulls:
        words.append(f"({_many(nulls, 'null')})")
    low, high = column.get("min"), column.get("max")
    if low is not None and high is not None:
        low_n, high_n = _number(low), _number(high)
        if low_n is not None and high_n is not None:
            words.append(_between(low_n, high_n))
        else:
            words.append(f"{_scalar(low)} to {_scalar(high)}")
    top = [_list(t) for t in _list(column.get("top"))[:2]]
    named = [f"{_scalar(t[0])!s}" for t in top if t]
    if named:
        words.append("top " + "/".join(named))
    return " ".join(words)


# -- bounded, type-checked reading --------------------------------------------------------------
def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    """A string field as one short line (anything else: empty)."""
    if not isinstance(value, str):
        return ""
    line = _CONTROL.sub(" ", value[: _MAX_WORD * 4]).strip()
    return line if len(line) <= _MAX_WORD else line[: _MAX_WORD - 1] + "…"


def _quoted(value: Any) -> str:
    text = _text(value)
    return f'"{text}"' if text else ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _count(value: Any, default: int) -> int:
    number = _number(value)
    return int(number) if number is not None and 0 <= number < 1e18 else default


def _scalar(value: Any) -> str:
    number = _number(value)
    return _fmt(number) if number is not None else _text(value)


def _span(value: Any) -> str:
    pair = _list(value)
    if len(pair) != 2:
        return ""
    low, high = _number(pair[0]), _number(pair[1])
    return "" if low is None or high is None else _between(low, high)


def _between(low: float, high: float) -> str:
    """``1.2k-9.8k``; ``-3.9 to 3.1`` (a dash would read as a minus sign)."""
    return f"{_fmt(low)}-{_fmt(high)}" if low >= 0 else f"{_fmt(low)} to {_fmt(high)}"


def _fmt(number: float) -> str:
    """A number for a model to read: 1.2k, 3.4M, 0.25, 12."""
    size = abs(number)
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= limit * 0.9995:  # 999,999 is "1M": 3 digits of "k" would round to "1e+03k"
            return f"{number / limit:.3g}{suffix}"
    return f"{number:.3g}"


def _cut(line: str) -> str:
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 1] + "…"
