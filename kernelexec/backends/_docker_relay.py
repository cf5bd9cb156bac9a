"""The one relay over ``docker exec``: connections carried across a container's loopback while
the container has no network at all.

Two callers, one transport (``RELAY_SCRIPT`` in the container, ``Relay`` on the host, one exec's
stdin/stdout between them; the engine's API socket, which the container cannot reach):

* the Docker kernel under gVisor (``runsc``): a socket the container creates lives in the
  sandbox's own kernel, so the host sees no ipc socket file, and TCP would need a network. The
  kernel listens on its own loopback; the host side listens on unix sockets in the runtime
  folder, one per kernel channel (``endpoints``), so the host's connection file is the same
  ``ipc`` one as under runc. Each connection the host's client opens becomes an ``OPEN`` frame
  naming the port; the container's relay connects to it (retrying until the kernel listens,
  what the host sent meanwhile held back).
* the egress proxy (``network=NetworkPolicy``, runc and gVisor alike): run with ``PORT MAX`` the
  relay also listens on the container's ``127.0.0.1:PORT`` (at most ``MAX`` connections at
  once) and answers the container's DNS on ``127.0.0.1:53``: each connection the code opens
  becomes an ``OPEN`` frame from the container, which the host turns into a connection to the
  proxy (``connect``); each DNS query is answered REFUSED and its name told to the host (a
  ``DNS`` frame, ``on_dns``).

A frame is a 9-byte header (connection id, kind, payload length; big-endian) and the payload.
Connections the host opens have ids from 1, those the container opens ids with the top bit set,
so the two never meet; ids are never reused, so a frame for a connection already closed is
dropped. ``OPEN`` with id 0 from the container says it listens; ``SYNC`` is a barrier the
container echoes, so every frame it sent before has reached the host.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("kernelexec.docker")

HEADER = struct.Struct(">IBI")
OPEN, DATA, CLOSE, DNS, SYNC = 1, 2, 3, 4, 5
#: the connection id of the container's "listening" ``OPEN``
READY = 0
_CHUNK = 65536

# The helpers the script uses (copy, connect_when_listening, answer_dns), as source.
_INSIDE = Path(__file__).with_name("_relay_inside.py").read_text()

# Runs in the container (``python3 -I -S -c RELAY_SCRIPT [PORT MAX]``): the stdlib only, threads
# for the connections (a block can flood iopub while the host sends a shell message).
RELAY_SCRIPT = (
    _INSIDE
    + r"""
import os, socket, struct, sys, threading
HEADER = struct.Struct(">IBI")
OPEN, DATA, CLOSE, DNS, SYNC = 1, 2, 3, 4, 5
INSIDE = 0x80000000
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
    with lock:
        mine = conns.pop(cid, None) is not None
    try:
        if mine:  # else the host closed it first
            send(cid, CLOSE)
    except OSError:
        pass
    conn.close()

def connect(cid, port):
    # Kept trying while the host holds it open (what it sends meanwhile waits in `pending`)
    # rather than refused, which would cost the client a reconnect and a lost first request.
    def wanted():
        with lock:
            return cid in pending

    conn = connect_when_listening(port, wanted)
    if conn is None:
        with lock:
            pending.pop(cid, None)
        send(cid, CLOSE)
        return
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

def accept(listener, limit):
    cid = INSIDE
    while True:
        conn, _ = listener.accept()
        with lock:
            full = sum(1 for c in conns if c & INSIDE) >= limit
        if full:  # bounded here too: the host never sees the excess
            conn.close()
            continue
        cid += 1
        with lock:
            conns[cid] = conn
        send(cid, OPEN)
        threading.Thread(target=pump, args=(cid, conn), daemon=True).start()

def tell_dns(name):
    # The container's resolver is 127.0.0.1: each name goes to the host (which logs it) as a
    # frame, before its query is answered (see SYNC).
    send(0, DNS, name)

def read_exact(size):
    chunks = []
    while size:
        data = os.read(0, size)
        if not data:
            return None
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)

if len(sys.argv) > 2:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(sys.argv[1])))
    listener.listen(128)
    trap = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    trap.bind(("127.0.0.1", 53))
    threading.Thread(target=accept, args=(listener, int(sys.argv[2])), daemon=True).start()
    threading.Thread(target=answer_dns, args=(trap, tell_dns), daemon=True).start()
    send(0, OPEN)  # listening
while True:
    head = read_exact(HEADER.size)
    if head is None:
        os._exit(0)
    cid, kind, size = HEADER.unpack(head)
    data = read_exact(size) if size else b""
    if data is None:
        os._exit(0)
    if kind == SYNC:
        send(cid, SYNC)
    elif kind == OPEN:
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
        if conn is not None:  # its pump sees the end and closes it
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
"""
)


class Relay:
    """The host side of ``RELAY_SCRIPT``, over one exec stream (``stream``: the socket
    ``exec_start(socket=True)`` returned for an exec created with stdin attached).

    ``endpoints`` (unix socket path -> port in the container): where the host's clients connect
    (the kernel's channels). ``connect``: for each connection the container opens (the relay run
    with ``PORT MAX``), a socket to carry it to, or None to refuse it with ``refusal`` (bytes
    the container's client reads first). ``on_dns``: each DNS name the container asked for.
    ``frames(stream, tty)`` turns the exec's multiplexed output into ``(stream, bytes)`` pairs
    (the Docker SDK's ``frames_iter``); a parameter, so this module needs no Docker SDK.
    """

    def __init__(
        self,
        endpoints: Mapping[Path, int],
        stream: Any,
        frames: Any,
        *,
        connect: Callable[[], socket.socket | None] | None = None,
        on_dns: Callable[[str], None] | None = None,
        refusal: bytes = b"",
    ) -> None:
        self._stream = stream
        self._raw: socket.socket = getattr(stream, "_sock", stream)
        self._frames = frames
        self._connect = connect
        self._on_dns = on_dns
        self._refusal = refusal
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._conns: dict[int, socket.socket] = {}
        self._next_id = 1
        self._closed = False
        self._listening = threading.Event()
        self._synced: dict[int, threading.Event] = {}
        self._sync_ids = itertools.count(1)
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

    def wait_listening(self, timeout: float) -> bool:
        """Whether the container's relay listens on its port (run with ``PORT MAX``)."""
        return self._listening.wait(timeout)

    def sync(self, timeout: float) -> bool:
        """Wait until every frame the container sent so far has been delivered here: a block's
        DNS queries travel over this stream, not the kernel's, and its result must not be read
        before they are logged. True once the container's echo came back."""
        token = next(self._sync_ids)
        done = self._synced[token] = threading.Event()
        try:
            return self._send(token, SYNC) and done.wait(timeout)
        finally:
            self._synced.pop(token, None)

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
            self._start_pump(cid, conn)

    def _start_pump(self, cid: int, conn: socket.socket) -> None:
        # Not kept in _threads: it ends when its connection does (close() closes them all).
        threading.Thread(
            target=self._pump, args=(cid, conn), daemon=True, name="kernelexec-relay"
        ).start()

    def _pump(self, cid: int, conn: socket.socket) -> None:
        """Host side -> container, until the host's end closes or the relay does."""
        try:
            while data := conn.recv(_CHUNK):
                if not self._send(cid, DATA, data):
                    break
        except OSError:
            pass
        if self._drop(cid):
            self._send(cid, CLOSE)

    def _demux(self) -> None:
        """Container -> host: parse the frames out of the exec's stdout."""
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
        if kind == SYNC:
            done = self._synced.get(cid)
            if done is not None:
                done.set()
        elif kind == DNS:
            if self._on_dns is not None:
                self._on_dns(payload.decode("ascii", "replace"))
        elif kind == OPEN:
            if cid == READY:
                self._listening.set()
            else:
                self._open(cid)
        else:
            with self._lock:
                conn = self._conns.get(cid)
            if conn is None:
                return
            if kind == DATA:
                try:
                    conn.sendall(payload)
                    return
                except OSError:
                    pass  # the host's end went away: close the container side too
                if self._drop(cid):
                    self._send(cid, CLOSE)
            elif kind == CLOSE:
                self._drop(cid)

    def _open(self, cid: int) -> None:
        """A connection the container opened: carried to ``connect``'s socket, or refused."""
        conn = self._connect() if self._connect is not None else None
        if conn is None:
            if self._refusal:
                self._send(cid, DATA, self._refusal)
            self._send(cid, CLOSE)
            return
        with self._lock:
            if self._closed:
                _close_all([conn])
                return
            self._conns[cid] = conn
        self._start_pump(cid, conn)

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
