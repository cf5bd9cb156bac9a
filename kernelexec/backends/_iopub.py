"""Receiving IOPub in batches: one wait, then every message already queued, read without waits.

jupyter_client's ``get_iopub_msg`` costs an awaited poll and an awaited receive per message, and
its ``Session.deserialize`` parses the header dates of every message (dateutil): together most of
the host's time when a block sends thousands of small outputs. Here one poll is awaited, then the
socket is read with ``NOBLOCK`` until it is empty (or a batch is full, or an ``idle`` status came:
nothing after it is taken, it belongs to the next reader). Each message is checked as
``Session.deserialize`` checks it (HMAC signature, replayed signatures refused) and unpacked the
same way, except that the ``date`` fields stay ISO strings (kernelexec does not read them).
"""

from __future__ import annotations

import asyncio
import weakref
from hmac import compare_digest
from queue import Empty
from typing import Any, cast

import zmq
from jupyter_client.adapter import adapt
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.session import Session

#: messages taken in one batch at most (the receive queue holds 64; see ``_ready``): a batch of
#: 256 KiB stream messages stays a few MB
BATCH = 64

_shadows: weakref.WeakKeyDictionary[Any, zmq.Socket[bytes]] = weakref.WeakKeyDictionary()


class BatchingClient:
    """A jupyter_client ``AsyncKernelClient`` as the executor uses it (``KernelClientLike``),
    IOPub read in batches. Subclasses see every IOPub message through ``_seen``."""

    def __init__(self, kc: AsyncKernelClient) -> None:
        self.kc = kc

    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool | None = None,
        stop_on_error: bool = True,
    ) -> str:
        msg_id: str = self.kc.execute(
            code,
            silent=silent,
            store_history=store_history,
            user_expressions=user_expressions,
            allow_stdin=allow_stdin,
            stop_on_error=stop_on_error,
        )
        return msg_id

    def _seen(self, msg: dict[str, Any]) -> None:
        """Called with each IOPub message as it is handed out."""

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        msg: dict[str, Any] = await self.kc.get_iopub_msg(timeout=timeout)
        self._seen(msg)
        return msg

    async def get_iopub_batch(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """What IOPub holds after one wait; ``Empty`` when nothing came."""
        msgs = await receive_batch(self.kc, timeout)
        for msg in msgs:
            self._seen(msg)
        return msgs

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next shell reply: one awaited poll, then read and checked as IOPub is."""
        return await receive_one(self.kc.session, self.kc.shell_channel.socket, timeout)

    async def get_stdin_msg(self, timeout: float | None = None) -> dict[str, Any]:
        msg: dict[str, Any] = await self.kc.get_stdin_msg(timeout=timeout)
        return msg

    def input(self, string: str) -> None:
        self.kc.input(string)


async def iopub_batch(client: Any, timeout: float | None) -> list[dict[str, Any]]:
    """The next IOPub messages of any kernel client: a batch when it can give one."""
    batch = getattr(client, "get_iopub_batch", None)
    if batch is not None:
        msgs: list[dict[str, Any]] = await batch(timeout)
        return msgs
    if type(client) is AsyncKernelClient:
        return await receive_batch(client, timeout)
    return [await client.get_iopub_msg(timeout=timeout)]


def _sync(socket: Any) -> zmq.Socket[bytes]:
    """The same libzmq socket, read synchronously: no future and no loop turn per message."""
    sync = _shadows.get(socket)
    if sync is None:
        sync = _shadows[socket] = zmq.Socket.shadow(socket.underlying)
    return sync


async def receive_one(session: Session, socket: Any, timeout: float | None) -> dict[str, Any]:
    """Wait up to ``timeout`` s (None: no limit) for one message on ``socket``; ``Empty`` if
    none came."""
    if socket is None:
        raise Empty
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - loop.time())
        if not await socket.poll(None if left is None else int(left * 1000)):
            raise Empty
        try:
            frames = _sync(socket).recv_multipart(zmq.NOBLOCK)
        except zmq.Again:  # another reader took it first: wait again
            continue
        return decode(session, frames)


async def receive_batch(kc: AsyncKernelClient, timeout: float | None) -> list[dict[str, Any]]:
    """Wait up to ``timeout`` s for IOPub, then return what is queued (``Empty`` if nothing)."""
    socket = kc.iopub_channel.socket
    if socket is None:
        raise Empty
    timeout_ms = None if timeout is None else int(timeout * 1000)
    if not await socket.poll(timeout_ms):
        raise Empty
    sync = _sync(socket)
    session = kc.session
    msgs: list[dict[str, Any]] = []
    while len(msgs) < BATCH:
        try:
            frames = sync.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            break
        msg = decode(session, frames)
        msgs.append(msg)
        if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
            break
    return msgs


def decode(session: Session, frames: list[bytes]) -> dict[str, Any]:
    """``Session.deserialize`` of a received message, its dates left as strings."""
    _, rest = session.feed_identities(frames)
    parts = cast("list[bytes]", rest)  # received with copying: bytes
    if len(parts) < 5:
        raise TypeError("malformed message, must have at least 5 elements")
    if session.auth is not None:
        signature = parts[0]
        if not signature:
            raise ValueError("Unsigned Message")
        if signature in session.digest_history:
            raise ValueError(f"Duplicate Signature: {signature!r}")
        session._add_digest(signature)
        if not compare_digest(signature, session.sign(parts[1:5])):
            raise ValueError(f"Invalid Signature: {signature!r}")
    unpack = session.unpack
    header = unpack(parts[1])
    message = {
        "header": header,
        "msg_id": header["msg_id"],
        "msg_type": header["msg_type"],
        "parent_header": unpack(parts[2]),
        "metadata": unpack(parts[3]),
        "content": unpack(parts[4]),
        "buffers": [memoryview(b) for b in parts[5:]],
    }
    version = header.get("version")
    if isinstance(version, str) and version.split(".")[0] == "5" and "date" in header:
        return message  # the current protocol: adapt() would leave it as it is
    result: dict[str, Any] = adapt(message)
    return result
