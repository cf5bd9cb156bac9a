"""The Docker kernel's relay (``_docker_relay``) without Docker: its container half runs here as a
plain process whose stdin/stdout are one end of a socket pair, as an exec's stream would be.

Under gVisor it is the kernel's only way in, so its edge cases are pinned here: many
connections at once, a client that connects before anything listens, a large transfer both
ways, and a clean end (no thread, no socket file left).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelexec.backends._docker_relay import RELAY_SCRIPT, Relay


def _frames(stream: socket.socket, tty: bool) -> Iterator[tuple[int, bytes]]:
    """The exec stream here carries stdout unframed: each read is one "stdout frame"."""
    while data := stream.recv(65536):
        yield 1, data


class _Echo:
    """A TCP server on 127.0.0.1 that sends back what it gets, prefixed once per connection."""

    def __init__(self, port: int = 0) -> None:
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        # A relay that closes a connection may reset it: the end of this echo, not an error
        # (raised on this thread it failed a teardown in CI).
        with conn, contextlib.suppress(ConnectionError):
            conn.sendall(b"echo:")
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def relay_pair(tmp_path: Path) -> Iterator[Any]:
    host, inside = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", RELAY_SCRIPT], stdin=inside, stdout=inside
    )
    inside.close()
    made: list[Relay] = []

    def make(endpoints: dict[Path, int]) -> Relay:
        relay = Relay(endpoints, host, _frames)
        made.append(relay)
        return relay

    yield make
    for relay in made:
        relay.close()
    host.close()
    proc.wait(timeout=10)  # its stdin closed: it ends


def _talk(path: Path, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(20)
        conn.connect(str(path))
        conn.sendall(payload)
        want = len(b"echo:") + len(payload)
        got = b""
        while len(got) < want and (data := conn.recv(65536)):
            got += data
        return got


def test_connections_are_carried_both_ways(relay_pair: Any, tmp_path: Path) -> None:
    echo = _Echo()
    try:
        path = tmp_path / "kernel-1"
        relay_pair({path: echo.port})
        assert _talk(path, b"hello") == b"echo:hello"
        big = bytes(range(256)) * 20_000  # 5 MB: many frames each way
        assert _talk(path, big) == b"echo:" + big
        results: list[bytes] = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(_talk(path, b"n%d" % i)))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(results) == sorted(b"echo:n%d" % i for i in range(8))
    finally:
        echo.close()


def test_a_client_that_connects_before_anything_listens_waits(
    relay_pair: Any, tmp_path: Path
) -> None:
    # A port that is free now; the server comes up only after the client has sent its request.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "kernel-2"
    relay_pair({path: port})
    result: list[bytes] = []
    client = threading.Thread(target=lambda: result.append(_talk(path, b"early")))
    client.start()
    time.sleep(0.5)
    echo = _Echo(port)
    try:
        client.join(30)
        assert result == [b"echo:early"]
    finally:
        echo.close()


def test_close_leaves_no_thread_and_no_socket_file(relay_pair: Any, tmp_path: Path) -> None:
    before = {t for t in threading.enumerate() if t.name == "kernelexec-relay"}
    echo = _Echo()
    try:
        path = tmp_path / "kernel-3"
        relay = relay_pair({path: echo.port})
        assert _talk(path, b"x") == b"echo:x"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
            idle.connect(str(path))  # a connection still open at close()
            relay.close()
            assert not relay.alive and not path.exists()
            idle.settimeout(10)
            assert idle.recv(100) in (b"", b"echo:")
    finally:
        echo.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if {t for t in threading.enumerate() if t.name == "kernelexec-relay"} <= before:
            break
        time.sleep(0.05)
    assert {t for t in threading.enumerate() if t.name == "kernelexec-relay"} <= before
