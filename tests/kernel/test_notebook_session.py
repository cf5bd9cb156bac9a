"""Every session is a notebook: executors record their blocks; the file survives a crash."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from kernelexec import CommandLineExecutor
from kernelexec._session import META_KEY

PLOT = """\
import matplotlib
matplotlib.use("module://matplotlib_inline.backend_inline")
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
"""


def _texts(cell: nbformat.NotebookNode, name: str = "stdout") -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == name)


def test_a_stateless_session_is_a_valid_notebook(tmp_path: Path) -> None:
    path = tmp_path / "session.ipynb"
    with CommandLineExecutor(timeout=10, notebook_path=path) as ex:
        ex.execute("print('hello')")
        ex.execute("echo out; echo err >&2", "bash")
        ex.execute("raise ValueError('bad')")
        ex.execute("import time; time.sleep(5)", timeout=0.5)
        live = ex.notebook
    on_disk = nbformat.read(path, as_version=4)
    nbformat.validate(on_disk)
    assert on_disk == live
    assert ex.notebook == live  # still there after close, for a final save
    assert ex.save_notebook(tmp_path / "after.ipynb").read_text() == path.read_text()
    hello, shell, failed, slow = on_disk.cells
    assert hello.source == "print('hello')" and _texts(hello) == "hello\n"
    assert shell.source == "%%bash\necho out; echo err >&2"
    assert (_texts(shell), _texts(shell, "stderr")) == ("out\n", "err\n")
    assert shell.metadata[META_KEY]["language"] == "shell"
    assert failed.outputs[-1].output_type == "error"
    assert (failed.outputs[-1].ename, failed.outputs[-1].evalue) == ("ValueError", "bad")
    assert failed.metadata[META_KEY]["exit_code"] == 1
    assert slow.metadata[META_KEY]["timed_out"] is True
    assert slow.metadata[META_KEY]["exit_code"] == 124
    assert slow.outputs[-1].ename == "Timeout"
    assert [c.execution_count for c in on_disk.cells] == [1, 2, 3, 4]
    assert {c.metadata[META_KEY]["executor"] for c in on_disk.cells} == {"local-command"}
    assert all(c.metadata[META_KEY]["duration_s"] > 0 for c in on_disk.cells)


def test_blocks_refused_before_running_are_not_cells(tmp_path: Path) -> None:
    with CommandLineExecutor(timeout=10) as ex:
        ex.execute("print(1)", "cobol")
        ex.execute("print(2)")
        assert [c.source for c in ex.notebook.cells] == ["print(2)"]
        saved = ex.save_notebook(tmp_path / "s.ipynb")
    assert nbformat.read(saved, as_version=4).cells[0].source == "print(2)"


# -- the host process is killed mid-session -----------------------------------------------------
_HOST = """
import sys
from kernelexec import {cls}
ex = {cls}(timeout=120, work_dir=sys.argv[1], notebook_path=sys.argv[2])
ex.execute("print('one')")
ex.execute("echo two", "bash")
ex.execute("x = 3\\nprint(x)")
ex.execute("import os, time\\nopen('pid', 'w').write(str(os.getpid()))\\ntime.sleep(120)")
"""


@contextlib.contextmanager
def _reap(pid_file: Path) -> Iterator[None]:
    """Kill what the last block started: the host cannot, as it is killed first."""
    try:
        yield
    finally:
        if pid_file.exists() and pid_file.read_text().strip():
            pid = int(pid_file.read_text())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("cls", ["CommandLineExecutor", "KernelExecutor"])
def test_killing_the_host_loses_no_finished_block(tmp_path: Path, cls: str) -> None:
    work, path = tmp_path / "work", tmp_path / "session.ipynb"
    host = subprocess.Popen(
        [sys.executable, "-c", _HOST.format(cls=cls), str(work), str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    pid_file = work / "pid"
    with _reap(pid_file):
        try:
            deadline = time.monotonic() + 60
            while not (pid_file.exists() and pid_file.read_text().strip()):
                assert host.poll() is None, host.stderr.read() if host.stderr else ""
                assert time.monotonic() < deadline, "the fourth block never started"
                time.sleep(0.05)
        finally:
            host.kill()  # SIGKILL: no finally blocks, no atexit in the host
            host.wait(10)
            if host.stderr is not None:
                host.stderr.close()
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert [c.source for c in nb.cells] == ["print('one')", "%%bash\necho two", "x = 3\nprint(x)"]
    assert [_texts(c) for c in nb.cells] == ["one\n", "two\n", "3\n"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


# -- stateful sessions ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nbformat.NotebookNode]:
    from kernelexec import KernelExecutor

    path = tmp_path_factory.mktemp("kernel") / "session.ipynb"
    with KernelExecutor(timeout=30, notebook_path=path) as ex:
        ex.execute("x = 20")
        ex.execute("x * 2")
        ex.execute(PLOT)
        ex.execute("echo from-bash-$((1 + 1))", "bash")
        ex.execute("print(undefined_name)")
        ex.restart()
        ex.execute("print('fresh' if 'x' not in globals() else 'stale')")
    yield nbformat.read(path, as_version=4)


@pytest.mark.slow
def test_a_kernel_session_records_results_images_and_errors(
    kernel_session: nbformat.NotebookNode,
) -> None:
    nbformat.validate(kernel_session)
    assign, value, plot, shell, failed, note, fresh = kernel_session.cells
    assert [c.execution_count for c in (assign, value, plot)] == [1, 2, 3]
    (result,) = value.outputs
    assert result.output_type == "execute_result" and result.data["text/plain"] == "40"
    images = [o for o in plot.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1
    png = images[0].data["image/png"]
    assert isinstance(png, str) and png.startswith("iVBORw0KGgo")  # base64 of the PNG magic
    assert shell.source.startswith("%%bash\n") and "from-bash-2" in _texts(shell)
    assert failed.outputs[-1].ename == "NameError"
    assert failed.metadata[META_KEY]["exit_code"] == 1
    assert note.cell_type == "markdown" and "restarted" in note.source
    assert _texts(fresh) == "fresh\n" and fresh.execution_count == 1  # a new kernel counts anew
    code = [c for c in kernel_session.cells if c.cell_type == "code"]
    assert {c.metadata[META_KEY]["executor"] for c in code} == {"local-kernel"}


@pytest.mark.slow
def test_a_kernel_session_reruns_in_jupyter_with_the_same_text(
    kernel_session: nbformat.NotebookNode, tmp_path: Path
) -> None:
    rerun = nbformat.from_dict(kernel_session)
    client = NotebookClient(
        rerun, timeout=60, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    # Up to the restart note: past it, a straight re-run keeps state the session had lost.
    before_restart = kernel_session.cells[:5]
    for ours, theirs in zip(before_restart, rerun.cells, strict=False):
        assert _texts(theirs) == _texts(ours)
        assert [o.output_type for o in theirs.outputs] == [o.output_type for o in ours.outputs]
    assert rerun.cells[1].outputs[0].data["text/plain"] == "40"
