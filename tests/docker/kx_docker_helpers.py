"""Helpers the docker tests share (a module of its own: tests/docker is not a package)."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import docker
import pytest

from kernelexec import DockerKernel, DockerUnavailable, KernelExecutor
from kernelexec.backends._docker import LABEL_SESSION


def containers_of(client: docker.DockerClient, session: str) -> list[Any]:
    """Containers (running or not) created by one back end instance."""
    found = client.containers.list(
        all=True, ignore_removed=True, filters={"label": f"{LABEL_SESSION}={session}"}
    )
    return list(found)


def processes(container: Any) -> list[str]:
    """Command lines of every process in a container (from the engine, not an exec)."""
    return [row[-1] for row in container.top(ps_args="-o pid,args")["Processes"]]


class SocketProxy:
    """A unix-socket proxy in front of the engine that a test can cut, like an engine dying."""

    def __init__(self, path: Path, target: str = "/var/run/docker.sock") -> None:
        self.path = path
        self.target = target
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Drop the listener and every open connection at once."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        for sock in [self._listener, *conns]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.path.unlink(missing_ok=True)


def collect_sdk_sockets() -> None:
    """Collect the sockets the Docker SDK leaks when a unix-socket connect fails.

    docker/transport/unixconn.py creates a socket and does not close it when ``connect`` raises
    (here: every engine call after the proxy was cut). They are garbage; collect them now, with
    their ResourceWarning silenced, so the warning does not land on an unrelated later test.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


class Session(Protocol):
    """What both Docker executors (command and kernel) offer these checks."""

    def start(self) -> object: ...
    def execute(self, code: str) -> object: ...
    def close(self) -> None: ...


def check_close_is_fast(client: docker.DockerClient, ex: Session, session: str) -> None:
    """Closing takes under 3 s and removes the session's container."""
    started = time.perf_counter()
    ex.close()
    elapsed = time.perf_counter() - started
    assert elapsed < 3, f"close took {elapsed:.2f} s"
    assert containers_of(client, session) == []


def check_engine_dying_mid_block(
    client: docker.DockerClient,
    folder: Path,
    open_session: Callable[[str], tuple[Session, str]],
    block: str,
) -> None:
    """A block running when the engine goes away is a DockerUnavailable within seconds, and
    closing then neither hangs nor raises. ``open_session(base_url)`` makes the executor (not
    started) and names its session."""
    proxy = SocketProxy(folder / "engine.sock")
    ex, session = open_session(proxy.url)
    try:
        ex.start()
        timer = threading.Timer(1.0, proxy.close)
        timer.start()
        started = time.perf_counter()
        with pytest.raises(DockerUnavailable, match="Docker engine"):
            ex.execute(block)
        assert time.perf_counter() - started < 15
        ex.close()  # the engine is unreachable: closing must not hang or raise
    finally:
        proxy.close()
        ex.close()
        for container in containers_of(client, session):
            container.remove(force=True)
        collect_sdk_sockets()


def gvisor_problem(client: docker.DockerClient) -> str | None:
    """Why gVisor cannot run here (None when ``runsc`` is registered with the engine)."""
    runtimes = client.info().get("Runtimes") or {}
    if "runsc" in runtimes:
        return None
    return (
        f"the Docker engine has no runtime 'runsc' (it has {sorted(runtimes)}): install gVisor "
        "(`apt install runsc`) and register it with the engine (see .ci/gvisor.sh)"
    )


def require_runtime(client: docker.DockerClient, runtime: str | None) -> None:
    """Skip unless the engine has ``runtime`` (None and runc always); with
    ``KERNELEXEC_REQUIRE_GVISOR=1`` (set by ``.ci/run``) a missing gVisor fails instead."""
    if runtime != "runsc" or (problem := gvisor_problem(client)) is None:
        return
    if os.environ.get("KERNELEXEC_REQUIRE_GVISOR") == "1":
        pytest.fail(f"{problem} (KERNELEXEC_REQUIRE_GVISOR=1, so this is a failure)")
    pytest.skip(problem)


#: the runtimes the fork and snapshot tests run under
FORK_RUNTIMES = ["runc", "runsc"]
#: a block that plants a link to / and a FIFO in its working folder (again: the old go first)
PLANT_LINK_AND_FIFO = (
    "import os\n"
    "for name in ('root-link', 'pipe'):\n"
    "    if os.path.lexists(name):\n"
    "        os.unlink(name)\n"
    "os.symlink('/', 'root-link')\n"
    "os.mkfifo('pipe')\n"
)


def forking_backend(runtime: str) -> DockerKernel:
    """A Docker kernel that may fork: under gVisor every thread of the sandbox counts against
    pids_limit (see docker_fork)."""
    return DockerKernel(runtime=runtime, pids_limit=1024 if runtime == "runsc" else None)


@contextlib.contextmanager
def forking_session(client: docker.DockerClient, runtime: str) -> Iterator[KernelExecutor]:
    """A Docker kernel session that may fork; once closed, no container of it is left (its
    forks' and snapshots' included)."""
    require_runtime(client, runtime)
    backend = forking_backend(runtime)
    ex = KernelExecutor(backend, timeout=60)
    try:
        yield ex
    finally:
        ex.close()
    assert containers_of(client, backend.session) == []
