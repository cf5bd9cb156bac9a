"""R, Deno and bash kernels in a sandboxed-kernel session (issue 36): each runs inside a bubblewrap
sandbox of its own with the session's options (the host read-only, no network, not root, only the
work dir writable), started through the bridge (``_sandbox_bridge``). One session is shared.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kx_languages import TIMEOUT_FIELDS, check_timeout_keeps_state, need_kernels, timeout_cases
from kx_sandbox import sandbox_unavailable

from kernelexec import KernelExecutor, make_executor


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    why = sandbox_unavailable()
    if why is not None:
        pytest.skip(why)
    need_kernels("r", "javascript", "bash")
    folder = tmp_path_factory.mktemp("langs-sandbox")
    with make_executor(
        "sandboxed-kernel", work_dir=folder / "work", timeout=60, languages={"bash": "bash"}
    ) as executor:
        yield executor


def test_each_language_runs_in_the_sandbox_and_shares_the_work_dir(ex: KernelExecutor) -> None:
    r = ex.execute("writeLines('from r', 'r.txt')\ncat(system('id -u', intern = TRUE))", "r")
    assert r.exit_code == 0 and r.output.isdigit() and r.output != "0", r.output  # not root
    js = ex.execute("console.log(Deno.readTextFileSync('r.txt').trim(), Deno.cwd())", "js")
    assert js.output == f"from r {ex.work_dir}\n"
    sh = ex.execute("cat r.txt; id -u", "bash")
    assert sh.output.splitlines()[0] == "from r" and sh.output.splitlines()[1] != "0"


@pytest.mark.parametrize(
    ("language", "write"),
    [
        ("r", "writeLines('x', '{path}')"),
        ("javascript", "Deno.writeTextFileSync('{path}', 'x')"),
        ("bash", "echo x > {path}"),
    ],
)
def test_nothing_is_written_outside_and_no_network(
    ex: KernelExecutor, tmp_path: Path, language: str, write: str
) -> None:
    target = tmp_path / f"escape-{language}.txt"
    result = ex.execute(write.format(path=target), language)
    assert result.exit_code == 1 and not target.exists(), result.output
    if language == "r":  # no network: not even a name lookup
        net = ex.execute("tryCatch(nsl('deb.debian.org'), error = function(e) NULL)", "r")
        assert net.output.endswith("NULL") and "unable to resolve" in net.output, net.output


@pytest.mark.parametrize(TIMEOUT_FIELDS, timeout_cases("Sys.sleep(120)", "sleep 120"))
def test_a_timeout_interrupts_the_block_and_keeps_the_state(
    ex: KernelExecutor, language: str, setup: str, stuck: str, check: str, expected: str
) -> None:
    check_timeout_keeps_state(ex, language, setup, stuck, check, expected)


def test_a_plot_and_a_death(ex: KernelExecutor) -> None:
    plot = ex.execute("plot(1:3)", "r")
    assert [p.suffix for p in plot.files] == [".png"]
    died = ex.execute("tools::pskill(Sys.getpid(), 9)", "r")
    assert died.kernel_died and died.state_lost
    assert ex.execute("exists('left')", "r").output == "[1] FALSE"


def test_a_missing_kernel_says_what_to_install(tmp_path: Path) -> None:
    if (why := sandbox_unavailable()) is not None:
        pytest.skip(why)
    with make_executor(
        "sandboxed-kernel", work_dir=tmp_path, timeout=30, languages={"x": "no-such-kernel"}
    ) as ex:
        result = ex.execute("anything", "x")
        assert result.not_run and result.error is not None
        assert result.error.ename == "KernelNotInstalled"


class _Bait:
    """A host unix socket only the host can reach (the sandbox sees no host /tmp): counts who
    connects. A link planted in the kernel's run folder points here."""

    def __init__(self, path: Path) -> None:
        self.path, self.connected = path, 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._count, daemon=True)
        self._thread.start()

    def _count(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connected += 1
            conn.close()

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self._sock.close()


PLANT = """\
cd {run} && ls
for f in k-*; do rm -f "$f" && ln -s {bait} "$f"; done
mkfifo fifo && ln -s {bait} kernel-tcp.json.new
"""


def test_a_block_cannot_replace_its_kernels_sockets(ex: KernelExecutor, tmp_path: Path) -> None:
    """The bash kernel's bridge binds its channel and interrupt sockets in the run folder the
    sandbox's user wrote them in. Were it still writable once the kernel runs, a block would swap
    them for links: the host (root) follows each on an interrupt or a reconnect. (Last: it kills
    the shared session's bash kernel, which the next bash block would start afresh.)"""
    bait = _Bait(tmp_path / "bait.sock")
    try:
        assert ex.execute("LEFT=7", "bash").exit_code == 0
        ipc_dir = ex.aio._others["bash"].backend._ipc_dir  # type: ignore[attr-defined]
        run = Path(ipc_dir) / "run"
        # A Python block (another sandbox) does not even see the bash kernel's folder, and
        # cannot replace its own kernel's sockets either.
        seen = ex.execute(f"import os\nprint(os.path.exists({str(run)!r}))")
        assert seen.output == "False\n"
        own = f"os.symlink({str(bait.path)!r}, os.environ['IPYTHONDIR'] + '/../k-1.new')"
        python = ex.execute(own)
        assert python.error is not None and python.error.ename == "PermissionError"
        planted = ex.execute(PLANT.format(run=run, bait=bait.path), "bash")
        assert "Permission denied" in planted.output, planted.output
        assert sorted(p.name for p in run.iterdir() if p.is_symlink()) == []
        stuck = ex.execute("sleep 120", "bash", timeout=2)  # the host interrupts
        assert (stuck.timed_out, stuck.state_lost) == (True, False)
        assert ex.execute("echo $LEFT", "bash").output == "7\n"  # the same kernel
        died = ex.execute("kill -9 $PPID", "bash")  # the host's channels reconnect
        assert died.kernel_died
        time.sleep(1)
        assert bait.connected == 0
    finally:
        bait.close()
