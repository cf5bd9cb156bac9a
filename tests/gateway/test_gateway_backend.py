"""GatewayKernel itself, against real gateways: REST life cycle, the WebSocket client, failures.

A small stdlib HTTP server stands in for a failing gateway (in addition to the real ones) so
that retries can be counted.
"""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from gateway_servers import Gateway, free_port
from tornado.httpclient import HTTPClientError, HTTPRequest, HTTPResponse
from tornado.websocket import WebSocketClosedError

from kernelexec import GatewayAuthError, GatewayUnavailable
from kernelexec.backends._gateway_channels import GatewayChannels
from kernelexec.backends._gateway_errors import NotFound, translate_errors
from kernelexec.backends.gateway_kernel import GatewayKernel, GatewayOptions


async def collect_until_idle(
    client: GatewayChannels, msg_id: str, timeout: float
) -> list[dict[str, Any]]:
    """The iopub messages of one request, up to its idle status."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = await client.get_iopub_msg(timeout=deadline - time.monotonic())
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        got.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return got
    raise AssertionError(f"no idle status within {timeout} s; got {got}")


def stdout_of(messages: list[dict[str, Any]]) -> str:
    return "".join(
        m["content"]["text"]
        for m in messages
        if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
    )


def test_life_cycle_state_restart_and_shutdown(gateway: Gateway, tmp_path: Path) -> None:
    async def scenario() -> None:
        kernel = gateway.backend()
        await kernel.start(work_dir=tmp_path, env={"KX_TEST": "yes"}, timeout=60)
        try:
            kernel_id = kernel.kernel_id
            client = kernel.client
            msg_id = client.execute("import os; x = 41; print(os.getcwd(), os.environ['KX_TEST'])")
            out = stdout_of(await collect_until_idle(client, msg_id, 30))
            # The kernel works in the executor's dir and sees its env, on both servers.
            assert out == f"{tmp_path} yes\n"
            reply = await client.get_shell_msg(timeout=10)
            assert reply["content"]["status"] == "ok"
            assert await kernel.is_alive()

            await kernel.restart(timeout=60)
            assert kernel.kernel_id == kernel_id
            client = kernel.client
            msg_id = client.execute("print('x' in dir(), __import__('os').getcwd())")
            assert stdout_of(await collect_until_idle(client, msg_id, 30)) == f"False {tmp_path}\n"
        finally:
            await kernel.shutdown()
        assert not await kernel.is_alive()
        await kernel.shutdown()  # twice is fine

    asyncio.run(scenario())


def test_wrong_token_is_an_auth_error(gateway: Gateway, tmp_path: Path) -> None:
    async def scenario() -> None:
        with pytest.raises(GatewayAuthError, match="401"):
            await gateway.backend(token="not-the-token").start(
                work_dir=tmp_path, env={}, timeout=30
            )
        with pytest.raises(GatewayAuthError):
            await gateway.backend(token="").start(work_dir=tmp_path, env={}, timeout=30)

    asyncio.run(scenario())


def test_gateway_down_is_unavailable_after_retries(tmp_path: Path) -> None:
    kernel = GatewayKernel(
        f"http://127.0.0.1:{free_port()}", token="t", options=GatewayOptions(backoff=0.01)
    )
    started = time.monotonic()
    with pytest.raises(GatewayUnavailable, match="unreachable") as info:
        asyncio.run(kernel.start(work_dir=tmp_path, env={}, timeout=10))
    assert not isinstance(info.value, GatewayAuthError)
    assert time.monotonic() - started < 10


class _Failing(http.server.BaseHTTPRequestHandler):
    """Answers 503 ``fail`` times, then a kernel model; records every request."""

    fail = 2
    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        type(self).seen.append(f"{self.command} {self.path}")
        if len(self.seen) <= self.fail:
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"message": "overloaded"}')
            return
        body = json.dumps({"id": "k1", "execution_state": "idle"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def failing_server() -> Iterator[tuple[str, type[_Failing]]]:
    handler = type("Handler", (_Failing,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_safe_requests_are_retried_with_backoff(
    failing_server: tuple[str, type[_Failing]],
) -> None:
    url, handler = failing_server
    kernel = GatewayKernel(url, token="t", options=GatewayOptions(retries=3, backoff=0.01))
    kernel.kernel_id = "k1"
    # A GET is safe to repeat: two 503s, then the answer.
    assert asyncio.run(kernel.is_alive()) is True
    assert handler.seen == ["GET /api/kernels/k1"] * 3


def test_unsafe_requests_are_not_retried(failing_server: tuple[str, type[_Failing]]) -> None:
    url, handler = failing_server
    kernel = GatewayKernel(url, token="t", options=GatewayOptions(retries=3, backoff=0.01))
    kernel.kernel_id = "k1"
    # An interrupt is not repeated behind the caller's back: the first 503 is reported.
    with pytest.raises(GatewayUnavailable, match="503"):
        asyncio.run(kernel.interrupt())
    assert handler.seen == ["POST /api/kernels/k1/interrupt"]


def test_errors_persisting_past_the_retries_are_reported(
    failing_server: tuple[str, type[_Failing]], tmp_path: Path
) -> None:
    url, handler = failing_server
    handler.fail = 100
    kernel = GatewayKernel(url, token="t", options=GatewayOptions(retries=2, backoff=0.01))
    with pytest.raises(GatewayUnavailable, match="503"):
        asyncio.run(kernel.start(work_dir=tmp_path, env={}, timeout=10))
    assert handler.seen == ["POST /api/kernels"] * 3


def test_dropped_websocket_reconnects_and_loses_nothing(gateway: Gateway, tmp_path: Path) -> None:
    async def scenario() -> None:
        kernel = gateway.backend()
        await kernel.start(work_dir=tmp_path, env={}, timeout=60)
        try:
            client = kernel.client
            code = "import time\nfor i in range(6):\n    print(i, flush=True)\n    time.sleep(0.25)"
            msg_id = client.execute(code)
            await asyncio.sleep(0.5)
            client.drop_connection()  # as a network failure would, mid-execution
            messages = await collect_until_idle(client, msg_id, 30)
            assert stdout_of(messages).split() == [str(i) for i in range(6)]
            assert client.reconnects == 1
        finally:
            await kernel.shutdown()

    asyncio.run(scenario())


def test_dropped_websocket_that_cannot_reconnect_is_reported(
    gateway: Gateway, tmp_path: Path
) -> None:
    async def scenario() -> None:
        kernel = gateway.backend(options=GatewayOptions(backoff=0.01, reconnect_attempts=2))
        await kernel.start(work_dir=tmp_path, env={}, timeout=60)
        try:
            client = kernel.client
            client.execute("import time; time.sleep(2)")
            client._url = f"ws://127.0.0.1:{free_port()}/gone"  # the way back is closed
            client.drop_connection()
            started = time.monotonic()
            with pytest.raises(GatewayUnavailable, match="reconnecting failed"):
                while True:
                    await client.get_iopub_msg(timeout=10)
            assert time.monotonic() - started < 10
            with pytest.raises(GatewayUnavailable):  # and every later call too
                await client.get_shell_msg(timeout=1)
        finally:
            await kernel.shutdown()

    asyncio.run(scenario())


def test_get_msg_times_out_with_queue_empty(gateway: Gateway, tmp_path: Path) -> None:
    async def scenario() -> None:
        kernel = gateway.backend()
        await kernel.start(work_dir=tmp_path, env={}, timeout=60)
        try:
            # Seen once in three CI runs (Enterprise Gateway): a message already waiting right
            # after start(), a late status of the start's own requests. Only those may wait.
            for _ in range(20):
                try:
                    late = await kernel.client.get_iopub_msg(timeout=1.0)
                except queue.Empty:
                    break
                assert late["msg_type"] == "status", late
            began = time.monotonic()
            with pytest.raises(queue.Empty):  # what jupyter_client's client raises
                await kernel.client.get_iopub_msg(timeout=0.2)
            assert 0.15 < time.monotonic() - began < 10
        finally:
            await kernel.shutdown()

    asyncio.run(scenario())


def test_url_is_validated() -> None:
    with pytest.raises(ValueError, match="http"):
        GatewayKernel("localhost:8888")


def test_restart_refused_by_the_server_starts_a_new_kernel(
    gateway: Gateway, tmp_path: Path
) -> None:
    """A 500 on restart (Kernel Gateway answers so while it auto-restarts a dead kernel) falls
    back to deleting the kernel and starting a new one; the server's answer is injected."""

    async def scenario() -> None:
        kernel = gateway.backend()
        await kernel.start(work_dir=tmp_path, env={}, timeout=60)
        real_call = kernel._call

        async def refuse_restart(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            if method == "POST" and path.endswith("/restart"):
                raise GatewayUnavailable(f"gateway answered 500 to POST {path}")
            return await real_call(method, path, *args, **kwargs)

        try:
            old_id = kernel.kernel_id
            msg_id = kernel.client.execute("x = 41")
            await collect_until_idle(kernel.client, msg_id, 30)
            kernel._call = refuse_restart  # type: ignore[method-assign]
            await kernel.restart(timeout=60)
            assert kernel.kernel_id is not None and kernel.kernel_id != old_id
            with pytest.raises(NotFound):  # the old kernel was deleted
                await real_call("GET", f"/api/kernels/{old_id}", None, retry=True)
            msg_id = kernel.client.execute("print('x' in dir(), __import__('os').getcwd())")
            out = stdout_of(await collect_until_idle(kernel.client, msg_id, 30))
            assert out == f"False {tmp_path}\n"
        finally:
            await kernel.shutdown()

    asyncio.run(scenario())


def _http_error(code: int, body: bytes = b"") -> HTTPClientError:
    request = HTTPRequest("http://gw/api/kernels")
    response = HTTPResponse(request, code, buffer=io.BytesIO(body)) if code != 599 else None
    return HTTPClientError(code, "Timeout" if code == 599 else None, response)


_DOWN, _AUTH = GatewayUnavailable, GatewayAuthError


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (_http_error(401, b"bad"), _AUTH, "gateway refused the request (401) POST u: bad"),
        (_http_error(403), _AUTH, "gateway refused the request (403) POST u: "),
        (_http_error(403, b"limit hit"), _DOWN, "gateway answered 403 to POST u: limit hit"),
        (_http_error(404), NotFound, "not found on the gateway: POST u"),
        (_http_error(500), _DOWN, "gateway answered 500 to POST u: Internal Server Error"),
        (_http_error(599), _DOWN, "gateway did not answer POST u: Timeout"),
        (ConnectionRefusedError(111, "refused"), _DOWN, "no way in: [Errno 111] refused"),
        (WebSocketClosedError(), _DOWN, "the kernel's WebSocket is closed"),
    ],
)
def test_tornado_errors_are_translated_in_one_place(
    error: Exception, kind: type[GatewayUnavailable], message: str
) -> None:
    with (
        pytest.raises(GatewayUnavailable) as info,
        translate_errors("POST u", unreachable="no way in"),
    ):
        raise error
    assert type(info.value) is kind
    assert str(info.value) == message
    assert info.value.__cause__ is error


def test_other_errors_pass_through_translation() -> None:
    with pytest.raises(KeyError), translate_errors("POST u", unreachable="no way in"):
        raise KeyError("x")
