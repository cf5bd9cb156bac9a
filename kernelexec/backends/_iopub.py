"""Receiving IOPub in batches: one wait, then every message already queued, read without waits.

jupyter_client's ``get_iopub_msg`` costs an awaited poll and an awaited receive per message, and
its ``Session.deserialize`` parses the header dates of every message (dateutil): together most of
the host's time when a block sends thousands of small outputs. Here one poll is awaited, then the
socket is read with ``NOBLOCK`` until it is empty (or a batch is full, or an ``idle`` status came:
nothing after it is taken, it belongs to the next reader). Each message is checked as
``Session.deserialize`` checks it (HMAC signature, replayed signatures refused) and unpacked the
same way, except that the ``date`` fields stay ISO strings (kernelexec does not read them).

A message's content can be huge (a 100 MB exception message, a 50 MB repr). Its strings longer
than ``LONG_TEXT`` bytes are not decoded: each becomes a ``LongText`` over the received bytes (a
bounded value, its true length, the full text on demand a MiB at a time), so the host holds the
message once, not its bytes and a decoded copy of each huge string; the output collector spills
the full text and keeps a bounded form. A batch stops after a large message (``BATCH_BYTES``).

Frames are received without a copy (``copy=False``): a large one stays in the buffer libzmq
received it into, and the long strings point into that buffer. Received with a copy, a 200 MB
frame (a 100 MB exception: its value and its traceback) was briefly held twice.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import weakref
from collections.abc import Sequence
from hmac import compare_digest
from queue import Empty
from typing import Any

import zmq
from jupyter_client.adapter import adapt
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.session import Session

from .._budget import LONG_TEXT, LongText

#: messages taken in one batch at most (the receive queue holds 64; see ``_ready``): a batch of
#: 256 KiB stream messages stays a few MB
BATCH = 64
#: a batch ends once its messages hold this many bytes: one huge message is held at a time
BATCH_BYTES = 8 << 20
#: a content frame scanned for long strings holds at most this many strings; past it (a huge
#: structure of small strings, no string worth sparing) it is decoded as jupyter_client does
_MAX_STRINGS = 100_000
_QUOTE = re.compile(b'"')
_DELIM = b"<IDS|MSG>"  # between the routing identities and the message (jupyter_client's DELIM)

#: a received frame: ``bytes`` (tests, a copying receive) or a ``zmq.Frame`` (``copy=False``)
Frame = bytes | zmq.Frame

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

    def complete(self, code: str, cursor_pos: int) -> str:
        msg_id: str = self.kc.complete(code, cursor_pos)
        return msg_id

    def inspect(self, code: str, cursor_pos: int, detail_level: int = 0) -> str:
        msg_id: str = self.kc.inspect(code, cursor_pos, detail_level)
        return msg_id


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
            frames = _sync(socket).recv_multipart(zmq.NOBLOCK, copy=False)
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
    held = 0
    while len(msgs) < BATCH and held < BATCH_BYTES:
        try:
            frames = sync.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            break
        held += sum(len(_buffer(frame)) for frame in frames)
        msg = decode(session, frames)
        del frames  # a huge content frame lives on only in its message's LongTexts
        msgs.append(msg)
        if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
            break
    return msgs


def _buffer(frame: Frame) -> bytes | memoryview:
    """A frame's bytes, not copied (a ``zmq.Frame``'s own buffer)."""
    return frame if isinstance(frame, bytes) else frame.buffer


def _small(frame: bytes | memoryview) -> bytes:
    return frame if isinstance(frame, bytes) else frame.tobytes()


def decode(session: Session, frames: Sequence[Frame]) -> dict[str, Any]:
    """``Session.deserialize`` of a received message, its dates left as strings."""
    views = [_buffer(frame) for frame in frames]
    delimiter = next(
        (i for i, v in enumerate(views) if len(v) == len(_DELIM) and v == _DELIM), None
    )
    if delimiter is None:
        raise ValueError("DELIM not in msg_list")
    parts = views[delimiter + 1 :]
    if len(parts) < 5:
        raise TypeError("malformed message, must have at least 5 elements")
    if session.auth is not None:
        signature = _small(parts[0])
        if not signature:
            raise ValueError("Unsigned Message")
        if signature in session.digest_history:
            raise ValueError(f"Duplicate Signature: {signature!r}")
        session._add_digest(signature)
        if not compare_digest(signature, session.sign(parts[1:5])):
            raise ValueError(f"Invalid Signature: {signature!r}")
    unpack = session.unpack
    header = unpack(_small(parts[1]))
    message = {
        "header": header,
        "msg_id": header["msg_id"],
        "msg_type": header["msg_type"],
        "parent_header": unpack(_small(parts[2])),
        "metadata": unpack(_small(parts[3])),
        "content": unpack_bounded(parts[4], unpack),
        "buffers": [memoryview(b) for b in parts[5:]],
    }
    version = header.get("version")
    if isinstance(version, str) and version.split(".")[0] == "5" and "date" in header:
        return message  # the current protocol: adapt() would leave it as it is
    result: dict[str, Any] = adapt(message)
    return result


def unpack_bounded(frame: bytes | memoryview, unpack: Any = json.loads) -> Any:
    """``unpack(frame)``, except that in a frame over ``LONG_TEXT`` bytes each string literal
    longer than that stays undecoded, a ``LongText`` over ``frame`` (not copied)."""
    if len(frame) <= LONG_TEXT:
        return unpack(_small(frame))
    spans = _long_strings(frame)
    if not spans:
        return unpack(_small(frame))
    token = f"\x00kx-{secrets.token_hex(8)}-"
    parts, previous = [], 0
    for i, (start, end) in enumerate(spans):
        parts += [frame[previous : start - 1], json.dumps(f"{token}{i}").encode()]
        previous = end + 1
    parts.append(frame[previous:])
    view = memoryview(frame)
    longs = [LongText(view[start:end]) for start, end in spans]
    small = json.loads(b"".join(parts).decode("utf-8", errors="replace"))
    return _put_back(small, token, longs)


def _find_quote(frame: bytes | memoryview, pos: int) -> int:
    """The next ``"`` in ``frame`` from ``pos``; -1 when none (``re`` reads a buffer as it is)."""
    found = _QUOTE.search(frame, pos)
    return -1 if found is None else found.start()


def _escapes_before(frame: bytes | memoryview, start: int, end: int) -> int:
    """How many backslashes come just before ``end`` (not before ``start``)."""
    count, step = 0, 64
    while end - count > start:
        window = bytes(frame[max(start, end - count - step) : end - count])
        run = len(window) - len(window.rstrip(b"\\"))
        count += run
        if run < len(window):
            break
    return count


def _long_strings(frame: bytes | memoryview) -> list[tuple[int, int]]:
    """(start, end) of the body of each JSON string longer than ``LONG_TEXT`` bytes in
    ``frame``; none when it holds too many strings to look at (see ``_MAX_STRINGS``)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for _ in range(_MAX_STRINGS):
        start = _find_quote(frame, pos) + 1  # outside strings, a quote opens one
        if not start:
            return spans
        end = start
        while True:
            end = _find_quote(frame, end)
            if end == -1:
                return []  # not JSON: the decoder will say so
            escapes = _escapes_before(frame, start, end)
            if escapes % 2 == 0:  # not an escaped quote: the string ends here
                break
            end += 1
        if end - start > LONG_TEXT:
            spans.append((start, end))
        pos = end + 1
    return []


def _put_back(value: Any, token: str, longs: list[LongText]) -> Any:
    """``value`` with each placeholder string (``token`` + index) replaced by its LongText."""

    def real(item: Any) -> Any:
        if isinstance(item, str) and item.startswith(token):
            return longs[int(item[len(token) :])]
        return item

    root = [value]
    stack: list[Any] = [root]
    while stack:  # no recursion: a deeply nested message cannot exhaust the stack
        node = stack.pop()
        if isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, dict | list):
                    stack.append(item)
                else:
                    node[i] = real(item)
            continue
        for key in list(node):
            item = node.pop(key) if real(key) is not key else node[key]
            if isinstance(item, dict | list):
                stack.append(item)
            node[real(key)] = real(item)
    return root[0]
