"""The files API on a remote kernel: no shared disk assumed, so files travel through the kernel.

The gateway's kernel works in its own folder (``working_dir``), distinct from the executor's
local work dir: a file that lands there, and not in the local one, went over the protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_servers import Gateway

from kernelexec import KernelExecutor, RequestAborted, UnsafePath


@pytest.fixture
def remote(gateway: Gateway, tmp_path: Path) -> Iterator[tuple[KernelExecutor, Path]]:
    there = tmp_path / "remote-side"
    backend = gateway.backend(working_dir=str(there))
    with KernelExecutor(backend, work_dir=tmp_path / "local-side", timeout=30) as ex:
        yield ex, there


def test_files_go_through_the_kernel(
    remote: tuple[KernelExecutor, Path], files_contract: Callable[[Any, Path], None]
) -> None:
    ex, there = remote
    files_contract(ex, there)
    assert not (ex.work_dir / "data.bin").exists()  # nothing took the shared-disk shortcut
    # the transfers left nothing in the session's history
    r = ex.execute("len([h for h in In if '__kx_' + 'files__' in h])")
    assert r.output == "0"


def test_upload_and_download(
    remote: tuple[KernelExecutor, Path], transfer_roundtrip: Callable[[Any], None]
) -> None:
    ex, there = remote
    transfer_roundtrip(ex)
    assert (there / "in" / "copy.bin").is_file()


# The kernel aborts the next ``n`` execute requests that carry code (kernelexec's silent file
# transfers among them), as ipykernel does in the window after a request that failed with
# stop_on_error; then it runs them again (``_aborting`` is what ipykernel 6 and 7 dispatch read).
ABORT_OWN = """\
def _abort_next(n, k=get_ipython().kernel):
    send, left = k._send_abort_reply, [n]

    def counted(stream, msg, idents):
        r = send(stream, msg, idents)
        if msg["content"].get("code"):
            left[0] -= 1
            if left[0] == 0:
                k._aborting = False
                del k._send_abort_reply
        return r

    k._send_abort_reply = counted
    k._aborting = True
_abort_next({n})
del _abort_next
"""


def test_a_transfer_the_kernel_aborted_is_sent_again_once(
    remote: tuple[KernelExecutor, Path],
) -> None:
    ex, there = remote
    assert ex.execute(ABORT_OWN.format(n=1)).ok
    ex.write_file("once.txt", b"sent again")  # aborted once, sent again
    assert (there / "once.txt").read_bytes() == b"sent again"
    assert ex.execute(ABORT_OWN.format(n=2)).ok
    with pytest.raises(RequestAborted, match="aborted the request twice"):
        ex.read_file("once.txt")
    assert ex.read_file("once.txt") == b"sent again"  # nothing stuck: the next one runs


# -- 30, left open (c): only regular files are read or written, at once -------------------------
def test_a_fifo_on_the_remote_side_is_refused_at_once(
    remote: tuple[KernelExecutor, Path],
) -> None:
    """The remote helper runs in the kernel as the code's own user (no rights gained), but a
    FIFO the code planted used to be opened and the transfer waited for the timeout."""
    ex, there = remote
    ex.execute("import os; os.mkfifo('result.csv'); os.mkfifo('data.csv.kx-partial')")
    started = time.monotonic()
    with pytest.raises(UnsafePath, match="a FIFO, not a regular file"):
        ex.read_file("result.csv")
    with pytest.raises(UnsafePath, match="a FIFO, not a regular file"):
        ex.download("result.csv", there.parent / "dl.csv")
    ex.write_file("data.csv", b"agent data")  # the planted partial name is replaced
    assert time.monotonic() - started < 10
    assert (there / "data.csv").read_bytes() == b"agent data"
    assert ex.execute("print(1)").output == "1\n"  # the session is fine
