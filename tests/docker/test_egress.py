"""The egress allowlist on both Docker back ends, under runc and gVisor (loopback only).

A package index (``http.server`` on the host's 127.0.0.1, serving a wheel the test builds) is in
the allowlist; a second listener is not. Inside each (back end, runtime) pair ``pip install``
from the index works, and the other listener, an IP literal, the cloud metadata address and a
DNS lookup all fail, each in the block's ``network_log`` and its refusals in ``output``. One
executor per pair, shared by its cases (each case reads only its own block's log).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import docker
import pytest
from kx_docker_helpers import require_runtime
from kx_egress import ESCAPES, PACKAGE, install_code, served_index

from kernelexec import NetworkPolicy, make_executor

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with served_index(tmp_path_factory.mktemp("index")) as ports:
        yield ports


_MARKS: dict[str, list[Any]] = {"runc": [], "runsc": [pytest.mark.gvisor]}
PAIRS = [
    pytest.param((kind, runtime), id=f"{kind}-{runtime}", marks=_MARKS[runtime])
    for runtime in ("runc", "runsc")
    for kind in ("docker-command", "docker-kernel")
]


@pytest.fixture(scope="module", params=PAIRS)
def executor(
    request: pytest.FixtureRequest,
    docker_client: docker.DockerClient,
    index: tuple[int, int],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    kind, runtime = request.param
    require_runtime(docker_client, runtime)
    policy = NetworkPolicy(allow=[f"127.0.0.1:{index[0]}"])
    runtime_option = None if runtime == "runc" else runtime
    work = tmp_path_factory.mktemp(f"egress-{kind}-{runtime}")
    with make_executor(
        kind, work_dir=work, timeout=90, network=policy, runtime=runtime_option
    ) as ex:
        yield ex


def test_pip_installs_from_the_allowed_index(executor: Any, index: tuple[int, int]) -> None:
    result = executor.execute(install_code(index[0]))
    assert "pip exit 0" in result.output, result.output
    allowed = [e for e in result.network_log if e.allowed]
    assert allowed and all(e.port == index[0] for e in allowed), result.network_log
    assert sum(e.bytes_down for e in allowed) > 500  # the page and the wheel came through
    used = executor.execute(f"import {PACKAGE}; print('answer', {PACKAGE}.ANSWER)")
    assert "answer 42" in used.output, used.output


def test_everything_else_fails_and_is_logged(executor: Any, index: tuple[int, int]) -> None:
    code = ESCAPES.replace("@PORT@", str(index[1]))
    result = executor.execute(code)
    assert "REACHED" not in result.output and "RESOLVED" not in result.output, result.output
    assert "DIRECT" not in result.output and "no dns" in result.output, result.output
    refused = {(e.host, e.port) for e in result.network_log if not e.allowed}
    assert ("127.0.0.1", index[1]) in refused, result.network_log
    assert ("10.20.30.40", 80) in refused and ("169.254.169.254", 80) in refused
    assert ("exfil-kx.example.org", 53) in refused
    assert not any(e.allowed for e in result.network_log)
    assert "the network policy refused" in result.output
    assert "169.254.169.254:80 refused" in result.output


def test_a_dead_proxy_is_said_and_restarted(executor: Any, index: tuple[int, int]) -> None:
    egress = executor.aio.backend._docker.egress
    egress.proxy.stop()  # the proxy dies mid-session
    url = f"http://127.0.0.1:{index[0]}/simple/{PACKAGE}/"
    fetch = f"import urllib.request\nprint(urllib.request.urlopen({url!r}, timeout=30).status)\n"
    down = executor.execute(fetch)
    assert down.exit_code != 0
    assert any("egress proxy was not running" in e.reason for e in down.network_log), down
    assert "egress proxy was not running" in down.output
    assert egress.proxy.alive and egress.restarts == 1  # restarted after that block
    again = executor.execute(fetch)
    assert again.exit_code == 0 and "200" in again.output, again.output


def test_the_cli_allows_a_host(docker_client: docker.DockerClient, index: tuple[int, int]) -> None:
    import subprocess
    import sys

    url = f"http://127.0.0.1:{index[0]}/simple/{PACKAGE}/"
    message = (
        f"```python\nimport urllib.request\nprint(urllib.request.urlopen({url!r}).status)\n```\n"
    )
    argv = ["run", "-", "--executor", "docker-command", "--allow", f"127.0.0.1:{index[0]}"]
    proc = subprocess.run(
        [sys.executable, "-m", "kernelexec", *argv, "--json"],
        input=message,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "200" in proc.stdout and '"network_log"' in proc.stdout, proc.stdout


def test_packages_install_at_start_and_their_index_stays_closed(
    docker_client: docker.DockerClient,
    index: tuple[int, int],
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"http://127.0.0.1:{index[0]}/simple"
    monkeypatch.setenv("PIP_INDEX_URL", url)  # the host's pip's index
    monkeypatch.setenv("KERNELEXEC_WHEEL_CACHE", str(tmp_path / "cache"))
    policy = NetworkPolicy(allow=[], packages=[PACKAGE])
    with make_executor(
        "docker-command", work_dir=tmp_path / "one", timeout=90, network=policy
    ) as ex:
        used = ex.execute(f"import {PACKAGE}; print('answer', {PACKAGE}.ANSWER)")
        assert "answer 42" in used.output, used.output
        assert any(e.allowed and e.port == index[0] for e in used.network_log)  # the install's
        # Through the proxy (NO_PROXY lists loopback: no loopback address is allowed).
        fetch = (
            "import os, urllib.request as u\n"
            "os.environ['no_proxy'] = os.environ['NO_PROXY'] = ''\n"
            f"u.urlopen({url + '/'!r}, timeout=30)\n"
        )
        later = ex.execute(fetch)
        assert later.exit_code != 0 and "Forbidden" in later.output, later.output
        assert [e.allowed for e in later.network_log] == [False]
    # A second session installs from the host's wheel cache alone, shown read-only.
    with make_executor(
        "docker-command", work_dir=tmp_path / "two", timeout=90, network=policy
    ) as ex:
        attack = (
            "import os\n"
            "for name in ['planted.whl', os.listdir('/kernelexec-wheels')[0]]:\n"
            "    try:\n"
            "        open('/kernelexec-wheels/' + name, 'w').write('x')\n"
            "        print('WROTE', name)\n"
            "    except OSError as exc:\n"
            "        print('refused', exc.strerror)\n"
        )
        used = ex.execute(attack + f"import {PACKAGE}; print('answer', {PACKAGE}.ANSWER)")
        assert "answer 42" in used.output and "WROTE" not in used.output, used.output
        assert "Read-only file system" in used.output, used.output
        assert not any(e.port == index[0] for e in used.network_log), used.network_log


def test_the_code_cannot_stop_the_relay(executor: Any, index: tuple[int, int]) -> None:
    # The relay runs as a uid of its own: the code's signals (and kill -1) do not reach it.
    attack = (
        "import os, signal\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        if b'\\x003128\\x00' in open(f'/proc/{pid}/cmdline', 'rb').read():\n"
        "            os.kill(int(pid), signal.SIGKILL)\n"
        "            print('KILLED', pid)\n"
        "    except PermissionError:\n"
        "        print('refused', pid)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = executor.execute(attack)
    assert "KILLED" not in result.output and "refused" in result.output, result.output
    url = f"http://127.0.0.1:{index[0]}/simple/{PACKAGE}/"
    fetch = f"import urllib.request\nprint(urllib.request.urlopen({url!r}, timeout=30).status)\n"
    again = executor.execute(fetch)
    assert again.exit_code == 0 and "200" in again.output, again.output
