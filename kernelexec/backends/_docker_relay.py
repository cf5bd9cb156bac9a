"""The Docker kernel's way in when its sockets cannot be shared: a relay over ``docker exec``.

Under runc the kernel's ZMQ ``ipc`` sockets sit in a bind-mounted folder and the host connects to
them directly. Under gVisor (``runsc``) a socket the container creates lives in the sandbox's own
kernel: the host sees no socket file at all. TCP would need a network the container can also use
to reach the host's listeners, which the "no network" promise forbids. So the container keeps
``network_mode="none"`` and the kernel listens on its own loopback; one ``docker exec`` runs
``RELAY_SCRIPT`` in the container, and its stdin/stdout (the engine's API socket, which the
container cannot reach from inside) carry every connection:

* the host side (``Relay``) listens on unix sockets in the runtime folder, one per kernel
  channel (and one for the reaper), so the host's connection file is the same ``ipc`` one as
  under runc;
* each connection the host's client opens becomes an ``OPEN`` frame; the container's relay
  connects to the matching port on 127.0.0.1 (retrying until the kernel listens, what the host
  sent meanwhile held back) and both sides pump ``DATA`` frames until either end closes
  (``CLOSE``).

A frame is a 9-byte header (connection id, kind, payload length; big-endian) and the payload.
Connection ids are never reused, so a frame for a connection already closed is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("kernelexec.docker")

HEADER = struct.Struct(">IBI")
OPEN, DATA, CLOSE = 1, 2, 3
_CHUNK = 65536

# Runs in the container (``python3 -I -S -c RELAY_SCRIPT``): the stdlib only, threads for the
# connections (a block can flood iopub while the host sends a shell message).
RELAY_SCRIPT = r"""
import os, socket, struct, sys, threading, time
HEADER = struct.Struct(">IBI")
OPEN, DATA, CLOSE = 1, 2, 3
out_lock = threading.Lock()
lock = threading.Lock()
conns = {}
pending = {}

def send(cid, kind, data=b""):
    view = memoryview(HEADER.pack(cid, kind, len(data)) + data)
    with out_lock:
        while view:
            view = view[os.write(1, view):]

def pump(cid, conn):
    try:
        while True:
            data = conn.recv(65536)
            if not data:
                break
            send(cid, DATA, data)
    except OSError:
        pass
    try:
        send(cid, CLOSE)
    except OSError:
        pass

def connect(cid, port):
    # The host's client connects as soon as the relay runs, usually before the kernel listens:
    # keep trying (what it sends meanwhile waits in `pending`) rather than refuse, which would
    # cost the client a reconnect and a lost first request.
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            with lock:
                wanted = cid in pending
            if not wanted or time.monotonic() > deadline:
                with lock:
                    pending.pop(cid, None)
                send(cid, CLOSE)
                return
            time.sleep(0.02)
    conn.settimeout(None)
    with lock:
        waiting = pending.pop(cid, None)
        if waiting is not None:
            try:
                for data in waiting:
                    conn.sendall(data)
            except OSError:
                pass
            conns[cid] = conn
    if waiting is None:  # the host closed it meanwhile
        conn.close()
        return
    pump(cid, conn)

def read_exact(size):
    chunks = []
    while size:
        data = os.read(0, size)
        if not data:
            return None
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)

while True:
    head = read_exact(HEADER.size)
    if head is None:
        break
    cid, kind, size = HEADER.unpack(head)
    data = read_exact(size) if size else b""
    if data is None:
        break
    if kind == OPEN:
        try:
            port = int(data)
        except ValueError:
            send(cid, CLOSE)
            continue
        with lock:
            pending[cid] = []
        threading.Thread(target=connect, args=(cid, port), daemon=True).start()
    elif kind == DATA:
        with lock:
            waiting = pending.get(cid)
            if waiting is not None:
                waiting.append(data)
            conn = conns.get(cid)
        if conn is not None:
            try:
                conn.sendall(data)
            except OSError:
                pass
    elif kind == CLOSE:
        with lock:
            pending.pop(cid, None)
            conn = conns.pop(cid, None)
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
"""


class Relay:
    """The host side: unix sockets at ``endpoints`` (path -> port in the container), carried
    over one exec stream (``stream``: the socket ``exec_start(socket=True)`` returned for an exec
    of ``RELAY_SCRIPT`` created with stdin attached).

    ``frames(stream, tty)`` turns the exec's multiplexed output into ``(stream, bytes)`` pairs
    (the Docker SDK's ``frames_iter``); a parameter, so this module needs no Docker SDK.
    """

    def __init__(self, endpoints: Mapping[Path, int], stream: Any, frames: Any) -> None:
        self._stream = stream
        self._raw: socket.socket = getattr(stream, "_sock", stream)
        self._frames = frames
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._conns: dict[int, socket.socket] = {}
        self._next_id = 1
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._listeners: list[tuple[socket.socket, Path]] = []
        try:
            for path in endpoints:
                self._listeners.append((_listen(path), path))
        except BaseException:
            self._close_listeners()
            raise
        for (listener, _), port in zip(self._listeners, endpoints.values(), strict=True):
            self._spawn(self._accept, listener, port)
        self._spawn(self._demux)

    @property
    def alive(self) -> bool:
        return not self._closed

    def close(self) -> None:
        """Stop listening, drop every connection and end the exec (its stdin closes)."""
        with self._lock:
            if self._closed and not self._threads:
                return
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        self._close_listeners()
        _close_all(conns)
        for how in (lambda: self._raw.shutdown(socket.SHUT_RDWR), self._stream.close):
            with contextlib.suppress(OSError):
                how()
        with contextlib.suppress(OSError):
            self._raw.close()
        threads, self._threads = self._threads, []
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    # -- threads -------------------------------------------------------------------------------
    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="kernelexec-relay")
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket, port: int) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                cid, self._next_id = self._next_id, self._next_id + 1
                self._conns[cid] = conn
            if not self._send(cid, OPEN, str(port).encode()):
                self._drop(cid)
                return
            # Not kept in _threads: it ends when its connection does (close() closes them all).
            threading.Thread(
                target=self._pump, args=(cid, conn), daemon=True, name="kernelexec-relay"
            ).start()

    def _pump(self, cid: int, conn: socket.socket) -> None:
        """Host client -> container, until the client closes or the relay does."""
        try:
            while data := conn.recv(_CHUNK):
                if not self._send(cid, DATA, data):
                    return
        except OSError:
            pass
        if self._drop(cid):
            self._send(cid, CLOSE)

    def _demux(self) -> None:
        """Container -> host clients: parse our frames out of the exec's stdout."""
        buffer = bytearray()
        try:
            for stream, data in self._frames(self._stream, False):
                if stream != 1:
                    log.debug("kernelexec relay (container): %r", data[:500])
                    continue
                buffer += data
                while len(buffer) >= HEADER.size:
                    cid, kind, size = HEADER.unpack_from(buffer)
                    if len(buffer) < HEADER.size + size:
                        break
                    payload = bytes(buffer[HEADER.size : HEADER.size + size])
                    del buffer[: HEADER.size + size]
                    self._deliver(cid, kind, payload)
        except (OSError, ValueError):
            pass  # the stream was shut (close()) or the exec ended
        # The exec is gone (the container stopped): no connection can carry on.
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        _close_all(conns)

    def _deliver(self, cid: int, kind: int, payload: bytes) -> None:
        with self._lock:
            conn = self._conns.get(cid)
        if conn is None:
            return
        if kind == DATA:
            try:
                conn.sendall(payload)
                return
            except OSError:
                pass  # the client went away: close the container side too
            if self._drop(cid):
                self._send(cid, CLOSE)
        elif kind == CLOSE:
            self._drop(cid)

    # -- helpers -------------------------------------------------------------------------------
    def _send(self, cid: int, kind: int, payload: bytes = b"") -> bool:
        """Write one frame to the exec's stdin; False once the stream is gone."""
        try:
            with self._write_lock:
                self._raw.sendall(HEADER.pack(cid, kind, len(payload)) + payload)
        except OSError:
            return False
        return True

    def _drop(self, cid: int) -> bool:
        """Forget and close connection ``cid``; False when it was gone already."""
        with self._lock:
            conn = self._conns.pop(cid, None)
        if conn is None:
            return False
        _close_all([conn])
        return True

    def _close_listeners(self) -> None:
        for listener, path in self._listeners:
            # shutdown() wakes a thread blocked in accept(); close() alone does not.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            path.unlink(missing_ok=True)


def _listen(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(16)
    except BaseException:
        listener.close()
        raise
    return listener


def _close_all(conns: Iterable[socket.socket]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()
