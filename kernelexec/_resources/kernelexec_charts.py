# mypy: ignore-errors
# (duck-typed over whatever matplotlib / pandas / plotly the kernel has: no stubs to check it by)
"""Charts and tables as data, inside the kernel: what a figure or a DataFrame shows, as JSON.

kernelexec's set-up code gives this file's text to each kernel (which may not have kernelexec
installed); a stub there (kernelexec/_charts.py) wraps IPython's display formatter and runs this
file only when it is first needed (compiling it costs ~15 ms: not at each start). A matplotlib
figure shown by a block also carries ``application/vnd.kernelexec.chart+json`` (per axes: the
chart type, title, labels, scales, limits, legend and each series' data up to a bound, with the
true count) and a DataFrame ``application/vnd.kernelexec.table+json`` (shape, dtypes, head and
tail, a summary per column). Altair charts (and Plotly figures formatted by IPython: a Plotly
figure usually displays itself, with its own JSON) give their own specs in the chart document.
Nothing here may fail a block: any error becomes a document that says so. Nothing is imported
until a figure or a frame is shown (classes are matched by name), and matplotlib's ``hist`` and
``bxp`` are wrapped when matplotlib is imported (an import hook), to keep what a histogram's
bins or a box's quartiles were: they cannot be read back from bars and lines reliably.

The host reads these documents as untrusted data (kernelexec/_charts.py): the bounds here keep
honest documents small, they guard nothing.
"""

import contextlib
import itertools
import math

CHART_MIME = "application/vnd.kernelexec.chart+json"
TABLE_MIME = "application/vnd.kernelexec.table+json"
VERSION = 1
MAX_POINTS = 200  # values kept per series (evenly spread over it); the true count is given
MAX_SERIES = 20  # per axes
MAX_AXES = 12
MAX_FIGURE_VALUES = 20_000  # x and y values kept over all a figure's series (at least 10 each)
MAX_TEXT = 200  # characters of a title, label, category or cell
MAX_SPEC = 256 * 1024  # characters of a Plotly / Vega-Lite spec kept
MAX_COLUMNS = 50  # columns a table document describes
PREVIEW_ROWS = 5  # head and tail rows each
TOP_VALUES = 5
TOP_VALUES_ROWS = 1_000_000  # past this, top values are counted on the first rows only


# -- entry points (called by the set-up code's stub, kernelexec/_charts.py) ---------------------
def format(name, obj):
    """The document of ``obj`` by the extractor ``name``; never raises: an error becomes a
    document saying what failed (an extractor's bug must not fail the user's block)."""
    extract, library = _EXTRACTORS[name]
    try:
        return extract(obj)
    except Exception as exc:
        note = f"{type(exc).__name__}: {exc}"[:MAX_TEXT]
        return {"version": VERSION, "library": library, "error": note}


def axes_spec(name):
    """The import spec of ``matplotlib.axes._axes``, its loader wrapping ``hist`` and ``bxp``
    once the module has run (the stub's import hook calls this, then steps aside)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is not None and spec.loader is not None:
        spec.loader = _PatchingLoader(spec.loader)
    return spec


class _PatchingLoader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        # if it fails, charts lose histogram and box details; plotting works as ever
        with contextlib.suppress(Exception):
            wrap_axes(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def wrap_axes(module):
    """Wrap ``Axes.hist`` and ``Axes.bxp`` to keep on the axes what they were given."""
    axes = getattr(module, "Axes", None)
    if axes is None or getattr(axes.hist, "_kx_wrapped", False):
        return
    hist, bxp = axes.hist, axes.bxp

    def hist_(self, x, *args, **kwargs):
        result = hist(self, x, *args, **kwargs)
        with contextlib.suppress(Exception):
            _record(
                self,
                "_kx_hists",
                {
                    "counts": result[0],
                    "edges": result[1],
                    "label": kwargs.get("label"),
                    "artists": _artist_ids(result[2]),
                },
            )
        return result

    def bxp_(self, bxpstats, *args, **kwargs):
        result = bxp(self, bxpstats, *args, **kwargs)
        try:
            vertical = kwargs.get("orientation", "vertical") == "vertical"
            if kwargs.get("vert") is False:
                vertical = False
            _record(
                self,
                "_kx_boxes",
                {
                    "stats": list(bxpstats),
                    "vertical": vertical,
                    "artists": _artist_ids(list(result.values())),
                },
            )
        except Exception:
            pass
        return result

    for new, old in ((hist_, hist), (bxp_, bxp)):
        new.__doc__, new.__name__, new.__qualname__ = old.__doc__, old.__name__, old.__qualname__
        new.__wrapped__ = old
        new._kx_wrapped = True
    axes.hist, axes.bxp = hist_, bxp_


def _record(ax, name, entry):
    entries = ax.__dict__.setdefault(name, [])
    entries.append(entry)


def _artist_ids(value):
    """The ids of every artist in a nest of lists, tuples and containers."""
    ids, stack = set(), [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "patches") and not hasattr(item, "axes"):
            stack.extend(item.patches)  # a BarContainer
        else:
            ids.add(id(item))
    return ids


# -- values as JSON ---------------------------------------------------------------------------
def _text(value):
    text = "" if value is None else str(value)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _value(value):
    """A JSON-safe scalar: finite numbers as they are, NaN/inf as None, others as text."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**53 else float(value)
    try:
        import numpy as np

        if isinstance(value, np.generic):
            value = value.item()
            if isinstance(value, (bool, int)):
                return _value(value)
    except ImportError:
        pass
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "isoformat"):
        return _text(value.isoformat())
    return _text(value)


def _sample(values):
    """(up to MAX_POINTS values evenly spread over ``values``, its true count): picked by index,
    so a million-point array is never copied whole into Python objects."""
    import numpy as np

    values = np.asarray(values)
    if values.ndim != 1:
        values = values.ravel()
    count = len(values)
    if count <= MAX_POINTS:
        return [_value(v) for v in values.tolist()], count
    picked = np.linspace(0, count - 1, MAX_POINTS).astype(int)
    return [_value(v) for v in values[picked].tolist()], count


def _range(values):
    """[min, max] of the finite numbers in ``values`` (None when there are none)."""
    import numpy as np

    try:
        array = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        return None
    array = array[np.isfinite(array)]
    if not array.size:
        return None
    return [float(array.min()), float(array.max())]


def _series(kind, label, x, y, **extra):
    xs, count = _sample(x)
    ys, _ = _sample(y)
    out = {"kind": kind, "label": _text(label), "count": count, "x": xs, "y": ys}
    out["x_range"], out["y_range"] = _range(x), _range(y)
    if count > MAX_POINTS:
        out["sampled"] = True
    out.update(extra)
    return out


def _label(artist):
    label = artist.get_label() or ""
    return "" if label.startswith("_") else label  # "_child0", "_nolegend_": matplotlib's own


# -- matplotlib -------------------------------------------------------------------------------
def matplotlib_chart(figure):
    suptitle = getattr(figure, "_suptitle", None)
    axes = [ax for ax in figure.axes if not hasattr(ax, "_colorbar")]
    doc = {
        "version": VERSION,
        "library": "matplotlib",
        "title": _text(suptitle.get_text()) if suptitle is not None else "",
        "axes_count": len(axes),
        "axes": [_axes_doc(ax) for ax in axes[:MAX_AXES]],
    }
    _fit(doc)
    return doc


def _fit(doc):
    """Thin every series so the whole figure keeps about MAX_FIGURE_VALUES values: twelve axes
    of twenty long lines would otherwise pass the host's 1 MiB inline limit and be left out."""
    series = [s for ax in doc["axes"] for s in ax["series"]]
    per = min(MAX_POINTS, max(10, MAX_FIGURE_VALUES // max(1, 2 * len(series))))
    for one in series:
        for key in ("x", "y"):
            values = one.get(key)
            if values is not None and len(values) > per:
                last = len(values) - 1
                one[key] = [values[round(i * last / (per - 1))] for i in range(per)]
                one["sampled"] = True


def _axes_doc(ax):
    series, seen, other = [], set(), []
    for hist in ax.__dict__.get("_kx_hists", []):
        seen |= hist["artists"]
        series.extend(_hist_series(hist))
    for box in ax.__dict__.get("_kx_boxes", []):
        seen |= box["artists"]
        series.append(_box_series(box))
    for container in ax.containers:
        if type(container).__name__ == "BarContainer" and not any(
            id(p) in seen for p in container.patches
        ):
            seen |= {id(p) for p in container.patches}
            series.append(_bar_series(ax, container))
    for line in ax.lines:
        if id(line) not in seen:
            series.append(_line_series(line))
    for collection in ax.collections:
        if id(collection) in seen:
            continue
        if type(collection).__name__ == "PathCollection":
            series.append(_scatter_series(collection))
        else:
            other.append(type(collection).__name__)
    wedges = [p for p in ax.patches if type(p).__name__ == "Wedge" and id(p) not in seen]
    if wedges:
        series.append(_pie_series(wedges))
    for image in ax.images:
        series.append(_image_series(image))
    kinds = list(dict.fromkeys(s["kind"] for s in series))
    doc = {
        "type": kinds[0] if len(kinds) == 1 else ("mixed" if kinds else "unknown"),
        "title": _text(ax.get_title() or ax.get_title("left") or ax.get_title("right")),
        "x_label": _text(ax.get_xlabel()),
        "y_label": _text(ax.get_ylabel()),
        "x_scale": _text(ax.get_xscale()),
        "y_scale": _text(ax.get_yscale()),
        "x_limits": [_value(v) for v in ax.get_xlim()],
        "y_limits": [_value(v) for v in ax.get_ylim()],
        "legend": _legend(ax),
        "series_count": len(series),
        "series": series[:MAX_SERIES],
    }
    if len(kinds) > 1:
        doc["kinds"] = kinds
    if other:
        doc["other_artists"] = sorted(set(other))[:MAX_SERIES]
    return doc


def _legend(ax):
    legend = ax.get_legend()
    if legend is None:
        return []
    return [_text(t.get_text()) for t in legend.get_texts()[:MAX_SERIES]]


def _line_series(line):
    style = line.get_linestyle()
    kind = (
        "scatter"
        if style in ("None", "", " ") and line.get_marker() not in (None, "None", "")
        else "line"
    )
    return _series(kind, _label(line), line.get_xdata(), line.get_ydata())


def _scatter_series(collection):
    offsets = collection.get_offsets()
    return _series("scatter", _label(collection), offsets[:, 0], offsets[:, 1])


def _bar_series(ax, container):
    patches = container.patches
    horizontal = getattr(container, "orientation", None) == "horizontal"
    if horizontal:
        positions = [p.get_y() + p.get_height() / 2 for p in patches]
        values = [p.get_width() for p in patches]
    else:
        positions = [p.get_x() + p.get_width() / 2 for p in patches]
        values = [p.get_height() for p in patches]
    datavalues = getattr(container, "datavalues", None)
    if datavalues is not None and len(datavalues) == len(values):
        values = list(datavalues)
    label = container.get_label() or ""
    label = "" if label.startswith("_") else label
    kind = "histogram" if _contiguous(patches, horizontal) else "bar"
    categories = _categories(ax.yaxis if horizontal else ax.xaxis, positions)
    extra = {"orientation": "horizontal" if horizontal else "vertical"}
    if kind == "bar" and categories:
        return _series(kind, label, categories, values, **extra)
    return _series(kind, label, positions, values, **extra)


def _contiguous(patches, horizontal):
    """Bars that touch edge to edge (more than one): a histogram drawn with ``bar`` (seaborn)."""
    if len(patches) < 2:
        return False
    if horizontal:
        spans = sorted((p.get_y(), p.get_y() + p.get_height()) for p in patches)
    else:
        spans = sorted((p.get_x(), p.get_x() + p.get_width()) for p in patches)
    width = abs(spans[0][1] - spans[0][0]) or 1.0
    return all(abs(b[0] - a[1]) <= 1e-6 * width for a, b in itertools.pairwise(spans))


def _categories(axis, positions):
    """The tick labels at ``positions`` (a categorical axis), or None."""
    mapping = getattr(axis.get_units(), "_mapping", None)
    if mapping:
        by_index = {int(v): k for k, v in mapping.items()}
        names = [by_index.get(round(p)) for p in positions]
        if all(n is not None for n in names):
            return names
    try:
        ticks = {
            round(float(t), 6): lab.get_text()
            for t, lab in zip(axis.get_majorticklocs(), axis.get_majorticklabels(), strict=False)
        }
    except Exception:
        return None
    names = [ticks.get(round(float(p), 6)) for p in positions]
    return names if names and all(names) else None


def _hist_series(hist):
    import numpy as np

    counts = np.asarray(hist["counts"], dtype=float)
    edges = np.asarray(hist["edges"], dtype=float)
    rows = counts if counts.ndim == 2 else [counts]
    labels = hist["label"]
    labels = list(labels) if isinstance(labels, (list, tuple)) else [labels] * len(rows)
    out = []
    for i, row in enumerate(rows):
        label = labels[i] if i < len(labels) else ""
        doc = _series("histogram", label, edges[:-1], row, bins=len(row))
        doc["edges_range"] = [float(edges[0]), float(edges[-1])]
        doc["total"] = float(np.nansum(row))
        out.append(doc)
    return out


def _box_series(box):
    boxes = []
    for stats in box["stats"][:MAX_POINTS]:
        fliers = stats.get("fliers", [])
        boxes.append(
            {
                "label": _text(stats.get("label", "")),
                **{
                    k: _value(stats.get(k))
                    for k in ("whislo", "q1", "med", "q3", "whishi", "mean")
                    if k in stats
                },
                "fliers": len(fliers),
            }
        )
    values = [b.get("med") for b in boxes]
    ranges = [v for b in boxes for v in (b.get("whislo"), b.get("whishi")) if v is not None]
    return {
        "kind": "box",
        "label": "",
        "count": len(box["stats"]),
        "boxes": boxes,
        "orientation": "vertical" if box["vertical"] else "horizontal",
        "x": [b["label"] for b in boxes],
        "y": values,
        "x_range": None,
        "y_range": [min(ranges), max(ranges)] if ranges else None,
    }


def _pie_series(wedges):
    labels = [_label(w) for w in wedges]
    shares = [abs(w.theta2 - w.theta1) / 360.0 for w in wedges]
    return _series("pie", "", labels, shares)


def _image_series(image):
    import numpy as np

    array = image.get_array()
    shape = list(np.shape(array)) if array is not None else []
    cmap = image.get_cmap()
    return {
        "kind": "image",
        "label": _label(image),
        "count": int(np.prod(shape)) if shape else 0,
        "shape": shape,
        "x": [],
        "y": [],
        "x_range": None,
        "y_range": None,
        "value_range": _range(array) if array is not None and np.ndim(array) == 2 else None,
        "cmap": _text(getattr(cmap, "name", "")),
        "extent": [_value(v) for v in image.get_extent()],
    }


# -- Plotly and Altair: their own specs ---------------------------------------------------------
def _spec_doc(library, spec):
    import json

    text = json.dumps(spec, default=str)
    doc = {"version": VERSION, "library": library, "spec_chars": len(text)}
    if len(text) <= MAX_SPEC:
        doc["spec"] = json.loads(text)
    else:
        doc["note"] = f"spec of {len(text)} characters left out (over {MAX_SPEC})"
    return doc


def plotly_chart(figure):
    return _spec_doc("plotly", figure.to_plotly_json())


def altair_chart(chart):
    return _spec_doc("vega-lite", chart.to_dict())


# -- pandas -----------------------------------------------------------------------------------
def table_of(frame):
    rows, columns = frame.shape
    shown = frame.iloc[:, :MAX_COLUMNS]
    head = shown.head(PREVIEW_ROWS)
    tail = shown.tail(PREVIEW_ROWS) if rows > 2 * PREVIEW_ROWS else shown.iloc[0:0]
    if rows <= 2 * PREVIEW_ROWS:
        head = shown
    return {
        "version": VERSION,
        "library": "pandas",
        "shape": [rows, columns],
        "columns": [_column(shown.iloc[:, i], name) for i, name in enumerate(shown.columns)],
        "columns_shown": shown.shape[1],
        "index": _text(type(frame.index).__name__),
        "head": _rows(head),
        "tail": _rows(tail),
    }


def _rows(frame):
    return [[_value(v) for v in row] for row in frame.itertuples(index=False, name=None)]


def _column(series, name):
    import pandas as pd

    doc = {"name": _text(name), "dtype": _text(series.dtype), "nulls": int(series.isna().sum())}
    kind = getattr(series.dtype, "kind", "O")
    if kind in "biufmM" and not isinstance(series.dtype, pd.CategoricalDtype):
        valid = series.dropna()
        if len(valid):
            doc["min"], doc["max"] = _value(valid.min()), _value(valid.max())
        if kind in "iuf" and len(valid):
            doc["mean"] = _value(float(valid.mean()))
        return doc
    counted = series if len(series) <= TOP_VALUES_ROWS else series.iloc[:TOP_VALUES_ROWS]
    try:
        counts = counted.value_counts().head(TOP_VALUES)
        doc["unique"] = int(counted.nunique())
        doc["top"] = [[_value(k), int(v)] for k, v in counts.items()]
    except TypeError:  # unhashable values (lists, dicts)
        doc["top"] = []
    if counted is not series:
        doc["top_of_rows"] = TOP_VALUES_ROWS
    return doc


_EXTRACTORS = {
    "matplotlib": (matplotlib_chart, "matplotlib"),
    "plotly": (plotly_chart, "plotly"),
    "altair": (altair_chart, "vega-lite"),
    "pandas": (table_of, "pandas"),
}
