"""The secrets tests' loopback world (tests/adversarial/test_secrets.py and
tests/docker/test_secrets_docker.py): a private CA made here, an HTTPS server with its
certificate that records the headers it gets and echoes them, a plain HTTP server doing the
same (allowed, carrying no secret), and an HTTPS server whose certificate no one trusts.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: the secret's value: what must never appear in output, notebook or work dir
VALUE = "sk-kxtest-0123456789abcdef-REAL"
NAME = "OPENAI_API_KEY"

#: a block that sends the placeholder to both servers, with urllib and requests (when present)
#: (@SECRET@, @PLAIN@: the secret's HTTPS port, the plain server's port)
CLIENT_CODE = """
import os, json, urllib.request
key = os.environ["OPENAI_API_KEY"]
print("env:", key)
for url in ["https://127.0.0.1:@SECRET@/headers", "http://127.0.0.1:@PLAIN@/headers"]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    body = urllib.request.urlopen(req, timeout=30).read().decode()
    print("urllib", url.split(":")[0], json.loads(body)["Authorization"])
try:
    import requests
except ImportError:
    print("requests absent")
else:
    r = requests.get("https://127.0.0.1:@SECRET@/headers?key=" + key,
                     headers={"Authorization": "Bearer " + key}, timeout=30)
    print("requests", r.status_code, r.json()["Authorization"], r.json()["path"])
"""


@dataclass(kw_only=True)
class World:
    ca_file: Path
    secret_port: int
    plain_port: int
    untrusted_port: int
    #: every request's headers as the servers received them (dicts), in order
    seen: list[dict[str, str]] = field(default_factory=list)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    subject: str, key: Any, issuer: x509.Name | None, signer: Any, ca: bool
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate, key: Any, folder: Path, stem: str) -> ssl.SSLContext:
    (folder / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{stem}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / f"{stem}.crt", folder / f"{stem}.key")
    return context


def _handler(world: World) -> type[http.server.BaseHTTPRequestHandler]:
    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = dict(self.headers.items())
            world.seen.append({**headers, "path": self.path})
            body = json.dumps({**headers, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Echo


def _serve(world: World, context: ssl.SSLContext | None) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(world))
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextlib.contextmanager
def served(folder: Path) -> Iterator[World]:
    """The three servers, on 127.0.0.1; ``ca_file`` is the CA the secret's server chains to."""
    ca_key = _key()
    ca = _cert("kx test CA", ca_key, None, ca_key, True)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    key = _key()
    good = _pem(_cert("127.0.0.1", key, ca.subject, ca_key, False), key, folder, "good")
    rogue_key = _key()  # self-signed: in no trust store
    rogue = _cert("127.0.0.1", rogue_key, None, rogue_key, False)
    bad = _pem(rogue, rogue_key, folder, "bad")
    world = World(ca_file=folder / "ca.pem", secret_port=0, plain_port=0, untrusted_port=0)
    servers = [_serve(world, good), _serve(world, None), _serve(world, bad)]
    world.secret_port, world.plain_port, world.untrusted_port = (
        s.server_address[1] for s in servers
    )
    try:
        yield world
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def client_code(world: World) -> str:
    return CLIENT_CODE.replace("@SECRET@", str(world.secret_port)).replace(
        "@PLAIN@", str(world.plain_port)
    )


def leaks_in(folder: Path) -> list[Path]:
    """Files under ``folder`` (the work dir: outputs, notebook, kernelexec's own) holding VALUE."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                if VALUE.encode() in path.read_bytes():
                    found.append(path)
    return found


def check_end_to_end(executor: Any, result: Any, world: World) -> None:
    """What every back end must show for ``client_code``: see the module's docstring."""
    out = result.output
    assert result.exit_code == 0, out
    assert f"env: kx-secret-{NAME}-" in out
    assert f"urllib https Bearer {'*' * len(VALUE)}" in out  # reached with the value, echo masked
    assert f"urllib http Bearer kx-secret-{NAME}-" in out  # the other host: the placeholder
    received = [s["Authorization"] for s in world.seen[-3:]]
    assert f"Bearer {VALUE}" in received and any("kx-secret-" in r for r in received)
    withheld = [e for e in result.network_log if e.secrets_withheld]
    assert [(e.port, e.secrets_withheld) for e in withheld] == [(world.plain_port, (NAME,))]
    assert any(e.secrets_sent == (NAME,) for e in result.network_log)
    if "requests absent" not in out:
        assert f"requests 200 Bearer {'*' * len(VALUE)}" in out
        assert f"/headers?key={'*' * len(VALUE)}" in out
    assert VALUE not in out and VALUE not in json.dumps(result.to_dict())
    assert VALUE not in json.dumps(executor.notebook)
    work_dir = Path(executor.work_dir)
    executor.save_notebook(work_dir / "session.ipynb")
    assert leaks_in(work_dir) == [] and (work_dir / "session.ipynb").is_file()
