"""The cost of a secret's host: HTTPS through the TLS-terminating proxy path beside a blind tunnel.

    python benchmarks/secrets_tls.py [--requests 100] [--mib 32]

A host HTTPS server (its CA made here) answers a small JSON request and serves ``--mib`` MiB.
A client speaks to the egress proxy's socket as a container's relay does (CONNECT, then TLS):
once with the server's host carrying a secret (the proxy terminates TLS with the session CA,
substitutes the placeholder, verifies the server and masks echoes) and once without (a blind
tunnel, the client verifying the server itself). Printed: the median time of one request on a
new connection (CONNECT + handshakes + request), and the download rate. The proxy alone: no
container or relay (their cost is ``egress_throughput.py``'s).
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import ipaddress
import os
import socket
import ssl
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kernelexec import NetworkPolicy, Secret
from kernelexec.backends._egress import Egress


def _certs(folder: Path) -> ssl.SSLContext:
    """A CA (``folder/ca.pem``) and a server context whose certificate it signed (127.0.0.1)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    keys = [ec.generate_private_key(ec.SECP256R1()) for _ in range(2)]
    names = [x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, n)]) for n in ("ca", "srv")]
    certs = []
    for index, ca in ((0, True), (1, False)):
        builder = (
            x509.CertificateBuilder()
            .subject_name(names[index])
            .issuer_name(names[0])
            .public_key(keys[index].public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            builder = builder.add_extension(san, critical=False)
        certs.append(builder.sign(keys[0], hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(certs[0].public_bytes(pem))
    (folder / "srv.pem").write_bytes(certs[1].public_bytes(pem))
    (folder / "srv.key").write_bytes(
        keys[1].private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "srv.pem", folder / "srv.key")
    return context


def _server(context: ssl.SSLContext, size: int) -> http.server.ThreadingHTTPServer:
    blob = memoryview(os.urandom(1 << 20) * (size >> 20))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = blob if self.path == "/blob" else b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for start in range(0, len(body), 1 << 20):
                self.wfile.write(body[start : start + (1 << 20)])

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _request(egress: Egress, port: int, trust: ssl.SSLContext, path: str, token: str) -> int:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(egress.socket_path))
    sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(1)
    tls = trust.wrap_socket(sock, server_hostname="127.0.0.1")
    tls.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    size = 0
    try:
        while data := tls.recv(1 << 20):
            size += len(data)
    except (ssl.SSLError, ConnectionError):
        pass
    tls.close()
    return size


def _measure(egress: Egress, port: int, ca: str, token: str, count: int) -> tuple[float, float]:
    # made once, as a client's pool does: loading a trust store (the bundle holds the system's,
    # 200 KB) costs more than a handshake
    trust = ssl.create_default_context(cafile=ca)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        _request(egress, port, trust, "/small", token)
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    size = _request(egress, port, trust, "/blob", token)
    rate = size / (time.perf_counter() - started) / 1e6
    return statistics.median(times) * 1000, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--mib", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        server = _server(_certs(Path(folder)), args.mib << 20)
        port, ca = server.server_address[1], str(Path(folder) / "ca.pem")
        host = f"127.0.0.1:{port}"
        blind = Egress(NetworkPolicy(allow=[host]))
        secret = Secret("sk-bench-value", hosts=[host])
        terminating = Egress(NetworkPolicy(allow=[host], secrets={"KEY": secret}, upstream_ca=ca))
        assert terminating.secrets is not None and terminating.bundle_path is not None
        rows = [
            ("blind tunnel", _measure(blind, port, ca, "x", args.requests)),
            (
                "TLS terminated (secret host)",
                _measure(
                    terminating,
                    port,
                    str(terminating.bundle_path),
                    terminating.secrets.placeholders["KEY"],
                    args.requests,
                ),
            ),
        ]
        print(f"{'path':30} {'request (median ms)':>20} {'download (MB/s)':>16}")
        for name, (ms, rate) in rows:
            print(f"{name:30} {ms:20.2f} {rate:16.1f}")
        for owner in (blind, terminating):
            owner.close()
        server.shutdown()


if __name__ == "__main__":
    main()
