"""The Docker command back end tells the whole truth, under runc and gVisor (issue 31).

Every byte a block writes comes back and is counted, the two streams meet at line boundaries in
``output``, an out-of-memory kill says so on both runtimes, and ``close()`` stops a running
block instead of waiting for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from kx_close import check_stopped_by_close, close_during_block, unique_seconds
from kx_docker_helpers import containers_of, require_runtime

from kernelexec import CommandLineExecutor, DockerCommand

RUNTIMES = [pytest.param("runc"), pytest.param("runsc", marks=pytest.mark.gvisor)]
MAIN_MARK = "import os, signal, sys"  # in PID 1's command line (DockerCommand's _MAIN)


def backend(runtime: str, **options: Any) -> DockerCommand:
    return DockerCommand(runtime=None if runtime == "runc" else runtime, **options)


@pytest.fixture(scope="module", params=RUNTIMES)
def ex(
    request: pytest.FixtureRequest,
    docker_client: docker.DockerClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[CommandLineExecutor]:
    require_runtime(docker_client, request.param)
    work = tmp_path_factory.mktemp(f"fidelity-{request.param}")
    with CommandLineExecutor(backend=backend(request.param), work_dir=work, timeout=60) as ex:
        yield ex


# Every process's command line, read inside the container (``docker top`` under gVisor lists
# the host's processes, not the sandbox's); the reading process itself is left out.
_PS = """
import os
for pid in os.listdir('/proc'):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            line = open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace')
            print(line.replace('\\0', ' ').replace('\\n', ' '))
        except OSError:
            pass
"""


def container_processes(container: Any) -> list[str]:
    code, out = container.exec_run(["python3", "-c", _PS])
    assert code == 0, out
    return [line for line in out.decode().splitlines() if line.strip()]


def omitted(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"(\d+) characters omitted", text)]


@pytest.mark.parametrize(
    ("code", "stream", "size"),
    [
        ("print('x' * 1_000_000)", "stdout", 1_000_001),
        ("import sys; sys.stderr.write('e' * 3_000_000 + '\\n')", "stderr", 3_000_001),
        ("import os; print(os.write(1, b'w' * 1_000_000), file=__import__('sys').stderr)", "", 0),
    ],
    ids=["print", "stderr", "os-write"],
)
def test_a_long_line_arrives_whole_and_is_counted(
    ex: CommandLineExecutor, code: str, stream: str, size: int
) -> None:
    """Under gVisor a write to the exec's pipe returned after 64 KiB and Python's unbuffered
    stdout dropped the rest: a 1,000,000-character print said "45537 characters omitted"."""
    r = ex.execute(code)
    assert r.ok, r.output[-500:]
    if not stream:  # the block's own unbuffered write is whole too
        assert r.stderr == "1000000\n" and omitted(r.stdout) == [1_000_000 - 20_000], r.stderr
        return
    limit = ex.aio.options.output_limit
    assert omitted(getattr(r, stream)) == [size - limit], getattr(r, stream)[-300:]
    assert omitted(r.output) == [size - limit]
    assert r.full_output_file is not None and r.full_output_file.stat().st_size == size


def test_what_a_block_writes_on_sigterm_at_its_timeout_arrives(ex: CommandLineExecutor) -> None:
    """The block's output passes through its wrapper: the wrapper must outlive the SIGTERM."""
    code = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('cleanup', flush=True); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    r = ex.execute(code, timeout=2)
    assert r.timed_out and r.output.startswith("ready\ncleanup\n"), r.output


def test_output_merges_the_streams_at_line_boundaries(ex: CommandLineExecutor) -> None:
    """Unbuffered Python put a stderr line inside a stdout line: "hierr\\n\\n" (issue 31.11)."""
    code = (
        "import sys, time\n"
        "sys.stdout.write('hi'); time.sleep(0.3)\n"
        "sys.stderr.write('err\\n'); time.sleep(0.3)\n"
        "sys.stdout.write(' there\\n')\n"
    )
    r = ex.execute(code)
    assert (r.stdout, r.stderr, r.output) == ("hi there\n", "err\n", "err\nhi there\n")


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_out_of_memory_says_so_on_every_runtime(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: str
) -> None:
    """Under gVisor the OOM killer ends the whole sandbox: the block said "the container
    stopped", where runc's said "out of memory" (issue 31.8)."""
    require_runtime(docker_client, runtime)
    with CommandLineExecutor(
        backend=backend(runtime, memory="128m"), work_dir=tmp_path, timeout=60
    ) as ex:
        r = ex.execute("x = bytearray(512 * 1024 * 1024)\nprint('allocated')")
        assert r.exit_code == 137 and r.error is not None and r.error.ename == "Killed", r
        assert "out of memory (container memory limit 128m)" in r.output, r.output
        assert "allocated" not in r.output and "stopped while the block ran" not in r.output
        after = ex.execute("print('recovered')")
        assert after.output == "recovered\n", after.output  # no note about a stopped container


@pytest.mark.parametrize("action", ["close", "restart"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_close_from_another_thread_stops_the_running_block(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: str, action: str
) -> None:
    """close() waited for the running block (28.5 s of a 30 s block, issue 31.7). A container
    kept running at close (``stop_container=False``) is left with nothing of the block in it."""
    require_runtime(docker_client, runtime)
    ex = CommandLineExecutor(backend=backend(runtime, stop_container=False), work_dir=tmp_path)
    session = ex.aio.backend.session
    try:
        took, result = close_during_block(ex, unique_seconds(), action)
        check_stopped_by_close(took, result, action)
        (kept,) = containers_of(docker_client, session)
        kept.reload()
        assert kept.status == "running"
        assert [p for p in container_processes(kept) if MAIN_MARK not in p] == [], runtime
    finally:
        for container in containers_of(docker_client, session):
            container.remove(force=True)
