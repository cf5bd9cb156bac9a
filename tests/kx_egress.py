"""The egress tests' loopback world: a package index serving a wheel built here, and another
listener the code must not reach (tests/docker/test_egress.py and
tests/adversarial/test_egress_proxy.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def served_index(root: Path) -> Iterator[tuple[int, int]]:
    """(the allowed index's port, the other listener's port), both on 127.0.0.1."""
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


def install_code(port: int) -> str:
    """A block that pip-installs PACKAGE from the index on the host's ``port``."""
    return (
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--index-url',"
        f" 'http://127.0.0.1:{port}/simple', '{PACKAGE}'], capture_output=True, text=True)\n"
        "print('pip exit', r.returncode, r.stderr[-2000:])\n"
    )
