"""Remote kernels on a Jupyter Kernel Gateway, Enterprise Gateway or Jupyter Server.

The kernel's life goes through the REST API (``/api/kernels``: start, interrupt, restart,
delete) and the messages through the WebSocket channels endpoint
(``/api/kernels/{id}/channels``). ``GatewayKernel.client`` speaks the same calls as
jupyter_client's ``AsyncKernelClient`` (see ``KernelClientLike``), so the kernel executor's
protocol code is the same for local, Docker and remote kernels.

Failures are translated here: connection errors and 5xx answers become ``GatewayUnavailable``
(retried with back-off where that is safe: reads, deletes, and the kernel start before anything
ran), 401/403 become ``GatewayAuthError``. A dropped WebSocket is reconnected with the same
session id, which makes the server replay what it buffered meanwhile; if it cannot be
reconnected, every pending and later ``get_*_msg`` raises ``GatewayUnavailable``.

Only tornado is used (it ships with jupyter_client and ipykernel): its async HTTP client and its
WebSocket client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import queue
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from jupyter_client.jsonutil import extract_dates, json_default
from jupyter_client.session import Session
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, websocket_connect

from .._errors import GatewayAuthError, GatewayUnavailable, KernelStartFailed
from .base import KernelBackend

# iopub states the server broadcasts (with no parent) when the kernel process died under it.
_DEATH_STATES = frozenset({"restarting", "dead"})
_CHANNELS = ("shell", "iopub", "stdin", "control")


@dataclass(frozen=True, kw_only=True)
class GatewayOptions:
    """How a ``GatewayKernel`` talks to its server (read once, when the back end is built)."""

    request_timeout: float = 30.0
    retries: int = 3  # extra attempts for the requests that are safe to repeat
    backoff: float = 0.25  # first wait between attempts; doubled each time
    reconnect_attempts: int = 5  # for a WebSocket dropped mid-execution
    validate_cert: bool = True


class GatewayKernel(KernelBackend):
    """A kernel started on a gateway at ``url`` and reached over REST + WebSocket.

    ``working_dir`` is where the kernel should work, as the server's machine sees it. None means
    the executor's own work dir, which is right when the gateway shares this file system
    (localhost or a shared volume). ``token`` defaults to ``$KERNELEXEC_GATEWAY_TOKEN``.
    ``username`` is sent as ``KERNEL_USERNAME``, which Enterprise Gateway checks against its
    authorized / unauthorized users (it refuses ``root`` by default).
    """

    kind = "gateway-kernel"
    inherits_host_env = False

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        kernel_name: str = "python3",
        working_dir: str | None = None,
        username: str | None = None,
        options: GatewayOptions | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ValueError(f"gateway url must be http(s)://host[:port][/base], got {url!r}")
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("KERNELEXEC_GATEWAY_TOKEN")
        self.kernel_name = kernel_name
        self.working_dir = working_dir
        self.username = username
        self.options = options or GatewayOptions()
        self.kernel_id: str | None = None
        self._http: AsyncHTTPClient | None = None
        self._client: GatewayClient | None = None
        self._cwd: str | None = None
        self._env: dict[str, str] = {}

    # -- KernelBackend -------------------------------------------------------------------------
    @property
    def workspace(self) -> str | None:
        return self.working_dir

    @property
    def client(self) -> GatewayClient:
        if self._client is None:
            raise GatewayUnavailable("the gateway kernel is not started")
        return self._client

    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        self._cwd = self.working_dir or str(work_dir)
        # Only the executor's own variables arrive here (inherits_host_env is False): the
        # host's secrets and paths are not the remote kernel's business.
        self._env = dict(env)
        server_env = {**self._env, "KERNEL_WORKING_DIR": self._cwd}
        if self.username:
            server_env["KERNEL_USERNAME"] = self.username
        body = {"name": self.kernel_name, "env": server_env}
        model = await self._call("POST", "/api/kernels", body, retry=True, timeout=timeout)
        self.kernel_id = str(model["id"])
        try:
            await self._connect(timeout)
        except BaseException:
            await self.shutdown()
            raise

    async def interrupt(self) -> None:
        await self._call("POST", f"{self._kernel_path()}/interrupt", {}, retry=False)

    async def restart(self, *, timeout: float) -> None:
        await self._disconnect()
        try:
            await self._call(
                "POST", f"{self._kernel_path()}/restart", {}, retry=False, timeout=timeout
            )
        except GatewayAuthError:
            raise
        except GatewayUnavailable:
            # Seen with Kernel Gateway: a 500 while it is auto-restarting a kernel that died.
            # A restart loses all state anyway, so a brand-new kernel is the same outcome.
            await self._replace(timeout)
            return
        await self._connect(timeout)

    async def _replace(self, timeout: float) -> None:
        """Delete the current kernel (best effort) and start a new one in its place."""
        if self.kernel_id is not None:
            with contextlib.suppress(GatewayUnavailable):
                await self._call("DELETE", self._kernel_path(), None, retry=True)
            self.kernel_id = None
        assert self._cwd is not None  # set by start(), which restart() follows
        await self.start(work_dir=Path(self._cwd), env=self._env, timeout=timeout)

    async def is_alive(self) -> bool:
        if self.kernel_id is None or (self._client is not None and self._client.kernel_died):
            return False
        try:
            model = await self._call("GET", self._kernel_path(), None, retry=True)
        except _NotFound:
            return False
        return model.get("execution_state") != "dead"

    def death_reason(self) -> str | None:
        if self._client is not None and self._client.kernel_died:
            return "the gateway reported that the kernel process died"
        return None

    async def shutdown(self) -> None:
        try:
            await self._disconnect()
            if self.kernel_id is not None:
                with contextlib.suppress(_NotFound):
                    await self._call("DELETE", self._kernel_path(), None, retry=True)
                self.kernel_id = None
        finally:
            if self._http is not None:
                self._http.close()
                self._http = None

    # -- connection -------------------------------------------------------------------------
    async def _connect(self, timeout: float) -> None:
        client = GatewayClient(self._ws_url(), self._headers(), self.options)
        try:
            await client.connect(timeout)
            await client.wait_ready(timeout)
            await client.run_quietly(_setup_code(self._cwd, self._env), timeout)
        except BaseException:
            await client.close()
            raise
        self._client = client

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _kernel_path(self) -> str:
        if self.kernel_id is None:
            raise GatewayUnavailable("the gateway kernel is not started")
        return f"/api/kernels/{quote(self.kernel_id)}"

    def _ws_url(self) -> str:
        base = "ws" + self.url[len("http") :]
        query = {"session_id": uuid.uuid4().hex}
        if self.token:
            query["token"] = self.token
        return f"{base}{self._kernel_path()}/channels?{urlencode(query)}"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        return headers

    # -- REST ---------------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        body: Any,
        *,
        retry: bool,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One REST call; JSON in and out. Retries only when told it is safe."""
        attempts = 1 + (self.options.retries if retry else 0)
        delay = self.options.backoff
        for attempt in range(attempts):
            try:
                return await self._call_once(method, path, body, timeout)
            except GatewayUnavailable as exc:
                if isinstance(exc, GatewayAuthError | _NotFound) or attempt == attempts - 1:
                    raise
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    async def _call_once(
        self, method: str, path: str, body: Any, timeout: float | None
    ) -> dict[str, Any]:
        if self._http is None:
            self._http = AsyncHTTPClient(force_instance=True)
        request = HTTPRequest(
            self.url + path,
            method=method,
            headers=self._headers(),
            body=None if body is None else json.dumps(body),
            request_timeout=timeout or self.options.request_timeout,
            validate_cert=self.options.validate_cert,
            allow_nonstandard_methods=True,
        )
        try:
            response = await self._http.fetch(request)
        except HTTPClientError as exc:
            raise _translate_http_error(method, self.url + path, exc) from exc
        except OSError as exc:  # refused, unreachable, DNS
            raise GatewayUnavailable(f"gateway {self.url} is unreachable: {exc}") from exc
        return _json_body(response)


class _NotFound(GatewayUnavailable):
    """404: the kernel is gone (internal; callers decide what it means)."""


def _translate_http_error(method: str, url: str, exc: HTTPClientError) -> GatewayUnavailable:
    detail = ""
    if exc.response is not None and exc.response.body:
        detail = exc.response.body.decode("utf-8", "replace")[:300]
    where = f"{method} {url}"
    if exc.code == 599:  # tornado's code for a transport failure or a client-side timeout
        return GatewayUnavailable(f"gateway did not answer {where}: {exc.message}")
    if exc.code == 401 or (exc.code == 403 and "limit" not in detail.lower()):
        return GatewayAuthError(f"gateway refused the request ({exc.code}) {where}: {detail}")
    if exc.code == 404:
        return _NotFound(f"not found on the gateway: {where}")
    return GatewayUnavailable(f"gateway answered {exc.code} to {where}: {detail or exc.message}")


def _json_body(response: HTTPResponse) -> dict[str, Any]:
    if not response.body:
        return {}
    data = json.loads(response.body)
    return data if isinstance(data, dict) else {"items": data}


def _setup_code(cwd: str | None, env: Mapping[str, str]) -> str:
    """Code run silently after each (re)start: the work dir and env, whatever the server allows.

    Servers filter the ``env`` of a start request (only ``KERNEL_*`` and an allow-list pass), and
    only some honour ``KERNEL_WORKING_DIR``; setting both from inside the kernel works on all.
    """
    lines = ["import os as _kx_os"]
    if env:
        lines.append(f"_kx_os.environ.update({json.dumps(dict(env))})")
    if cwd:  # on a remote machine the dir may not exist yet: make it (files stay there)
        lines.append(f"_kx_os.makedirs({cwd!r}, exist_ok=True)")
        lines.append(f"_kx_os.chdir({cwd!r})")
    lines.append("del _kx_os")
    return "\n".join(lines)


class GatewayClient:
    """The ``KernelClientLike`` calls over one WebSocket to a gateway's channels endpoint."""

    def __init__(self, url: str, headers: Mapping[str, str], options: GatewayOptions) -> None:
        self._url = url
        self._headers = dict(headers)
        self._options = options
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
        try:
            ws = await websocket_connect(request, max_message_size=512 * 1024 * 1024)
        except HTTPClientError as exc:
            raise _translate_http_error("GET", self._url.split("?")[0], exc) from exc
        except OSError as exc:
            raise GatewayUnavailable(f"cannot open the kernel's WebSocket: {exc}") from exc
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
            raise GatewayUnavailable("the kernel's WebSocket is closed")
        msg = self.session.msg(msg_type, content)
        msg["channel"] = channel
        try:
            fut = self._ws.write_message(json.dumps(msg, default=json_default))
        except WebSocketClosedError as exc:
            raise GatewayUnavailable("the kernel's WebSocket is closed") from exc
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
        delay = self._options.backoff
        error: BaseException | None = None
        for _ in range(self._options.reconnect_attempts):
            try:
                self._ws = await self._open(self._options.request_timeout)
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
