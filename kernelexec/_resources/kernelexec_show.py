"""matplotlib backend for kernelexec's stateless runs: ``plt.show()`` saves, nothing is shown.

A stateless block has no inline backend and no display. With this backend (``MPLBACKEND=
module://kernelexec_show``, set by kernelexec with this file's folder on ``PYTHONPATH``) every
open figure is saved as a PNG when ``plt.show()`` is called, or when the block ends with
figures still open, and a line names each file, as the stateful executor's output does. It runs
inside the block's own interpreter, which may not have kernelexec installed: matplotlib only.

With charts on (``KERNELEXEC_CHARTS=1``), each saved figure's chart document is made here too,
in the block's process, by the extractor the kernels use (``kernelexec_charts.py``, beside this
file), and written as JSON beside the figure (``cell1-1.chart.json``: where the block may write,
in a sandbox or a container too) before the figure's line is printed; the host reads it when it
sees the line, as untrusted data, and removes it (kernelexec/_command.py).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import sys
from typing import Any

from matplotlib._pylab_helpers import Gcf
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
_saved = 0
_extractor: Any = None  # the extractor module once loaded; False: it could not be


def _charts() -> Any:
    """The extractor, loaded on first use when charts are asked for (else None)."""
    return preload() if os.environ.get("KERNELEXEC_CHARTS") == "1" else None


def preload() -> Any:
    """Load the extractor now (the warm spawner does, once: not each block it forks)."""
    global _extractor
    if _extractor is None:
        _extractor = False
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernelexec_charts.py")
        try:  # by its path: the warm spawner imports this module with its folder on the path
            spec = importlib.util.spec_from_file_location("kernelexec_charts", path)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                _extractor = module
        except Exception:  # charts are lost; the figures are saved as ever
            pass
    return _extractor or None


def ready() -> None:
    """Wrap ``hist`` and ``bxp`` (they keep the bins and quartiles a chart needs) when charts
    are on: at import, and again in a warm spawner's block, once its environment is set."""
    charts = _charts()
    axes = sys.modules.get("matplotlib.axes._axes")
    if charts is not None and axes is not None:
        with contextlib.suppress(Exception):  # histograms and boxes lose their details
            charts.wrap_axes(axes)


def _write_chart(figure: Any, path: str) -> None:
    charts = _charts()
    if charts is None:
        return
    try:
        doc = charts.format("matplotlib", figure)
        text = json.dumps(doc, allow_nan=False, default=str)
    except Exception as exc:  # the block's figure is saved whatever the extractor makes of it
        text = json.dumps({"version": 1, "library": "matplotlib", "error": type(exc).__name__})
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass


def show(*args: Any, **kwargs: Any) -> None:
    """Save every open figure (then close it), naming each file on stdout."""
    global _saved
    # read at show time: the warm spawner imports this module before any block's environment
    prefix = os.environ.get("KERNELEXEC_FIGURE_PREFIX", "figure-")
    for manager in Gcf.get_all_fig_managers():
        _saved += 1
        path = f"{prefix}{_saved}.png"
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        figure = manager.canvas.figure
        figure.savefig(path)
        # before the line: the host reads it when the line comes
        _write_chart(figure, f"{prefix}{_saved}.chart.json")
        # one write (print writes the newline apart): the host sees the line whole
        sys.stdout.write(f"[image/png saved to {path}]\n")
        sys.stdout.flush()
    Gcf.destroy_all()


ready()
# Figures drawn but never shown are saved too, as the inline backend shows them at cell end.
atexit.register(show)
