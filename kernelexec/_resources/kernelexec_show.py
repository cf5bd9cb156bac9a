"""matplotlib backend for kernelexec's stateless runs: ``plt.show()`` saves, nothing is shown.

A stateless block has no inline backend and no display. With this backend (``MPLBACKEND=
module://kernelexec_show``, set by kernelexec with this file's folder on ``PYTHONPATH``) every
open figure is saved as a PNG when ``plt.show()`` is called, or when the block ends with
figures still open, and a line names each file, as the stateful executor's output does. It runs
inside the block's own interpreter, which may not have kernelexec installed: matplotlib only.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from matplotlib._pylab_helpers import Gcf
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
_saved = 0


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
        manager.canvas.figure.savefig(path)
        print(f"[image/png saved to {path}]", flush=True)
    Gcf.destroy_all()


# Figures drawn but never shown are saved too, as the inline backend shows them at cell end.
atexit.register(show)
