"""The parts the in-sandbox and in-container relays share: shipped as source, at the head of
each script that runs there (``RELAY_SCRIPT``, ``SANDBOX_LAUNCHER``, ``BRIDGE_SCRIPT``), never
imported by them. The standard library only, and no kernelexec import: the interpreter there
may be the image's, not the host's.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def copy(src: socket.socket, dst: socket.socket) -> bool:
    """Carry ``src``'s bytes to ``dst`` until ``src`` ends (True) or either fails (False)."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                return True
            dst.sendall(data)
    except OSError:
        return False


def connect_when_listening(port: int, wanted: Callable[[], bool]) -> socket.socket | None:
    """A connection to the loopback ``port``, retried while ``wanted()`` (for up to 120 s): the
    host's client connects as soon as the relay runs, usually before the kernel listens. None
    once it is not wanted any more, or too late."""
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            if not wanted() or time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        else:
            conn.settimeout(None)
            return conn


def answer_dns(trap: socket.socket, tell: Callable[[bytes], object]) -> None:
    """Answer each DNS query on ``trap`` REFUSED (there is no DNS inside), telling ``tell`` its
    name first (the host logs it; told before answered, so a block's names are with the host
    by the time its result is read)."""
    while True:
        data, peer = trap.recvfrom(4096)
        pos, labels = 12, []
        try:
            while data[pos]:
                labels.append(data[pos + 1 : pos + 1 + data[pos]].decode("ascii", "replace"))
                pos += 1 + data[pos]
            question = data[12 : pos + 5]
        except IndexError:
            continue  # cut short: not a query
        tell(".".join(labels)[:253].encode())
        flags = bytes([0x80 | (data[2] & 0x79), 0x85])  # a response, REFUSED
        trap.sendto(data[:2] + flags + b"\0\1\0\0\0\0\0\0" + question, peer)
