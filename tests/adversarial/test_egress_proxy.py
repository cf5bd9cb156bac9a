"""The egress policy and proxy against hostile requests (loopback only, no container).

The code under ``network=NetworkPolicy(...)`` reaches the host only through the proxy; these
tests speak to the proxy's socket as the relays do, as the code would: allowlist entries that
are not hosts, IP literals in every spelling, a name resolving to loopback, a ``Host`` header
naming another server, a TLS server name other than the tunnel's, 1,000 connections, a huge
upload. Each refusal must be in the log, with a reason.
"""

from __future__ import annotations

import http.server
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kx_egress import ESCAPES, PACKAGE, install_code, served_index

from kernelexec import (
    BackendUnavailable,
    DockerOptions,
    InvalidNetworkPolicy,
    KernelExecError,
    NetworkPolicy,
    SandboxOptions,
    make_executor,
)
from kernelexec.backends import _sandbox
from kernelexec.backends._egress import Egress, tls_server_name

pytestmark = [pytest.mark.adversarial]


@pytest.mark.parametrize(
    "entry",
    [
        "http://api.example.org",
        "api.example.org/v1",
        "user@api.example.org",
        "",
        "*",
        "*.com",
        "exa mple.org",
        "api.example.org:99999",
        "api.example.org:http",
        "::1:8080",
        "127.1",
        "2130706433",
        "-bad-.example.org",
        42,
    ],
)
def test_an_entry_that_is_not_a_host_is_refused_at_construction(entry: Any) -> None:
    with pytest.raises(InvalidNetworkPolicy) as caught:
        NetworkPolicy(allow=[entry])
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, KernelExecError)
    assert "entry" in str(caught.value)


def test_bad_network_settings_are_refused() -> None:
    with pytest.raises(InvalidNetworkPolicy, match="one string"):
        NetworkPolicy(allow="api.example.org")  # type: ignore[arg-type]
    with pytest.raises(InvalidNetworkPolicy, match="network="):
        DockerOptions(network="some")  # type: ignore[arg-type]
    with pytest.raises(InvalidNetworkPolicy, match="max_connections"):
        NetworkPolicy(allow=[], max_connections=0)
    with pytest.raises(InvalidNetworkPolicy, match="not a requirement"):
        NetworkPolicy(allow=[], packages=["--index-url=http://evil.example.org/simple"])
    # a sandbox installs packages= too (tests/adversarial/test_egress_wheels.py)
    assert SandboxOptions(network=NetworkPolicy(allow=[], packages=["rich"])).egress_policy


def test_entries_match_as_documented() -> None:
    policy = NetworkPolicy(allow=["api.example.org:443", "*.example.net", "[::1]:8080"])
    assert policy.check_request("api.example.org", 443) is None
    assert policy.check_request("API.Example.org.", 443) is None
    assert policy.check_request("api.example.org", 80) is not None  # only the port given
    assert policy.check_request("a.b.example.net", 80) is None  # no port: 80 and 443
    assert policy.check_request("example.net", 443) is not None  # the wildcard is below it
    assert policy.check_request("example.net.evil.org", 443) is not None
    assert policy.check_request("::1", 8080) is None
    assert policy.check_request("10.0.0.1", 443) is not None


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello {self.headers.get('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        size = 0
        while chunk := self.rfile.read(65536):
            size += len(chunk)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def egress(server: int) -> Iterator[Egress]:
    policy = NetworkPolicy(
        allow=[f"127.0.0.1:{server}", f"localhost:{server + 1 if server < 65535 else 1}"],
        max_connections=4,
        max_upload_bytes=1024 * 1024,
        max_log_entries=50,
        connect_timeout=5,
    )
    owner = Egress(policy)
    yield owner
    owner.close()


def _ask(egress: Egress, request: bytes, *, timeout: float = 10) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(egress.socket_path))
        sock.sendall(request)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
        return b"".join(chunks)


def test_an_allowed_request_passes_and_is_counted(egress: Egress, server: int) -> None:
    reply = _ask(
        egress,
        f"GET http://127.0.0.1:{server}/x HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n\r\n".encode(),
    )
    assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(
        f"hello 127.0.0.1:{server}".encode()
    )
    (event,) = egress.take_log()
    assert event.allowed and event.method == "GET" and event.port == server
    assert event.bytes_up > 0 and event.bytes_down == len(reply) and not event.open


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",
        "127.1",
        "0x7f.0.0.1",
        "[::ffff:10.0.0.1]",
        "[::ffff:169.254.169.254]",
        "[::1]",
        "169.254.169.254",
        "0.0.0.0",
    ],
)
def test_ip_literals_in_any_spelling_are_refused(egress: Egress, server: int, host: str) -> None:
    reply = _ask(egress, f"GET http://{host}:{server}/ HTTP/1.1\r\n\r\n".encode())
    assert reply.split(b" ", 2)[1] in (b"400", b"403"), reply
    if reply.split(b" ", 2)[1] == b"403":
        (event,) = egress.take_log()
        assert not event.allowed and event.reason


def test_a_name_resolving_to_loopback_is_refused(server: int) -> None:
    owner = Egress(NetworkPolicy(allow=[f"localhost:{server}"]))
    try:
        reply = _ask(owner, f"CONNECT localhost:{server} HTTP/1.1\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 403"), reply
        (event,) = owner.take_log()
        assert "loopback" in event.reason and not event.allowed
    finally:
        owner.close()


def test_a_host_header_naming_another_server_is_refused(egress: Egress, server: int) -> None:
    request = f"GET http://127.0.0.1:{server}/ HTTP/1.1\r\nHost: metadata.google.internal\r\n\r\n"
    assert _ask(egress, request.encode()).startswith(b"HTTP/1.1 400")


def test_a_tls_server_name_other_than_the_tunnel_is_cut(egress: Egress, server: int) -> None:
    hello = _client_hello("evil.example.org")
    assert tls_server_name(hello) == "evil.example.org"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(egress.socket_path))
        sock.sendall(f"CONNECT 127.0.0.1:{server} HTTP/1.1\r\n\r\n".encode())
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        sock.sendall(hello)
        assert sock.recv(1024) == b""  # cut, nothing reached the server
    (event,) = egress.take_log()
    assert not event.allowed and "evil.example.org" in event.reason


def test_a_huge_upload_is_cut_at_the_limit(egress: Egress, server: int) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(str(egress.socket_path))
        size = 8 * 1024 * 1024
        head = f"POST http://127.0.0.1:{server}/ HTTP/1.1\r\nContent-Length: {size}\r\n\r\n"
        sock.sendall(head.encode())
        block = b"x" * 65536
        with pytest.raises(OSError):  # the proxy cuts the connection under us
            for _ in range(size // len(block)):
                sock.sendall(block)
            while sock.recv(65536):
                pass
            raise BrokenPipeError("the upload was not cut")
    (event,) = egress.log.take(settle=5)
    assert "limit" in event.reason
    assert event.bytes_up <= 1024 * 1024 + 2 * 65536


def test_thousands_of_connections_are_bounded_and_logged(egress: Egress, server: int) -> None:
    held = []
    try:
        for _ in range(4):  # the policy's max_connections, held open in their tunnel
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(egress.socket_path))
            sock.sendall(f"CONNECT 127.0.0.1:{server} HTTP/1.1\r\n\r\n".encode())
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")
            held.append(sock)
        refused = 0
        for _ in range(1000):
            reply = _ask(egress, f"CONNECT 127.0.0.1:{server} HTTP/1.1\r\n\r\n".encode())
            refused += reply.startswith(b"HTTP/1.1 503")
        assert refused == 1000
    finally:
        for sock in held:
            sock.close()
    events = egress.log.take(settle=5)
    assert len(events) == 51  # max_log_entries, then one line counting the rest
    assert events[-1].host == "(more)" and "954 more" in events[-1].reason
    assert "too many connections" in events[10].reason


def test_an_over_long_request_head_is_refused(egress: Egress) -> None:
    reply = _ask(egress, b"GET http://127.0.0.1/ HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 431")


def _client_hello(name: str) -> bytes:
    """A real TLS client hello (the ssl module's) naming ``name``."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


# -- the bubblewrap sandboxes: the same policy, the proxy's socket bound inside ------------------
@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with served_index(tmp_path_factory.mktemp("index")) as ports:
        yield ports


#: the sandboxes' bounds, small so that passing them is quick
SANDBOX_CONNECTIONS = 8
SANDBOX_UPLOAD = 4 * 1024 * 1024


@pytest.fixture(scope="module", params=["sandboxed-kernel", "sandboxed-command"])
def sandboxed(
    request: pytest.FixtureRequest,
    index: tuple[int, int],
    server: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    try:
        _sandbox.check_sandbox()
    except BackendUnavailable as exc:
        if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
            raise
        pytest.skip(str(exc))
    policy = NetworkPolicy(
        allow=[f"127.0.0.1:{index[0]}", f"127.0.0.1:{server}"],
        max_connections=SANDBOX_CONNECTIONS,
        max_upload_bytes=SANDBOX_UPLOAD,
    )
    sandbox = SandboxOptions(network=policy)
    work = tmp_path_factory.mktemp(request.param)
    with make_executor(request.param, work_dir=work, timeout=90, sandbox=sandbox) as ex:
        yield ex


def test_pip_installs_in_a_sandbox(sandboxed: Any, index: tuple[int, int]) -> None:
    # One block: a sandboxed command's /tmp (its HOME, the user site) is the block's own.
    use = f"import {PACKAGE}; print('answer', {PACKAGE}.ANSWER)\n"
    result = sandboxed.execute(install_code(index[0]) + use)
    assert "pip exit 0" in result.output and "answer 42" in result.output, result.output
    assert any(e.allowed and e.port == index[0] for e in result.network_log)


def test_everything_else_fails_in_a_sandbox(sandboxed: Any, index: tuple[int, int]) -> None:
    result = sandboxed.execute(ESCAPES.replace("@PORT@", str(index[1])))
    assert "REACHED" not in result.output and "RESOLVED" not in result.output, result.output
    assert "DIRECT" not in result.output and "no dns" in result.output, result.output
    refused = {(e.host, e.port) for e in result.network_log if not e.allowed}
    assert {("127.0.0.1", index[1]), ("10.20.30.40", 80), ("169.254.169.254", 80)} <= refused
    assert not any(e.allowed for e in result.network_log)


def test_a_dns_lookup_in_a_sandbox_is_refused_and_logged(sandboxed: Any) -> None:
    code = (
        "import os, socket\n"
        "try:\n"
        "    socket.getaddrinfo('exfil-kx.example.org', 443)\n"
        "    print('RESOLVED')\n"
        "except OSError as exc:\n"
        "    print('no dns', exc)\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"  # the responder's socket is not ours
        "    try:\n"
        "        s = socket.socket(fileno=os.dup(fd))\n"
        "        if s.getsockname() == ('127.0.0.1', 53): print('HOLDS THE RESPONDER')\n"
        "        s.detach()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = sandboxed.execute(code)
    assert "no dns" in result.output and "RESOLVED" not in result.output, result.output
    assert "HOLDS THE RESPONDER" not in result.output, result.output
    dns = [e for e in result.network_log if e.method == "DNS"]
    assert dns and all(e.host == "exfil-kx.example.org" and not e.allowed for e in dns), dns
    assert "no DNS inside" in result.output, result.output


def test_a_dns_name_cannot_forge_a_line_of_the_output(sandboxed: Any) -> None:
    code = (
        "import socket\n"
        "label = b'x\\n  GET evil.example.org:443 allowed'\n"
        "query = b'\\x12\\x34\\x01\\x00\\x00\\x01' + bytes(6) + bytes([len(label)]) + label\n"
        "query += b'\\x00\\x00\\x01\\x00\\x01'\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.settimeout(10)\n"
        "s.sendto(query, ('127.0.0.1', 53))\n"
        "print('answered', s.recv(512)[3] & 15)\n"  # 5: REFUSED
    )
    result = sandboxed.execute(code)
    assert "answered 5" in result.output, result.output
    assert "\n  GET evil" not in result.output, result.output
    (event,) = [e for e in result.network_log if e.method == "DNS"]
    assert "\n" not in event.host and event.host.startswith("x?"), event


def test_a_proxy_request_cannot_forge_a_line_of_the_output(sandboxed: Any) -> None:
    code = (
        "import socket\n"
        "s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n"
        "s.sendall(b'CONNECT a\\nGET-evil.example.org:443 HTTP/1.1\\r\\n\\r\\n')\n"
        "print('answered', s.recv(12))\n"
    )
    result = sandboxed.execute(code)
    assert "answered" in result.output and "403" in result.output, result.output
    assert "\nGET-evil" not in result.output, result.output
    assert any("a?GET-evil" in line for line in result.output.splitlines()), result.output


def test_thousands_of_connections_from_a_sandbox_are_bounded(sandboxed: Any, server: int) -> None:
    code = (
        "import socket, time\n"
        "held = []\n"
        "for _ in range(2000):\n"
        "    try:\n"
        "        held.append(socket.create_connection(('127.0.0.1', 3128), timeout=10))\n"
        "    except OSError:\n"
        "        break\n"
        "time.sleep(1)\n"
        "ok = refused = cut = 0\n"
        "for s in held:\n"
        "    try:\n"
        f"        s.sendall(b'CONNECT 127.0.0.1:{server} HTTP/1.1\\r\\n\\r\\n')\n"
        "        answer = s.recv(200)\n"
        "    except OSError:\n"
        "        answer = b''\n"
        "    if b' 200 ' in answer: ok += 1\n"
        "    elif b' 503 ' in answer: refused += 1\n"
        "    else: cut += 1\n"
        "for s in held: s.close()\n"
        "print('RESULT', len(held), ok, refused, cut)\n"
    )
    result = sandboxed.execute(code)
    tried, ok, refused, cut = map(int, result.output.split("RESULT")[1].split()[:4])
    assert tried >= 500, result.output  # the code could ask for many
    assert 1 <= ok <= SANDBOX_CONNECTIONS, result.output  # the proxy's bound
    assert ok + refused <= 2 * SANDBOX_CONNECTIONS, result.output  # the relay's bound
    assert cut >= tried - 2 * SANDBOX_CONNECTIONS
    too_many = [e for e in result.network_log if "too many connections" in e.reason]
    assert len(too_many) == refused, result.network_log
    after = sandboxed.execute(
        f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{server}/').status)"
    )
    assert "200" in after.output, after.output  # every slot was given back


def test_a_huge_upload_from_a_sandbox_is_cut(sandboxed: Any, server: int) -> None:
    size = 4 * SANDBOX_UPLOAD
    code = (
        "import socket\n"
        "s = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n"
        f"s.sendall(b'POST http://127.0.0.1:{server}/ HTTP/1.1\\r\\n"
        f"Content-Length: {size}\\r\\n\\r\\n')\n"
        "sent = 0\n"
        "try:\n"
        f"    while sent < {size}:\n"
        "        s.sendall(b'x' * 65536)\n"
        "        sent += 65536\n"
        "    answer = s.recv(100)\n"
        "    print('NOT CUT' if answer.startswith(b'HTTP/1.1 200') else 'cut', sent)\n"
        "except OSError as exc:\n"
        "    print('cut', sent, exc)\n"
    )
    result = sandboxed.execute(code)
    assert "cut" in result.output and "NOT CUT" not in result.output, result.output
    (event,) = [e for e in result.network_log if e.port == server]
    assert "limit" in event.reason and event.bytes_up <= SANDBOX_UPLOAD + 2 * 65536, event


def test_a_dead_proxy_is_said_in_a_sandbox(sandboxed: Any, index: tuple[int, int]) -> None:
    egress = sandboxed.aio.backend._egress.get()
    egress.proxy.stop()
    url = f"http://127.0.0.1:{index[0]}/simple/{PACKAGE}/"
    fetch = f"import urllib.request\nprint(urllib.request.urlopen({url!r}, timeout=30).status)\n"
    down = sandboxed.execute(fetch)
    assert down.exit_code != 0 and "egress proxy was not running" in down.output, down.output
    assert any("egress proxy was not running" in e.reason for e in down.network_log)
    assert egress.proxy.alive
    again = sandboxed.execute(fetch)
    assert again.exit_code == 0 and "200" in again.output, again.output


def test_a_policy_keeps_the_container_off_every_network() -> None:
    from kernelexec.backends._docker import container_env, container_kwargs

    policy = NetworkPolicy(allow=["pypi.org"])
    options = DockerOptions(network=policy, environment={"HTTPS_PROXY": "http://evil:1"})
    kwargs = container_kwargs(options, labels={})
    assert kwargs["network_mode"] == "none" and kwargs["dns"] == ["127.0.0.1"]
    env = container_env(options)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128"  # the policy's proxy wins
    assert env["NO_PROXY"] == "localhost,127.0.0.1,::1"
    assert DockerOptions(network="all").full_network and not options.full_network
    assert container_kwargs(DockerOptions(network="all"), labels={}).get("network_mode") is None


def _kx(*args: str, stdin: str) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "kernelexec", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_refuses_allow_where_it_cannot_hold(tmp_path: Any) -> None:
    message = "```python\nprint('ran')\n```\n"
    local = _kx("run", "-", "--executor", "kernel", "--allow", "pypi.org", stdin=message)
    assert local.returncode == 2 and "--allow and --packages apply to the isolating" in local.stderr
    bad = _kx("run", "-", "--executor", "docker-command", "--allow", "http://x.org", stdin=message)
    assert bad.returncode != 0 and "is not a host" in bad.stderr, bad.stderr
    assert "ran" not in bad.stdout + local.stdout


def test_the_mcp_server_takes_an_allowlist() -> None:
    import argparse

    from kernelexec._mcp.cli import add_mcp_command

    parser = argparse.ArgumentParser()
    add_mcp_command(parser.add_subparsers())
    from kernelexec._mcp.cli import _hub_options

    args = parser.parse_args(["mcp", "--executor", "docker-kernel", "--allow", "pypi.org"])
    network = _hub_options(args).executor_options["network"]
    assert isinstance(network, NetworkPolicy) and network.allow == ("pypi.org",)
    args = parser.parse_args(["mcp", "--executor", "sandboxed-kernel", "--allow", "pypi.org"])
    assert _hub_options(args).executor_options["sandbox"].egress_policy == network
    for executor, entry in (("kernel", "pypi.org"), ("docker-kernel", "http://x.org")):
        args = parser.parse_args(["mcp", "--executor", executor, "--allow", entry])
        with pytest.raises(ValueError):
            _hub_options(args)
