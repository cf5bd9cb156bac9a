"""Real gateway servers for the gateway tests (the fixtures in conftest start one of each).

Each server runs from its own virtualenv at the repository root (``.venv-kg``, ``.venv-eg``;
``.ci/gateway.sh`` makes them), on 127.0.0.1 with a free port and a random token, and is stopped
afterwards together with any kernel it left behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernelexec.backends.gateway_kernel import GatewayKernel, GatewayOptions

ROOT = Path(__file__).resolve().parents[2]

# name -> (virtualenv, server command, the app's traitlets prefix)
SERVERS = {
    "kernel-gateway": (".venv-kg", "jupyter-kernelgateway", "KernelGatewayApp"),
    "enterprise-gateway": (".venv-eg", "jupyter-enterprisegateway", "EnterpriseGatewayApp"),
}


@dataclass(frozen=True)
class Gateway:
    name: str
    url: str
    token: str
    log: Path

    def backend(self, **kwargs: object) -> GatewayKernel:
        """A back end for this server; Enterprise Gateway refuses ``root``, so name a user."""
        kwargs.setdefault("token", self.token)
        kwargs.setdefault("username", "kernelexec")
        kwargs.setdefault("options", GatewayOptions(backoff=0.05))
        return GatewayKernel(self.url, **kwargs)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _other_kernelspecs(tmp: Path) -> str:
    """A Jupyter data dir holding the test environment's other kernelspecs (Deno's and
    bash_kernel's are installed into it, not system-wide), for the gateway to list beside its
    own; not its python3, which would shadow the gateway's own Python kernel."""
    shared = tmp / "jupyter"
    source = Path(sys.prefix, "share", "jupyter", "kernels")
    for spec in sorted(source.iterdir()) if source.is_dir() else []:
        if spec.name != "python3":
            shutil.copytree(spec, shared / "kernels" / spec.name)
    return str(shared)


def _wait_until_up(url: str, token: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    request = urllib.request.Request(
        f"{url}/api/kernelspecs", headers={"Authorization": f"token {token}"}
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError),
            urllib.request.urlopen(request, timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"gateway did not answer within 60 s:\n{log.read_text()[-3000:]}")


def _kill_leftover_kernels(runtime_dir: Path) -> None:
    """Kill kernels whose connection file lives in this server's runtime dir (ours only)."""
    marker = str(runtime_dir)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


@contextlib.contextmanager
def run_gateway(name: str) -> Iterator[Gateway]:
    venv, command, app = SERVERS[name]
    binary = ROOT / venv / "bin" / command
    if not binary.exists():
        message = f"{binary} is missing: run gateway_install from .ci/gateway.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    token = secrets.token_hex(16)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=f"kernelexec-{name}-") as tmp:
        tmp_path = Path(tmp)
        runtime = tmp_path / "runtime"
        log = tmp_path / "server.log"
        env = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(runtime),
            "JUPYTER_PATH": _other_kernelspecs(tmp_path),
        }
        argv = [
            str(binary),
            f"--{app}.ip=127.0.0.1",
            f"--{app}.port={port}",
            f"--{app}.port_retries=0",
            f"--{app}.auth_token={token}",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_up(url, token, proc, log)
            yield Gateway(name=name, url=url, token=token, log=log)
        finally:
            proc.terminate()  # the server shuts its kernels down on SIGTERM
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            _kill_leftover_kernels(runtime)
