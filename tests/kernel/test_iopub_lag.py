"""Output that reaches the host after the block's reply is still the block's.

On a loaded machine a kernel's iopub messages (stream output, displays, the final ``idle``) can
arrive well after its shell reply: they are separate sockets, sent by separate threads. The
executor used to end a block one second after the reply when iopub was quiet, so a lagging
``print`` was lost from a result that said exit 0 (seen in CI: ``print(kept)`` gave ``''``).
Here a kernel's iopub socket is made to lag by 1.5 s, order kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelexec import KernelExecutor

#: run in the kernel: every iopub message leaves 1.5 s after it was sent, in order
LAG_IOPUB = """
import queue, threading, time
_io = get_ipython().kernel.iopub_socket.io_thread
_real = _io.socket
_due = queue.Queue()
def _pump():
    while True:
        when, parts = _due.get()
        time.sleep(max(0.0, when - time.monotonic()))
        _real.send_multipart(parts)
class _Lagging:
    def send_multipart(self, parts, *args, **kwargs):
        _due.put((time.monotonic() + 1.5, [bytes(p) for p in parts]))
    def __getattr__(self, name):
        return getattr(_real, name)
threading.Thread(target=_pump, daemon=True).start()
_io.socket = _Lagging()
"""


@pytest.mark.slow
def test_output_that_lags_the_reply_is_kept(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        ex.execute("kept = 'yes'")
        assert ex.execute(LAG_IOPUB).ok
        r = ex.execute("print(kept)")
        assert (r.exit_code, r.output) == (0, "yes\n")
        r = ex.execute("from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\n1/0")
        assert r.exit_code == 1 and r.error is not None and r.error.ename == "ZeroDivisionError"
        assert [o["output_type"] for o in r.outputs] == ["display_data", "error"]
        r = ex.execute("import time; print('a', flush=True); time.sleep(30)", timeout=2)
        assert r.timed_out and r.output.startswith("a\n") and not r.state_lost, r.output
        assert ex.execute("print(kept)").output == "yes\n"
