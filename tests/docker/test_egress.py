"""The egress allowlist on both Docker back ends, under runc and gVisor (loopback only).

A package index (``http.server`` on the host's 127.0.0.1, serving a wheel the test builds) is in
the allowlist; a second listener is not. Inside each (back end, runtime) pair ``pip install``
from the index works, and the other listener, an IP literal, the cloud metadata address and a
DNS lookup all fail, each in the block's ``network_log`` and its refusals in ``output``. One
executor per pair, shared by its cases (each case reads only its own block's log).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from kx_docker_helpers import require_runtime

from kernelexec import NetworkPolicy, make_executor

pytestmark = [pytest.mark.docker]

_MARKS: dict[str, list[Any]] = {"runc": [], "runsc": [pytest.mark.gvisor]}
PAIRS = [
    pytest.param((kind, runtime), id=f"{kind}-{runtime}", marks=_MARKS[runtime])
    for runtime in ("runc", "runsc")
    for kind in ("docker-command", "docker-kernel")
]
PACKAGE = "kxegressdemo"
#: what the code tries besides the allowed index (@PORT@: the other listener's)
ESCAPES = (
    "import socket, urllib.request\n"
    "for url in ['http://127.0.0.1:@PORT@/', 'http://10.20.30.40/',"
    " 'http://169.254.169.254/latest/meta-data/']:\n"
    "    try:\n"
    "        urllib.request.urlopen(url, timeout=30)\n"
    "        print('REACHED', url)\n"
    "    except Exception as exc:\n"
    "        print('failed', url, exc)\n"
    "try:\n"
    "    socket.getaddrinfo('exfil-kx.example.org', 80)\n"
    "    print('RESOLVED')\n"
    "except OSError as exc:\n"
    "    print('no dns', exc)\n"
    "try:\n"  # no route at all but the proxy: a direct connection has nowhere to go
    "    socket.create_connection(('10.20.30.40', 80), timeout=5)\n"
    "    print('DIRECT')\n"
    "except OSError as exc:\n"
    "    print('no direct', exc)\n"
)


def _wheel(folder: Path) -> Path:
    """A pure-Python wheel built by hand (no build tools, no network)."""
    name = f"{PACKAGE}-1.0-py3-none-any.whl"
    files = {
        f"{PACKAGE}.py": b"ANSWER = 42\n",
        f"{PACKAGE}-1.0.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n".encode()
        ),
        f"{PACKAGE}-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: kx-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{PACKAGE}-1.0.dist-info/RECORD,,")
    files[f"{PACKAGE}-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(folder / name, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return folder / name


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def _serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = lambda *a, **k: _Quiet(*a, directory=str(folder), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """(the allowed index's port, the other listener's port), both on 127.0.0.1."""
    root = tmp_path_factory.mktemp("index")
    project = root / "simple" / PACKAGE
    project.mkdir(parents=True)
    wheel = _wheel(project)
    (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    (root / "other").mkdir()
    (root / "other" / "index.html").write_text("not for the code\n")
    allowed, allowed_port = _serve(root)
    other, other_port = _serve(root / "other")
    yield allowed_port, other_port
    for server in (allowed, other):
        server.shutdown()
        server.server_close()


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
    install = (
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--index-url',"
        f" 'http://127.0.0.1:{index[0]}/simple', '{PACKAGE}'], capture_output=True, text=True)\n"
        "print('pip exit', r.returncode, r.stderr[-2000:])\n"
    )
    result = executor.execute(install)
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
