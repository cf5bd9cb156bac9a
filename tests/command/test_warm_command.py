"""The warm stateless executor: a fresh process per Python block, forked from a warm spawner.

What must hold: nothing a block does survives it (a variable, a module attribute set, an open
file descriptor, a thread, a child process), the blocks' results read as the command executor's,
and the spawner itself is neither a block's nor left behind.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelexec import make_executor
from kernelexec.backends import _containment

pytestmark = pytest.mark.command


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with make_executor(
        "warm-command", work_dir=tmp_path_factory.mktemp("warm"), timeout=30
    ) as executor:
        yield executor


def test_numpy_is_warm_and_blocks_run_as_files(warm: Any) -> None:
    assert "numpy" in sys.modules or warm.execute("import numpy").ok
    r = warm.execute(
        "import sys, numpy as np\n"
        "print(__name__, sys.argv[0].endswith('.py'), np.arange(5).sum())\n"
        "print('numpy' in sys.modules)"
    )
    assert r.ok, r.output
    assert r.output.splitlines() == ["__main__ True 10", "True"]
    assert "numpy" not in warm.backend.not_warmed


def test_a_variable_does_not_survive(warm: Any) -> None:
    assert warm.execute("x = 41").ok
    r = warm.execute("print(x)")
    assert r.exit_code == 1 and r.error is not None and r.error.ename == "NameError"


def test_a_module_attribute_does_not_survive(warm: Any) -> None:
    assert warm.execute("import numpy, json; numpy.kx_mark = 1; json.kx_mark = 1").ok
    r = warm.execute(
        "import numpy, json; print(hasattr(numpy, 'kx_mark'), hasattr(json, 'kx_mark'))"
    )
    assert r.output == "False False\n"


def test_an_open_file_descriptor_does_not_survive(warm: Any, tmp_path: Path) -> None:
    target = tmp_path / "held.txt"
    r = warm.execute(
        f"import os\nfd = os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)\nprint(fd)"
    )
    assert r.ok
    fd = int(r.output)
    r = warm.execute(
        f"import os\ntry:\n    os.fstat({fd}); print('open')\nexcept OSError:\n    print('closed')"
    )
    assert r.output == "closed\n"


def test_a_thread_does_not_survive(warm: Any) -> None:
    r = warm.execute(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=True, name='kx-t').start()\n"
        "print(threading.active_count())"
    )
    assert r.ok and int(r.output) >= 2
    r = warm.execute("import threading; print([t.name for t in threading.enumerate()])")
    assert "kx-t" not in r.output


def test_a_child_process_does_not_survive(warm: Any) -> None:
    token = f"kx-warm-{os.getpid()}-{time.monotonic_ns()}"
    r = warm.execute(
        "import subprocess, os\n"
        f"subprocess.Popen(['sleep', '600', {token!r}], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print('started')"
    )
    assert r.output == "started\n"
    deadline = time.monotonic() + 10
    while _with_token(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _with_token(token) == []


def test_numpy_draws_differ_between_blocks(warm: Any) -> None:
    code = "import numpy as np; print(np.random.randint(0, 2**31))"
    draws = {warm.execute(code).output for _ in range(3)}
    assert len(draws) == 3


def test_exit_statuses_read_as_the_command_executors(warm: Any) -> None:
    assert warm.execute("import sys; sys.exit(3)").exit_code == 3
    r = warm.execute("import sys; sys.exit('bye')")
    assert (r.exit_code, r.output) == (1, "bye\n")
    r = warm.execute("1/0")
    assert r.error is not None and r.error.ename == "ZeroDivisionError"
    assert "kernelexec_warm" not in r.output and "line 1, in <module>" in r.output
    r = warm.execute("def f(:\n  pass")
    assert r.exit_code == 1 and r.error is not None and r.error.ename == "SyntaxError"
    r = warm.execute("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.exit_code != 0 and not r.ok


def test_a_block_that_says_its_end_early_is_killed(warm: Any) -> None:
    """A block tells the spawner its status as it ends (the host need not wait while the
    kernel frees a large forked process): one that says it and runs on is killed all the same."""
    r = warm.execute(
        "import os, socket, stat, sys, time\n"
        "print(os.getpid(), flush=True)\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        if stat.S_ISSOCK(os.fstat(fd).st_mode): os.write(fd, bytes([7]))\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(600)\n",
        timeout=20,
    )
    assert not r.timed_out and r.exit_code == 7, r.output
    pid = int(r.output.split()[0])
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _running(pid)
    assert warm.execute("print('next')").output == "next\n"


def test_a_timeout_kills_the_block_not_the_spawner(warm: Any) -> None:
    spawner = warm.backend.pid
    started = time.monotonic()
    r = warm.execute("import time; time.sleep(600)", timeout=1)
    assert r.timed_out and time.monotonic() - started < 15
    assert warm.backend.pid == spawner and warm.execute("print('after')").output == "after\n"


def test_shell_blocks_run_as_in_the_command_executor(warm: Any) -> None:
    r = warm.execute("echo $((6 * 7))", "bash")
    assert r.output == "42\n"


def test_output_streams_in_order_and_whole(warm: Any) -> None:
    r = warm.execute(
        "import sys\nfor i in range(3):\n    print(i); print('e', i, file=sys.stderr)\n"
        "print('x' * 5_000)"
    )
    assert r.stdout == "0\n1\n2\n" + "x" * 5_000 + "\n"
    assert r.stderr == "e 0\ne 1\ne 2\n"


def test_a_figure_is_saved(tmp_path: Path) -> None:
    with make_executor("warm-command", work_dir=tmp_path, timeout=60) as ex:
        r = ex.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert r.ok, r.output
    assert [p.suffix for p in r.files] == [".png"]


def test_a_killed_spawner_is_replaced(tmp_path: Path) -> None:
    with make_executor("warm-command", work_dir=tmp_path, timeout=30, warm_up=()) as ex:
        assert ex.execute("print(1)").ok
        first = ex.backend.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not ex.backend._warm.gone and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ex.execute("print(2)").output == "2\n"
        assert ex.backend.pid not in (None, first)
    assert not _running(first)


def test_close_ends_the_spawner(tmp_path: Path) -> None:
    ex = make_executor("warm-command", work_dir=tmp_path, timeout=30, warm_up=())
    ex.execute("print(1)")
    pid = ex.backend.pid
    ex.close()
    assert not _running(pid)


def test_blocks_are_contained_as_the_command_executors(warm: Any) -> None:
    assert warm.backend.block_containment == _containment.mechanism(None) or (
        warm.backend.block_containment == "process-group"
    )


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _with_token(token: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(name))
            except OSError:
                continue
    return found
