"""The WebSocket side of a gateway kernel: jupyter_client's client calls over one socket.

``GatewayChannels`` speaks the calls of jupyter_client's ``AsyncKernelClient`` that the kernel
executor uses (``KernelClientLike``) over a gateway's channels endpoint
(``/api/kernels/{id}/channels``). A dropped socket is reconnected with the same session id, which
makes the server replay what it buffered meanwhile; if it cannot be reconnected, every pending and
later ``get_*_msg`` raises ``GatewayUnavailable``. The kernel's life (REST) is ``gateway_kernel``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import struct
from collections.abc import Mapping
from typing import Any

from jupyter_client.jsonutil import extract_dates, json_default
from jupyter_client.session import Session
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from .._errors import GatewayUnavailable, KernelStartFailed
from ._gateway_errors import translate_errors

# iopub states the server broadcasts (with no parent) when the kernel process died under it.
_DEATH_STATES = frozenset({"restarting", "dead"})
_CHANNELS = ("shell", "iopub", "stdin", "control")
_CLOSED = "the kernel's WebSocket is closed"


class GatewayChannels:
    """The ``KernelClientLike`` calls over one WebSocket to a gateway's channels endpoint."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        reconnect_attempts: int,
        backoff: float,
        reconnect_timeout: float,
    ) -> None:
        """``url`` is the channels endpoint (ws:// or wss://, with the session id and token);
        a dropped socket is reopened up to ``reconnect_attempts`` times, ``backoff`` seconds
        apart at first (doubled each time), each attempt given ``reconnect_timeout`` seconds."""
        self._url = url
        self._headers = dict(headers)
        self._reconnect_attempts = reconnect_attempts
        self._backoff = backoff
        self._reconnect_timeout = reconnect_timeout
        self.session = Session(key=b"", username="kernelexec")
        self._queues: dict[str, asyncio.Queue[dict[str, Any] | BaseException]] = {
            name: asyncio.Queue() for name in _CHANNELS
        }
        self._ws: WebSocketClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self.kernel_died = False
        self.reconnects = 0

    # -- life -----------------------------------------------------------------------------------
    async def connect(self, timeout: float) -> None:
        self._ws = await self._open(timeout)
        self._reader = asyncio.create_task(self._read_forever(), name="kernelexec-gateway-ws")

    async def close(self) -> None:
        self._closing = True
        if self._ws is not None:
            _close_now(self._ws)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    def drop_connection(self) -> None:
        """Close the socket as a network failure would (the client then reconnects)."""
        if self._ws is not None:
            _close_now(self._ws)

    async def _open(self, timeout: float) -> WebSocketClientConnection:
        request = HTTPRequest(self._url, headers=self._headers, request_timeout=timeout)
        where = "GET " + self._url.split("?")[0]  # not the token in the query
        with translate_errors(where, unreachable="cannot open the kernel's WebSocket"):
            ws = await websocket_connect(request, max_message_size=512 * 1024 * 1024)
        # Request frames are small and latency-bound: send each at once (no Nagle batching).
        if ws.protocol is not None:
            ws.protocol.set_nodelay(True)
        return ws

    async def wait_ready(self, timeout: float) -> None:
        """Ask for kernel_info until the kernel answers (a fresh kernel may miss the first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            msg_id = self._send("shell", "kernel_info_request", {})
            with contextlib.suppress(queue.Empty):
                await self._await_reply(msg_id, min(2.0, max(deadline - loop.time(), 0.01)))
                self._drain()
                return
        raise KernelStartFailed(f"the gateway kernel did not answer within {timeout:g} s")

    async def run_quietly(self, code: str, timeout: float) -> None:
        msg_id = self.execute(code, silent=True, store_history=False)
        reply = await self._await_reply(msg_id, timeout)
        if reply["content"].get("status") != "ok":
            raise KernelStartFailed(f"kernel set-up failed: {reply['content'].get('evalue')}")
        self._drain()

    async def _await_reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msg = await self.get_shell_msg(timeout=max(deadline - loop.time(), 0.0))
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg

    def _drain(self) -> None:
        """Forget what arrived so far (status and replies of set-up requests)."""
        for q in self._queues.values():
            while not q.empty():
                item = q.get_nowait()
                if isinstance(item, BaseException):
                    q.put_nowait(item)
                    break

    # -- KernelClientLike -----------------------------------------------------------------------
    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool | None = None,
        stop_on_error: bool = True,
    ) -> str:
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history,
            "user_expressions": user_expressions or {},
            "allow_stdin": bool(allow_stdin),
            "stop_on_error": stop_on_error,
        }
        return self._send("shell", "execute_request", content)

    def input(self, string: str) -> None:
        self._send("stdin", "input_reply", {"value": string})

    def complete(self, code: str, cursor_pos: int) -> str:
        return self._send("shell", "complete_request", {"code": code, "cursor_pos": cursor_pos})

    def inspect(self, code: str, cursor_pos: int, detail_level: int = 0) -> str:
        content = {"code": code, "cursor_pos": cursor_pos, "detail_level": detail_level}
        return self._send("shell", "inspect_request", content)

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await self._get("iopub", timeout)

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await self._get("shell", timeout)

    async def get_stdin_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await self._get("stdin", timeout)

    async def get_control_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await self._get("control", timeout)

    # -- internals ------------------------------------------------------------------------------
    def _send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        if self._ws is None or self._closing:
            raise GatewayUnavailable(_CLOSED)
        msg = self.session.msg(msg_type, content)
        msg["channel"] = channel
        with translate_errors(f"send on {channel}", unreachable=_CLOSED):
            fut = self._ws.write_message(json.dumps(msg, default=json_default))
        # A write that fails later (socket dropped) is noticed, and reported, by the reader.
        fut.add_done_callback(_ignore_result)
        return str(msg["header"]["msg_id"])

    async def _get(self, channel: str, timeout: float | None) -> dict[str, Any]:
        q = self._queues[channel]
        try:
            item = await asyncio.wait_for(q.get(), timeout)
        except asyncio.TimeoutError:
            raise queue.Empty from None
        if isinstance(item, BaseException):
            q.put_nowait(item)  # every later call fails the same way
            raise item
        return item

    async def _read_forever(self) -> None:
        while not self._closing:
            assert self._ws is not None
            frame = await self._ws.read_message()
            if frame is None:
                if self._closing or not await self._reconnect():
                    return
                continue
            msg = _decode(frame)
            channel = msg.get("channel", "iopub")
            if channel == "iopub" and not msg.get("parent_header"):
                state = msg.get("content", {}).get("execution_state")
                if msg.get("msg_type") == "status" and state in _DEATH_STATES:
                    self.kernel_died = True
            if channel in self._queues:
                self._queues[channel].put_nowait(msg)

    async def _reconnect(self) -> bool:
        """Reopen the socket with the same session id, so the server replays its buffer."""
        delay = self._backoff
        error: BaseException | None = None
        for _ in range(self._reconnect_attempts):
            try:
                self._ws = await self._open(self._reconnect_timeout)
            except GatewayUnavailable as exc:
                error = exc
                await asyncio.sleep(delay)
                delay *= 2
                continue
            self.reconnects += 1
            return True
        failure = GatewayUnavailable(
            f"the kernel's WebSocket dropped and reconnecting failed: {error}"
        )
        failure.__cause__ = error
        for q in self._queues.values():
            q.put_nowait(failure)
        return False


def _close_now(ws: WebSocketClientConnection) -> None:
    """Send the close frame and close the socket at once.

    tornado otherwise waits up to 5 s for the server's answer before closing the socket, and a
    socket still open when its event loop ends is leaked.
    """
    protocol = ws.protocol
    ws.close()
    if protocol is not None and protocol.stream is not None:
        protocol.stream.close()


def _ignore_result(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # mark retrieved; the reader notices the broken socket


def _decode(frame: str | bytes) -> dict[str, Any]:
    """A channels message: a JSON text frame, or a binary frame carrying buffers."""
    if isinstance(frame, str):
        msg: dict[str, Any] = json.loads(frame)
    else:
        # jupyter_server's binary layout: count, offsets, then the JSON part and the buffers.
        (count,) = struct.unpack("!I", frame[:4])
        offsets = [*struct.unpack(f"!{count}I", frame[4 : 4 * (count + 1)]), len(frame)]
        parts = [frame[a:b] for a, b in itertools.pairwise(offsets)]
        msg = json.loads(parts[0].decode("utf-8"))
        msg["buffers"] = parts[1:]
    msg["header"] = extract_dates(msg.get("header", {}))
    msg["parent_header"] = extract_dates(msg.get("parent_header") or {})
    return msg
