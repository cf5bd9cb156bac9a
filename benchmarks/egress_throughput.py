"""Download throughput through the egress proxy beside a direct connection (issue 37).

    python benchmarks/egress_throughput.py [--mib 64] [--runtime runsc]

A host HTTP server (on every address) serves ``--mib`` MiB; a docker-command block downloads it
three times (urllib, 1 MiB reads) and prints the best rate, once with ``network="all"`` (the
bridge, straight to the host's bridge address) and once through ``NetworkPolicy`` (the relay in
the container, the ``docker exec`` stream, the host relay, the proxy). Only the public API.
A runtime registered with ``--network=none`` (this machine's runsc) has no direct row.
"""

from __future__ import annotations

import argparse
import http.server
import os
import tempfile
import threading
from typing import Any

from kernelexec import NetworkPolicy, make_executor

_BLOCK = """
import time, urllib.request
best = None
for _ in range(3):
    started = time.perf_counter()
    size = 0
    with urllib.request.urlopen('http://{host}:{port}/', timeout=300) as answer:
        while chunk := answer.read(1 << 20):
            size += len(chunk)
    took = time.perf_counter() - started
    best = took if best is None else min(best, took)
print('MB/s', round(size / best / 1e6, 1))
"""


def _server(size: int) -> http.server.ThreadingHTTPServer:
    blob = memoryview(os.urandom(1 << 20) * (size >> 20))

    class Blob(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(blob)))
            self.end_headers()
            for start in range(0, len(blob), 1 << 20):
                self.wfile.write(blob[start : start + (1 << 20)])

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Blob)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runtime", default=None, help="e.g. runsc (default: the engine's)")
    parser.add_argument("--bridge", default="172.17.0.1", help="the host's bridge address")
    args = parser.parse_args()
    server = _server(args.mib << 20)
    port = server.server_address[1]
    rows = (
        ("direct (network='all')", "all", args.bridge),
        ("egress proxy", NetworkPolicy(allow=[f"127.0.0.1:{port}"]), "127.0.0.1"),
    )
    try:
        for label, network, host in rows:
            with (
                tempfile.TemporaryDirectory() as work,
                make_executor(
                    "docker-command",
                    work_dir=work,
                    timeout=600,
                    network=network,
                    runtime=args.runtime,
                ) as ex,
            ):
                result = ex.execute(_BLOCK.format(host=host, port=port))
                rate = result.output.strip().splitlines()[-1] if result.ok else "failed"
                print(f"{args.runtime or 'default'}\t{label}\t{rate}")
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
