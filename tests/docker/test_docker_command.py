"""The stateless executor in a real container: DockerCommand behind CommandLineExecutor."""

from __future__ import annotations

import os
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
)

from kernelexec import (
    CommandLineExecutor,
    DockerCommand,
    DockerOptions,
    ExecutionResult,
)
from kernelexec.backends._docker import UNPRIVILEGED_USER

MAIN_MARK = "import os, signal, sys"  # in PID 1's command line (DockerCommand's _MAIN)


def block_processes(container: Any) -> list[str]:
    return [p for p in processes(container) if MAIN_MARK not in p]


@pytest.fixture(scope="module")
def ex(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CommandLineExecutor]:
    work = tmp_path_factory.mktemp("dcmd")
    with CommandLineExecutor(backend=DockerCommand(), work_dir=work, timeout=30) as executor:
        yield executor


def run(ex: CommandLineExecutor, code: str, lang: str = "python", **kw: Any) -> ExecutionResult:
    return ex.execute(code, lang, **kw)


def test_python_and_shell_run_in_the_container(ex: CommandLineExecutor) -> None:
    r = run(ex, "import os, sys; print(os.getcwd(), sys.executable)")
    assert r.ok, r.output
    assert r.output.strip() == "/workspace /usr/bin/python3"
    r = run(ex, "echo shell-$((6*7)) && test ! -e /.dockerenv || echo in-docker", "shell")
    assert r.ok and r.output.split() == ["shell-42", "in-docker"]


def test_stateless_between_blocks(ex: CommandLineExecutor) -> None:
    assert run(ex, "x = 1").ok
    r = run(ex, "print(x)")
    assert r.exit_code == 1 and r.error is not None and r.error.ename == "NameError"


def test_files_land_in_the_host_work_dir_owned_by_the_container_user(
    ex: CommandLineExecutor,
) -> None:
    r = run(ex, "open('made-inside.txt', 'w').write('hello')")
    assert r.ok, r.output
    path = ex.work_dir / "made-inside.txt"
    assert path.read_text() == "hello"
    assert path in r.files
    expected_uid = int(UNPRIVILEGED_USER.split(":")[0]) if os.getuid() == 0 else os.getuid()
    assert path.stat().st_uid == expected_uid


def test_safe_defaults_are_applied(ex: CommandLineExecutor) -> None:
    backend = ex.backend
    assert isinstance(backend, DockerCommand)
    backend.container.reload()
    attrs = backend.container.attrs
    host = attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["NetworkMode"] == "none"
    assert host["PidsLimit"] == DockerOptions().pids_limit
    assert host["Memory"] == 2 * 1024**3
    assert host["NanoCpus"] == 1_000_000_000
    assert attrs["Config"]["User"] != "" and not attrs["Config"]["User"].startswith("0")
    labels = attrs["Config"]["Labels"]
    assert labels["kernelexec.owner_pid"] == str(os.getpid())
    assert labels["kernelexec.session"] == backend.session
    assert {"kernelexec.host", "kernelexec.version"} <= set(labels)
    r = run(ex, "grep CapEff /proc/self/status; id -u", "shell")
    assert r.output.split() == [
        "CapEff:",
        "0000000000000000",
        attrs["Config"]["User"].split(":")[0],
    ]


def test_host_environment_does_not_leak(
    docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KX_HOST_SECRET", "do-not-copy")
    code = "import os; print(os.environ.get('KX_HOST_SECRET'), os.environ['KX_MINE'])"
    with CommandLineExecutor(
        backend=DockerCommand(), work_dir=tmp_path, env={"KX_MINE": "given"}
    ) as ex:
        r = ex.execute(code)
    assert r.output.split() == ["None", "given"]


def test_output_streams_while_the_block_runs(ex: CommandLineExecutor) -> None:
    seen: list[float] = []
    ex.aio.on_output = lambda out: seen.append(time.perf_counter())
    try:
        started = time.perf_counter()
        r = run(ex, "import time\nprint('a', flush=True)\ntime.sleep(1.5)\nprint('b')")
        ended = time.perf_counter()
    finally:
        ex.aio.on_output = None
    assert r.output == "a\nb\n"
    # The first chunk arrived long before the block ended: streamed, not collected at the end.
    assert seen and seen[0] - started < ended - started - 1.0


def test_timeout_kills_the_block_processes_inside_the_container(ex: CommandLineExecutor) -> None:
    code = "sleep 300 &\nsetsid sleep 301 &\necho started\nsleep 302\n"
    started = time.perf_counter()
    r = run(ex, code, "shell", timeout=1)
    assert time.perf_counter() - started < 8
    assert r.timed_out and r.exit_code == 124
    assert "started" in r.output
    container = ex.backend.container  # type: ignore[attr-defined]
    assert block_processes(container) == []
    assert run(ex, "print('still here')").output == "still here\n"


def test_leftover_children_are_killed_after_a_normal_exit(ex: CommandLineExecutor) -> None:
    r = run(ex, "(sleep 300 &)\nnohup sleep 301 >/dev/null 2>&1 &\necho done", "shell")
    assert r.ok and r.output == "done\n"
    assert block_processes(ex.backend.container) == []  # type: ignore[attr-defined]


def test_network_access_fails_cleanly_with_network_off(ex: CommandLineExecutor) -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('no network:', exc.errno)\n"
        "print([n for _, n in socket.if_nameindex()])\n"
    )
    started = time.perf_counter()
    r = run(ex, code)
    assert time.perf_counter() - started < 10
    assert r.ok and "no network" in r.output and "connected" not in r.output
    assert "['lo']" in r.output  # only the loopback interface exists


def test_kill_9_pid_1_does_not_break_the_executor(ex: CommandLineExecutor) -> None:
    container = ex.backend.container  # type: ignore[attr-defined]
    r = run(ex, "kill -9 1; echo after-kill", "shell")
    assert "after-kill" in r.output
    assert run(ex, "print('alive')").output == "alive\n"
    assert ex.backend.container.id == container.id  # type: ignore[attr-defined]


def test_sigterm_to_pid_1_from_inside_is_ignored(ex: CommandLineExecutor) -> None:
    container = ex.backend.container  # type: ignore[attr-defined]
    run(ex, "kill -TERM 1; kill -INT 1", "shell")
    assert run(ex, "print('same container')").output == "same container\n"
    assert ex.backend.container.id == container.id  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["killed", "removed"])
def test_a_container_killed_or_removed_from_outside_is_replaced_and_the_block_says_so(
    ex: CommandLineExecutor, how: str
) -> None:
    old = ex.backend.container  # type: ignore[attr-defined]
    if how == "killed":
        old.kill()
    else:
        old.remove(force=True)
    r = run(ex, "print('fresh container')")
    new = ex.backend.container  # type: ignore[attr-defined]
    assert r.ok and r.stdout == "fresh container\n"
    assert new.id != old.id
    word = "exited" if how == "killed" else "removed from outside"
    assert f"the container {old.short_id} was" in r.stderr and word in r.stderr, r.stderr
    assert new.short_id in r.stderr
    assert run(ex, "print('next')").output == "next\n"  # said once, not on every block


@pytest.mark.slow
def test_fork_bomb_is_held_by_the_pids_limit(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    backend = DockerCommand(pids_limit=64)
    count = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print('forks:', n, 'then', exc.strerror)\n"
    )
    with CommandLineExecutor(backend=backend, work_dir=tmp_path, timeout=20) as ex:
        r = ex.execute(count)
        forks = int(r.output.split()[1])
        assert 0 < forks < 64 and "Resource temporarily unavailable" in r.output
        started = time.perf_counter()
        ex.execute("bomb() { bomb | bomb & }; bomb; sleep 2", "shell", timeout=5)
        assert time.perf_counter() - started < 30
        after = ex.execute("print('survived')")
        assert after.output == "survived\n"
        assert block_processes(backend.container) == []


@pytest.mark.slow
def test_memory_limit_kills_the_block_and_says_so(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    with CommandLineExecutor(
        backend=DockerCommand(memory="128m"), work_dir=tmp_path, timeout=30
    ) as ex:
        r = ex.execute("x = bytearray(512 * 1024 * 1024)\nprint('allocated')")
        assert not r.ok and "allocated" not in r.output
        assert "out of memory" in r.output
        assert ex.execute("print('recovered')").output == "recovered\n"


def test_read_only_root_blocks_writes_outside_workspace(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    code = (
        "for path in ['/etc/kx-test', '/usr/kx-test', '/workspace/ok.txt', '/tmp/ok.txt']:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print(path, 'written')\n"
        "    except OSError as exc:\n"
        "        print(path, 'refused', exc.strerror)\n"
    )
    with CommandLineExecutor(
        backend=DockerCommand(read_only=True), work_dir=tmp_path, timeout=30
    ) as ex:
        r = ex.execute(code)
    lines = r.output.splitlines()
    assert lines[0] == "/etc/kx-test refused Read-only file system"
    assert lines[1] == "/usr/kx-test refused Read-only file system"
    assert lines[2:] == ["/workspace/ok.txt written", "/tmp/ok.txt written"]
    assert (tmp_path / "ok.txt").read_text() == "x"


def test_two_executors_share_a_work_dir(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    code = "import time\nopen('from-' + NAME + '.txt', 'w').write(NAME)\ntime.sleep(1)\nprint(NAME)"
    with (
        CommandLineExecutor(backend=DockerCommand(), work_dir=tmp_path) as a,
        CommandLineExecutor(backend=DockerCommand(), work_dir=tmp_path) as b,
    ):
        assert a.backend.container.id != b.backend.container.id  # type: ignore[attr-defined]
        results: dict[str, ExecutionResult] = {}

        def go(name: str, ex: CommandLineExecutor) -> None:
            results[name] = ex.execute(code.replace("NAME", repr(name)))

        threads = [threading.Thread(target=go, args=x) for x in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results["a"].output == "a\n" and results["b"].output == "b\n"
        assert (tmp_path / "from-a.txt").read_text() == "a"
        assert (tmp_path / "from-b.txt").read_text() == "b"
        a.close()
        assert (
            b.execute(
                "print(sorted(p for p in __import__('os').listdir() if p.startswith('from')))"
            ).output
            == "['from-a.txt', 'from-b.txt']\n"
        )


def test_fresh_container_per_block(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    backend = DockerCommand(fresh_container=True)
    with CommandLineExecutor(backend=backend, work_dir=tmp_path) as ex:
        first = ex.execute("import socket; open('/tmp/mark', 'w'); print(socket.gethostname())")
        second = ex.execute(
            "import os, socket; print(os.path.exists('/tmp/mark'), socket.gethostname())"
        )
        assert first.ok and second.ok
        assert second.output.split()[0] == "False"
        assert first.output.strip() != second.output.split()[1]  # two containers
        assert containers_of(docker_client, backend.session) == []  # each removed after its block


def test_close_is_fast_and_removes_the_container(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    backend = DockerCommand()
    ex = CommandLineExecutor(backend=backend, work_dir=tmp_path)
    ex.start()
    assert len(containers_of(docker_client, backend.session)) == 1
    check_close_is_fast(docker_client, ex, backend.session)


def test_engine_dying_mid_block_is_a_clear_error(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    def open_session(base_url: str) -> tuple[CommandLineExecutor, str]:
        backend = DockerCommand(base_url=base_url, api_timeout=10)
        ex = CommandLineExecutor(backend=backend, work_dir=tmp_path / "work", timeout=60)
        return ex, backend.session

    block = "import time\nprint('working', flush=True)\ntime.sleep(50)"
    check_engine_dying_mid_block(docker_client, tmp_path, open_session, block)


def test_any_unprivileged_uid_works(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    """A caller whose uid has no entry in the image's /etc/passwd (the usual non-root case)."""
    backend = DockerCommand(user="4321:4321")
    with CommandLineExecutor(backend=backend, work_dir=tmp_path) as ex:
        r = ex.execute(
            "import os; open('mine.txt', 'w').write('x'); print(os.getuid(), os.getcwd())"
        )
    assert r.output == "4321 /workspace\n"
    assert (tmp_path / "mine.txt").stat().st_uid == 4321


@pytest.mark.parametrize(
    ("code", "lang", "name"),
    [
        ("import ctypes\nctypes.string_at(0)", "python", "SIGSEGV"),
        ("kill -9 $$", "shell", "SIGKILL"),
    ],
)
def test_a_block_killed_by_a_signal_names_it_as_the_local_back_end_does(
    ex: CommandLineExecutor, code: str, lang: str, name: str
) -> None:
    r = run(ex, code, lang)
    number = {"SIGSEGV": 11, "SIGKILL": 9}[name]
    assert r.exit_code == 128 + number
    assert f"killed by signal {name}" in r.output
    assert r.error is not None and r.error.ename == "Killed"


def test_an_exit_status_above_128_stays_an_exit_status(ex: CommandLineExecutor) -> None:
    r = run(ex, "import sys; sys.exit(139)")
    assert r.exit_code == 139 and "signal" not in r.output


@pytest.mark.usefixtures("docker_client")  # no engine or image: skipped with the reason
def test_plt_show_saves_figures_in_the_container(tmp_path: Path) -> None:
    from kernelexec import make_executor

    with make_executor("docker-command", work_dir=tmp_path, timeout=60, charts=False) as ex:
        r = ex.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    assert r.output == "[image/png saved to outputs/cell1-1.png]\n", r.output
    assert (tmp_path / "outputs" / "cell1-1.png").read_bytes().startswith(b"\x89PNG")


def test_stdout_keeps_carriage_returns_output_shows_the_terminal_view(
    ex: CommandLineExecutor,
) -> None:
    result = run(ex, "print('a\\rb'); import sys; _ = sys.stdout.write('12%\\r50%\\r100%\\n')")
    assert result.stdout == "a\rb\n12%\r50%\r100%\n"  # as written
    assert result.output == "b\n100%\n"  # as kernels show it
