"""``packages=`` with and without the host's wheel cache: first session against second (issue 37).

    python benchmarks/wheel_cache.py [--kinds KIND ...] [--wheels 3] [--mib 8] [--rounds 2]

A local index (``http.server`` on 127.0.0.1, no network needed) serves ``--wheels`` wheels built
here, each with ``--mib`` MiB of incompressible data; the index is slowed to ``--kbps`` KiB/s per
request (0: as fast as loopback) to stand for a real one. Per back end and round: a fresh wheel
cache, then a first session (the cache empty: the host downloads, the code's pip installs through
the proxy) and a second session (from the cache alone, the index not asked), each timed from
``make_executor`` to the first block's answer. The load average is printed with each row.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.server
import os
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

from kernelexec import NetworkPolicy, SandboxOptions, make_executor


def _wheel(folder: Path, name: str, size: int) -> str:
    files = {
        f"{name}.py": b"ANSWER = 42\n",
        f"{name}_data.bin": os.urandom(size),
        f"{name}-1.0.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode()
        ),
        f"{name}-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: kx\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}-1.0.dist-info/RECORD,,")
    files[f"{name}-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    project = folder / "simple" / name
    project.mkdir(parents=True)
    wheel = f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(project / wheel, "w") as out:
        for path, data in files.items():
            out.writestr(path, data)
    (project / "index.html").write_text(f'<a href="{wheel}">{wheel}</a>\n')
    return name


def _serve(root: Path, kbps: int) -> http.server.ThreadingHTTPServer:
    class Slow(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def copyfile(self, source: Any, outputfile: Any) -> None:
            while chunk := source.read(64 * 1024):
                outputfile.write(chunk)
                if kbps:
                    time.sleep(len(chunk) / 1024 / kbps)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _session(kind: str, policy: NetworkPolicy, names: list[str]) -> float:
    block = "import " + ", ".join(names) + "; print('ok')"
    options: dict[str, Any] = {"network": policy}
    if kind.startswith("sandboxed"):
        options = {"sandbox": SandboxOptions(network=policy)}
    with tempfile.TemporaryDirectory() as work:
        started = time.perf_counter()
        with make_executor(kind, work_dir=work, timeout=600, **options) as ex:
            result = ex.execute(block)
            took = time.perf_counter() - started
        if "ok" not in result.output:
            raise SystemExit(f"{kind}: the packages did not install:\n{result.output}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["sandboxed-command", "docker-command"])
    parser.add_argument("--wheels", type=int, default=3)
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--kbps", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        names = [_wheel(Path(root), f"kxbench{i}", args.mib << 20) for i in range(args.wheels)]
        server = _serve(Path(root), args.kbps)
        port = server.server_address[1]
        os.environ["PIP_INDEX_URL"] = f"http://127.0.0.1:{port}/simple"
        policy = NetworkPolicy(allow=[], packages=names)
        print("kind\tround\tfirst session s\tsecond session s\tload (1 min)")
        try:
            for kind in args.kinds:
                for round_ in range(args.rounds):
                    with tempfile.TemporaryDirectory() as cache:
                        os.environ["KERNELEXEC_WHEEL_CACHE"] = cache
                        first = _session(kind, policy, names)
                        second = _session(kind, policy, names)
                    load = os.getloadavg()[0]
                    print(f"{kind}\t{round_ + 1}\t{first:.1f}\t{second:.1f}\t{load:.1f}")
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
