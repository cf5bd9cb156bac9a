"""The stateful executor in a real container: DockerKernel behind KernelExecutor.

The behaviour suite at the top runs against a local kernel and a Docker kernel alike (same
tests, parametrised), so the container changes where the kernel runs, not how it behaves; the
Docker kernel once under runc and once under gVisor (its channels through the relay).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from kx_docker_helpers import (
    check_close_is_fast,
    check_engine_dying_mid_block,
    containers_of,
    processes,
    require_runtime,
)

from kernelexec import (
    DockerKernel,
    DockerOptions,
    KernelExecutor,
    LocalKernel,
)
from kernelexec.backends.base import KernelBackend
from kernelexec.backends.docker_kernel import RUNTIME


def make_backend(kind: str, **options: Any) -> KernelBackend:
    if kind == "local":
        return LocalKernel()
    if kind == "docker-runsc":
        options = {"runtime": "runsc", **options}
    return DockerKernel(**options)


@pytest.fixture(
    scope="module",
    params=["local", "docker", pytest.param("docker-runsc", marks=pytest.mark.gvisor)],
)
def kex(
    request: pytest.FixtureRequest,
    docker_client: docker.DockerClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KernelExecutor]:
    if request.param == "docker-runsc":
        require_runtime(docker_client, "runsc")
    work = tmp_path_factory.mktemp(f"kernel-{request.param}")
    with pytest.MonkeyPatch.context() as mp:
        # ipykernel stops capturing fd-level output when it sees this variable.
        mp.delenv("PYTEST_CURRENT_TEST", raising=False)
        executor = KernelExecutor(backend=make_backend(request.param), work_dir=work, timeout=30)
    with executor:
        yield executor


@pytest.fixture(scope="module")
def dex(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KernelExecutor]:
    """One Docker kernel shared by the Docker-only tests where state does not matter."""
    work = tmp_path_factory.mktemp("dkernel")
    with KernelExecutor(backend=DockerKernel(), work_dir=work, timeout=30) as executor:
        yield executor


def docker_backend(ex: KernelExecutor) -> DockerKernel:
    backend = ex.backend
    assert isinstance(backend, DockerKernel)
    return backend


# -- the same behaviour, local or in Docker -----------------------------------------------------
def test_state_persists(kex: KernelExecutor) -> None:
    assert kex.execute("x = 41").ok
    assert kex.execute("print(x + 1)").output == "42\n"


def test_rich_output_lands_in_the_host_work_dir(kex: KernelExecutor) -> None:
    r = kex.execute("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    assert r.ok, r.output
    pngs = [p for p in r.files if p.suffix == ".png"]
    assert pngs and all(p.parent == kex.work_dir or kex.work_dir in p.parents for p in pngs)
    assert pngs[0].read_bytes().startswith(b"\x89PNG")
    assert any(o["output_type"] == "display_data" for o in r.outputs)


def test_errors_are_results(kex: KernelExecutor) -> None:
    r = kex.execute("1 / 0")
    assert r.exit_code == 1 and r.error is not None and r.error.ename == "ZeroDivisionError"
    assert kex.execute("echo from-shell", "shell").output == "from-shell\n"


def test_timeout_interrupts_and_keeps_state(kex: KernelExecutor) -> None:
    kex.execute("kept = 'still here'")
    started = time.perf_counter()
    r = kex.execute("import time\nwhile True: time.sleep(0.1)", timeout=1)
    assert time.perf_counter() - started < 8
    assert r.timed_out and r.exit_code == 124 and not r.state_lost
    assert kex.execute("print(kept)").output == "still here\n"


def test_interrupt_from_another_thread_keeps_state(kex: KernelExecutor) -> None:
    kex.execute("kept2 = 2")
    timer = threading.Timer(1.0, kex.interrupt)
    timer.start()
    try:
        r = kex.execute("import time\ntime.sleep(20)")
    finally:
        timer.cancel()
    assert r.error is not None and r.error.ename == "KeyboardInterrupt"
    assert kex.execute("print(kept2)").output == "2\n"


def test_restart_loses_state(kex: KernelExecutor) -> None:
    kex.execute("gone = 1")
    kex.restart()
    r = kex.execute("print('gone' in dir())")
    assert r.output == "False\n"


# -- Docker only --------------------------------------------------------------------------------
def test_bare_client_round_trip_over_ipc(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """The back end alone, driven by a plain jupyter_client AsyncKernelClient."""

    async def main() -> tuple[list[str], dict[str, Any], Path]:
        backend = DockerKernel()
        await backend.start(work_dir=tmp_path, env={}, timeout=60)
        try:
            assert backend.runtime_dir is not None
            runtime = backend.runtime_dir
            inside = json.loads((runtime / "kernel.json").read_text())
            client = backend.client
            msg_id = client.execute("import os; print(os.getcwd(), 6 * 7)")
            texts: list[str] = []
            while True:
                msg = await client.get_iopub_msg(timeout=20)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    texts.append(msg["content"]["text"])
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    return texts, inside, runtime
        finally:
            await backend.shutdown()

    texts, inside, runtime = asyncio.run(main())
    assert "".join(texts) == "/workspace 42\n"
    assert inside["transport"] == "ipc" and inside["ip"] == f"{RUNTIME}/kernel"
    assert not runtime.exists()  # shutdown removed the runtime dir


def test_kernel_runs_in_workspace_with_safe_defaults(
    dex: KernelExecutor, docker_client: docker.DockerClient
) -> None:
    assert dex.execute("import os; print(os.getcwd())").output == "/workspace\n"
    container = docker_backend(dex).container
    container.reload()
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"] and host["Init"] is True
    assert host["PidsLimit"] == DockerOptions().pids_limit and host["Memory"] > 0
    assert not container.attrs["Config"]["User"].startswith("0")
    assert container.labels["kernelexec.session"] == docker_backend(dex).session


def test_network_off_fails_cleanly(dex: KernelExecutor) -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('no network')\n"
        "print([n for _, n in socket.if_nameindex()])\n"
    )
    r = dex.execute(code)
    assert r.ok and r.output == "no network\n['lo']\n"


def test_kill_9_pid_1_leaves_the_kernel_alone(dex: KernelExecutor) -> None:
    dex.execute("survivor = 'yes'")
    r = dex.execute("import os, signal\nos.kill(1, signal.SIGKILL)\nprint('sent')")
    assert r.ok and "sent" in r.output
    assert dex.execute("print(survivor)").output == "yes\n"


def test_fork_bomb_is_held_by_the_pids_limit(dex: KernelExecutor) -> None:
    code = (
        "import os, signal, subprocess, time\n"
        "bomb = subprocess.Popen(['bash', '-c', 'b() { b | b & }; b'], stderr=subprocess.DEVNULL)\n"
        "time.sleep(3)\n"
        "count = sum(name.isdigit() for name in os.listdir('/proc'))\n"
        "os.kill(-1, signal.SIGKILL)  # every process but PID 1 and this kernel\n"
        "bomb.wait()\n"
        "print(count)\n"
    )
    r = dex.execute(code, timeout=30)
    limit = DockerOptions().pids_limit
    # The bomb filled the limit (threads count too, so fewer processes than the limit) but no more.
    assert limit is not None and limit // 2 < int(r.output) <= limit, r.output
    assert dex.execute("print('survived')").output == "survived\n"
    left = processes(docker_backend(dex).container)
    assert not any("bash" in p for p in left), left


def test_deleting_the_runtime_dir(dex: KernelExecutor) -> None:
    backend = docker_backend(dex)
    dex.execute("before = 1")
    assert backend.runtime_dir is not None
    shutil.rmtree(backend.runtime_dir)
    # Connected ZMQ sockets outlive their socket files: the kernel keeps answering.
    assert dex.execute("print(before + 1)").output == "2\n"
    dex.restart()  # and a restart makes a fresh runtime dir
    assert backend.runtime_dir is not None and backend.runtime_dir.is_dir()
    assert dex.execute("print('fresh')").output == "fresh\n"


@pytest.mark.slow
def test_out_of_memory_is_reported_and_the_executor_recovers(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    with KernelExecutor(backend=DockerKernel(memory="256m"), work_dir=tmp_path, timeout=60) as ex:
        ex.execute("small = 1")
        r = ex.execute("big = bytearray(1024 * 1024 * 1024)\nprint('allocated')")
        assert r.kernel_died and r.state_lost and not r.ok
        assert "(out of memory)" in r.output  # the back end's death_reason, as the result says
        after = ex.execute("print('small' in dir(), 'recovered')")
        assert after.output == "False recovered\n"


@pytest.mark.slow
def test_read_only_root_blocks_writes_outside_workspace(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    code = (
        "for path in ['/etc/kx', '/home/kx/kx', '/workspace/ok.txt', '/tmp/ok.txt']:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print(path, 'written')\n"
        "    except OSError as exc:\n"
        "        print(path, exc.strerror)\n"
    )
    with KernelExecutor(backend=DockerKernel(read_only=True), work_dir=tmp_path) as ex:
        r = ex.execute(code)
    assert r.output.splitlines() == [
        "/etc/kx Read-only file system",
        "/home/kx/kx Read-only file system",
        "/workspace/ok.txt written",
        "/tmp/ok.txt written",
    ]


@pytest.mark.slow
def test_network_option_uses_tcp_on_the_bridge(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    backend = DockerKernel(network=True)
    with KernelExecutor(backend=backend, work_dir=tmp_path) as ex:
        assert backend.runtime_dir is not None
        inside = json.loads((backend.runtime_dir / "kernel.json").read_text())
        assert inside["transport"] == "tcp"
        ex.execute("y = 2")
        r = ex.execute("import socket; print(y * 21, len(socket.if_nameindex()) > 1)")
        assert r.output == "42 True\n"
        published = backend.container.attrs["NetworkSettings"]["Ports"]
        assert {b[0]["HostIp"] for b in published.values()} == {"127.0.0.1"}


@pytest.mark.slow
def test_two_executors_on_the_same_work_dir(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    with (
        KernelExecutor(backend=DockerKernel(), work_dir=tmp_path) as a,
        KernelExecutor(backend=DockerKernel(), work_dir=tmp_path) as b,
    ):
        a.execute("who = 'a'; open('a.txt', 'w').write(who)")
        b.execute("who = 'b'; open('b.txt', 'w').write(who)")
        assert a.execute("print(who, open('b.txt').read())").output == "a b\n"
        assert b.execute("print(who, open('a.txt').read())").output == "b a\n"
        a.close()
        assert b.execute("print(who)").output == "b\n"


def test_close_is_fast_and_removes_everything(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    backend = DockerKernel()
    ex = KernelExecutor(backend=backend, work_dir=tmp_path)
    ex.execute("import time; import subprocess; p = subprocess.Popen(['sleep', '300'])")
    runtime = backend.runtime_dir
    assert runtime is not None and runtime.is_dir()
    assert len(containers_of(docker_client, backend.session)) == 1
    assert any("sleep 300" in p for p in processes(backend.container))
    check_close_is_fast(docker_client, ex, backend.session)
    assert not runtime.exists()


def test_engine_dying_mid_block_is_a_clear_error(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    def open_session(base_url: str) -> tuple[KernelExecutor, str]:
        backend = DockerKernel(base_url=base_url, api_timeout=10)
        ex = KernelExecutor(backend=backend, work_dir=tmp_path / "work", timeout=60)
        return ex, backend.session

    check_engine_dying_mid_block(
        docker_client, tmp_path, open_session, "import time\ntime.sleep(30)"
    )


def test_interrupt_reaches_the_kernel_inside_the_container(dex: KernelExecutor) -> None:
    backend = docker_backend(dex)

    async def interrupt_soon() -> None:
        await asyncio.sleep(1.0)
        await backend.interrupt()

    timer = threading.Timer(0, lambda: asyncio.run(interrupt_soon()))
    timer.start()
    r = dex.execute("import time\ntime.sleep(20)")
    timer.join()
    assert r.error is not None and r.error.ename == "KeyboardInterrupt"


def test_kernel_as_any_unprivileged_uid(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """A caller whose uid has no entry in the image's /etc/passwd (the usual non-root case)."""
    with KernelExecutor(backend=DockerKernel(user="4321:4321"), work_dir=tmp_path) as ex:
        ex.execute("import os; n = os.getuid()")
        r = ex.execute("open('k.txt', 'w').write('x'); print(n)")
    assert r.output == "4321\n"
    assert (tmp_path / "k.txt").stat().st_uid == 4321


def test_non_utf8_bytes_to_fd_1_keep_the_session(dex: KernelExecutor) -> None:
    started = time.perf_counter()
    r = dex.execute("import os\nos.write(1, b'\\xff' * 100000)", timeout=20)
    assert time.perf_counter() - started < 15
    assert r.ok and not r.timed_out, r.output
    assert "\ufffd" in r.stdout
    # A character split across two reads of the captured fd is decoded whole.
    r = dex.execute("import os\nos.write(1, b'x' + 'é'.encode() * 5000 + b'\\n')", timeout=20)
    assert r.ok and "\ufffd" not in r.stdout and "é" * 100 in r.stdout
    r = dex.execute("import os\n_ = os.write(1, b'fd-ok\\n')", timeout=20)
    assert r.ok and r.output == "fd-ok\n"


def test_a_timed_out_fork_bomb_is_killed_and_the_state_kept(dex: KernelExecutor) -> None:
    dex.execute("import subprocess\nkeeper = subprocess.Popen(['sleep', '300'])")
    dex.execute("bomb_state = 'kept'")
    r = dex.execute(":(){ :|:& };:", "shell", timeout=5)
    assert r.timed_out and not r.state_lost
    after = dex.execute("echo alive", "shell")
    assert after.ok and after.output == "alive\n", after.output
    assert dex.execute("print(bomb_state)").output == "kept\n"
    left = processes(docker_backend(dex).container)
    assert not any("bash" in p for p in left), left
    # What an earlier block started is not the timed-out block's to kill.
    assert any("sleep 300" in p for p in left), left
    dex.execute("keeper.kill(); keeper.wait()")


def test_a_timed_out_block_kills_only_its_own_processes(dex: KernelExecutor) -> None:
    dex.execute("import subprocess\nkeeper2 = subprocess.Popen(['sleep', '302'])")
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '301'])\ntime.sleep(60)"
    r = dex.execute(code, timeout=3)
    assert r.timed_out and not r.state_lost
    left = processes(docker_backend(dex).container)
    assert any("sleep 302" in p for p in left) and not any("sleep 301" in p for p in left), left
    dex.execute("keeper2.kill(); keeper2.wait()")
