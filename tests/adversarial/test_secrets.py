"""Secrets the code never sees (``NetworkPolicy(secrets=...)``), loopback only.

The proxy is spoken to on its socket as the relays do (the code's view), and once end to end in
the sandboxed kernel: a placeholder in the code's environment, the value in the headers that the
secret's own HTTPS server receives (TLS terminated with the session CA), the placeholder left as
it is for an allowed host that does not carry the secret (and logged as withheld), an echo of
the value masked, and the value nowhere in the output, the notebook or the work dir. Attacks: a
malformed CONNECT, a secret host whose certificate does not verify, a huge header in the tunnel.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from kx_secrets import NAME, VALUE, World, check_end_to_end, client_code, served

from kernelexec import (
    BackendUnavailable,
    InvalidNetworkPolicy,
    InvalidSecret,
    KernelExecError,
    NetworkPolicy,
    SandboxOptions,
    Secret,
    make_executor,
)
from kernelexec.backends import _sandbox
from kernelexec.backends._egress import Egress
from kernelexec.backends._secrets import Redactor

pytestmark = [pytest.mark.adversarial]


# -- construction ---------------------------------------------------------------------------------
def test_a_secret_never_shows_its_value() -> None:
    secret = Secret(VALUE, hosts=["api.example.org"])
    policy = NetworkPolicy(allow=["api.example.org:443"], secrets={NAME: secret})
    for text in (repr(secret), str(secret), repr(policy), str(policy)):
        assert VALUE not in text and "api.example.org" in text


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Secret("", hosts=["a.example.org"]), "non-empty"),
        (lambda: Secret("a\r\nX-Evil: 1", hosts=["a.example.org"]), "printable"),
        (lambda: Secret("v", hosts=[]), "list of hosts"),
        (lambda: Secret("v", hosts="a.example.org"), "list of hosts"),
        (lambda: Secret("v", hosts=["http://a.example.org"]), "not a host"),
        (lambda: _policy("1BAD", ["a.example.org"]), "not an environment variable"),
        (lambda: _policy("HTTPS_PROXY", ["a.example.org"]), "kernelexec sets itself"),
        (lambda: _policy("KEY", ["b.example.org"]), "does not allow"),
        (lambda: _policy("KEY", ["a.example.org:8443"]), "does not allow"),
        (lambda: _policy("KEY", ["*.example.org"]), "does not allow"),
    ],
)
def test_bad_secrets_are_refused_at_construction(make: Any, words: str) -> None:
    with pytest.raises(InvalidSecret, match=words) as caught:
        make()
    assert isinstance(caught.value, InvalidNetworkPolicy) and isinstance(caught.value, ValueError)
    assert isinstance(caught.value, KernelExecError) and VALUE not in str(caught.value)


def _policy(name: str, hosts: list[str]) -> NetworkPolicy:
    return NetworkPolicy(allow=["a.example.org:443"], secrets={name: Secret(VALUE, hosts=hosts)})


def test_a_masked_echo_is_found_across_pieces() -> None:
    redactor = Redactor([b"secret-value"])
    stream = b"a secret-value b secr" + b"et-value c"
    out = b"".join(redactor.feed(stream[i : i + 3]) for i in range(0, len(stream), 3))
    out += redactor.flush()
    assert out == b"a ************ b ************ c" and redactor.hits == 2


# -- the proxy, spoken to as the code would ------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with served(tmp_path_factory.mktemp("secrets-world")) as w:
        yield w


PLAIN = "PLAIN_KEY"
PLAIN_VALUE = "plain-kxtest-value-42"


@pytest.fixture(scope="module")
def egress(world: World) -> Iterator[Egress]:
    ports = (world.secret_port, world.plain_port, world.untrusted_port)
    policy = NetworkPolicy(
        allow=[f"127.0.0.1:{p}" for p in ports],
        secrets={
            NAME: Secret(VALUE, hosts=[f"127.0.0.1:{world.secret_port}"]),
            PLAIN: Secret(PLAIN_VALUE, hosts=[f"127.0.0.1:{world.plain_port}"]),
        },
        upstream_ca=str(world.ca_file),
        connect_timeout=5,
    )
    owner = Egress(policy)
    yield owner
    owner.close()


def _unix(egress: Egress) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(15)
    sock.connect(str(egress.socket_path))
    return sock


def _read_all(sock: Any) -> bytes:
    chunks = []
    try:
        while data := sock.recv(65536):
            chunks.append(data)
    except (ssl.SSLError, ConnectionError):
        pass
    return b"".join(chunks)


def _tunnel(egress: Egress, port: int, trust: str | None) -> ssl.SSLSocket:
    """A CONNECT to 127.0.0.1:``port`` and TLS over it, trusting ``trust`` (None: anything)."""
    sock = _unix(egress)
    sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    if trust is None:
        context = ssl._create_unverified_context()
    else:
        context = ssl.create_default_context(cafile=trust)
    return context.wrap_socket(sock, server_hostname="127.0.0.1")


def _get(placeholder: str, host: str, extra: str = "") -> bytes:
    return (
        f"GET /headers?k={placeholder} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {placeholder}\r\n{extra}\r\n"
    ).encode()


def test_tls_to_the_secret_host_carries_the_value(egress: Egress, world: World) -> None:
    assert egress.secrets is not None and egress.bundle_path is not None
    placeholder = egress.secrets.placeholders[NAME]
    assert placeholder.startswith(f"kx-secret-{NAME}-") and VALUE not in placeholder
    egress.log.take(settle=0)
    with _tunnel(egress, world.secret_port, str(egress.bundle_path)) as tls:
        issuer = dict(x[0] for x in tls.getpeercert()["issuer"])  # the session CA's, not the test's
        tls.sendall(_get(placeholder, f"127.0.0.1:{world.secret_port}"))
        answer = _read_all(tls)
    assert issuer["commonName"].startswith("kernelexec session CA")
    seen = world.seen[-1]
    assert seen["Authorization"] == f"Bearer {VALUE}" and seen["path"] == f"/headers?k={VALUE}"
    assert answer.startswith(b"HTTP/1.0 200") and VALUE.encode() not in answer  # the echo masked
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["Authorization"] == "Bearer " + "*" * len(VALUE)
    [event] = egress.log.take()
    assert event.allowed and event.secrets_sent == (NAME,) and event.secrets_withheld == ()


def test_a_placeholder_sent_elsewhere_is_withheld(egress: Egress, world: World) -> None:
    assert egress.secrets is not None
    mine, other = egress.secrets.placeholders[PLAIN], egress.secrets.placeholders[NAME]
    egress.log.take(settle=0)
    with _unix(egress) as sock:  # plain HTTP to the plain host, which carries PLAIN_KEY only
        head = _get(mine, f"127.0.0.1:{world.plain_port}", f"X-Other: {other}\r\n").decode()
        sock.sendall(head.replace("GET /", f"GET http://127.0.0.1:{world.plain_port}/").encode())
        answer = _read_all(sock)
    seen = world.seen[-1]
    assert seen["Authorization"] == f"Bearer {PLAIN_VALUE}" and seen["X-Other"] == other
    assert VALUE not in json.dumps(seen) and PLAIN_VALUE.encode() not in answer
    [event] = egress.log.take()
    assert event.secrets_sent == (PLAIN,) and event.secrets_withheld == (NAME,)
    assert "secret_withheld: OPENAI_API_KEY" in event.describe()


def test_other_tls_stays_a_blind_tunnel(world: World) -> None:
    # The untrusted server carries no secret here: its own certificate reaches the client.
    policy = NetworkPolicy(
        allow=[f"127.0.0.1:{world.secret_port}", f"127.0.0.1:{world.untrusted_port}"],
        secrets={NAME: Secret(VALUE, hosts=[f"127.0.0.1:{world.secret_port}"])},
    )
    owner = Egress(policy)
    try:
        with _tunnel(owner, world.untrusted_port, None) as tls:
            der = tls.getpeercert(binary_form=True)
        owner.log.take(settle=5)  # the tunnel ended before the proxy stops
        rogue = ssl.PEM_cert_to_DER_cert((world.ca_file.parent / "bad.crt").read_text())
        assert der == rogue
    finally:
        owner.close()


def test_a_secret_host_with_a_bad_certificate_is_refused(world: World) -> None:
    port = world.untrusted_port
    policy = NetworkPolicy(
        allow=[f"127.0.0.1:{port}"], secrets={NAME: Secret(VALUE, hosts=[f"127.0.0.1:{port}"])}
    )
    owner = Egress(policy)
    try:
        count = len(world.seen)
        with _unix(owner) as sock:
            sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 502") and b"failed TLS verification" in answer
        [event] = owner.log.take()
        assert not event.allowed and "certificate verify failed" in event.reason
        assert len(world.seen) == count  # no request reached it
    finally:
        owner.close()


@pytest.mark.parametrize(
    "request_line",
    [b"CONNECT 127.0.0.1 HTTP/1.1", b"CONNECT :443 HTTP/1.1", b"CONNECT [::1 HTTP/1.1"],
)
def test_a_malformed_connect_is_refused(egress: Egress, request_line: bytes) -> None:
    with _unix(egress) as sock:
        sock.sendall(request_line + b"\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 400")


def test_garbage_in_a_terminated_tunnel_is_cut_and_logged(egress: Egress, world: World) -> None:
    egress.log.take(settle=0)
    with _unix(egress) as sock:
        sock.sendall(f"CONNECT 127.0.0.1:{world.secret_port} HTTP/1.1\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # plain HTTP, no TLS client hello
        answer = _read_all(sock)
    assert VALUE.encode() not in answer
    [event] = egress.log.take()
    assert not event.allowed and "did not accept kernelexec's session CA" in event.reason


def test_a_huge_header_in_the_tunnel_is_refused(egress: Egress, world: World) -> None:
    assert egress.secrets is not None and egress.bundle_path is not None
    placeholder = egress.secrets.placeholders[NAME]
    count = len(world.seen)
    with _tunnel(egress, world.secret_port, str(egress.bundle_path)) as tls:
        huge = _get(placeholder, "127.0.0.1", "X-Big: " + "a" * 200_000 + "\r\n")
        # the proxy may answer and close before the whole head is sent
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            tls.sendall(huge)
        answer = _read_all(tls)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert len(world.seen) == count


def test_each_session_gets_its_own_placeholders_and_the_key_stays_out(world: World) -> None:
    policy = NetworkPolicy(
        allow=[f"127.0.0.1:{world.secret_port}"],
        secrets={NAME: Secret(VALUE, hosts=[f"127.0.0.1:{world.secret_port}"])},
    )
    first, second = Egress(policy), Egress(policy)
    try:
        assert first.secrets is not None and second.secrets is not None
        assert first.secrets.placeholders[NAME] != second.secrets.placeholders[NAME]
        for owner in (first, second):
            assert owner.bundle_path is not None
            assert owner.bundle_path.stat().st_mode & 0o777 == 0o444
            for path in owner.folder.iterdir():
                if path.is_file():
                    data = path.read_bytes()
                    assert b"PRIVATE KEY" not in data and VALUE.encode() not in data
    finally:
        first.close()
        second.close()


# -- end to end in the sandboxed kernel ------------------------------------------------------------
@pytest.fixture(scope="module")
def sandboxed(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        _sandbox.check_sandbox()
    except BackendUnavailable as exc:
        if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
            raise
        pytest.skip(str(exc))
    ports = (world.secret_port, world.plain_port)
    policy = NetworkPolicy(
        allow=[f"127.0.0.1:{p}" for p in ports],
        secrets={NAME: Secret(VALUE, hosts=[f"127.0.0.1:{world.secret_port}"])},
        upstream_ca=str(world.ca_file),
    )
    work = tmp_path_factory.mktemp("secrets-sandboxed")
    sandbox = SandboxOptions(network=policy)
    with make_executor("sandboxed-kernel", work_dir=work, timeout=90, sandbox=sandbox) as ex:
        yield ex


def test_the_sandboxed_kernel_uses_a_secret_it_never_sees(sandboxed: Any, world: World) -> None:
    result = sandboxed.execute(client_code(world))
    check_end_to_end(sandboxed, result, world)


# -- the command line and the MCP server: a secret by name, its value from the environment -------
def test_the_cli_passes_a_secret_by_name(sandboxed: Any, world: World) -> None:
    import subprocess
    import sys

    host = f"127.0.0.1:{world.plain_port}"  # plain HTTP: no CA to give the command line
    code = (
        "import os, urllib.request\n"
        f"req = urllib.request.Request('http://{host}/headers',"
        " headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
        "print('got', urllib.request.urlopen(req, timeout=30).read().decode())\n"
    )
    argv = ["run", "-", "--executor", "command", "--sandbox", "--allow", host]
    argv += ["--secret", f"{NAME}@{host}", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "kernelexec", *argv],
        input=f"```python\n{code}```\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, NAME: VALUE},
    )
    assert proc.returncode == 0, proc.stderr
    assert world.seen[-1]["Authorization"] == f"Bearer {VALUE}"
    assert VALUE not in proc.stdout + proc.stderr and "*" * len(VALUE) in proc.stdout
    assert '"secrets_sent": [\n' in proc.stdout or '"secrets_sent": ["' in proc.stdout


def test_the_mcp_server_and_doctor_take_secrets_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from kernelexec import _doctor, cli
    from kernelexec._mcp.cli import _hub_options, add_mcp_command

    parser = argparse.ArgumentParser()
    add_mcp_command(parser.add_subparsers())
    argv = ["mcp", "--executor", "docker-kernel", "--allow", "api.example.org:443"]
    monkeypatch.delenv(NAME, raising=False)
    with pytest.raises(InvalidSecret, match="not set here"):
        _hub_options(parser.parse_args([*argv, "--secret", f"{NAME}@api.example.org"]))
    monkeypatch.setenv(NAME, VALUE)
    with pytest.raises(InvalidSecret, match="NAME@HOST"):
        _hub_options(parser.parse_args([*argv, "--secret", NAME]))
    options = _hub_options(parser.parse_args([*argv, "--secret", f"{NAME}@api.example.org"]))
    assert options.executor_options["network"].secrets[NAME].value == VALUE
    # doctor: how many secrets, for which hosts, never a value (the probes are not run here)
    monkeypatch.setattr(_doctor, "run_doctor", lambda targets: [])
    code = cli.main(["doctor", "--json", *argv[3:], "--secret", f"{NAME}@api.example.org"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["secrets"] == {NAME: ["api.example.org"]}
    assert f"secrets: 1 ({NAME} -> api.example.org)" in err and VALUE not in out + err
