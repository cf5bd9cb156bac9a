"""Remote kernels on a Jupyter Kernel Gateway, Enterprise Gateway or Jupyter Server.

The kernel's life goes through the REST API (``/api/kernels``: start, interrupt, restart,
delete), here, and the messages through the WebSocket channels endpoint
(``/api/kernels/{id}/channels``), in ``_gateway_channels``. ``GatewayKernel.client`` speaks the
same calls as jupyter_client's ``AsyncKernelClient`` (see ``KernelClientLike``), so the kernel
executor's protocol code is the same for local, Docker and remote kernels.

Failures of tornado's clients are translated in ``_gateway_errors``: connection errors and 5xx
answers become ``GatewayUnavailable`` (retried here with back-off where that is safe: reads,
deletes, and the kernel start before anything ran), 401/403 become ``GatewayAuthError``. A
dropped WebSocket is reconnected with the same session id, which makes the server replay what it
buffered meanwhile; if it cannot be reconnected, every pending and later ``get_*_msg`` raises
``GatewayUnavailable``.

Only tornado is used (it ships with jupyter_client and ipykernel): its async HTTP client and its
WebSocket client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse

from .._errors import GatewayAuthError, GatewayUnavailable, KernelStartFailed
from ._gateway_channels import GatewayChannels
from ._gateway_errors import NotFound, translate_errors
from ._remote import refuse_shared_fork
from ._remote import setup_code as _setup_code
from .base import KernelBackend


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
    # Shared only sometimes (localhost, a shared volume) and there is no way to tell: the
    # files API goes through the kernel, which is right either way.
    shares_work_dir = False

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
        self._client: GatewayChannels | None = None
        self._cwd: str | None = None
        self._env: dict[str, str] = {}
        #: another language's kernel beside a session's Python one (``other_kernel``): its
        #: kernelspec is checked against the gateway's list, and no Python set-up code is sent
        self._other_language = False

    # -- KernelBackend -------------------------------------------------------------------------
    @property
    def workspace(self) -> str | None:
        return self.working_dir

    def fresh_copy(self) -> GatewayKernel:
        """Another kernel on the same gateway (a fork made through a durable snapshot)."""
        refuse_shared_fork(self.kind, self.working_dir)
        return GatewayKernel(
            self.url,
            token=self.token,
            kernel_name=self.kernel_name,
            username=self.username,
            options=self.options,
        )

    @property
    def runs_other_kernels(self) -> bool:
        return True

    def other_kernel(self, kernel_name: str) -> KernelBackend | None:
        """A kernel of the kernelspec ``kernel_name`` on the same gateway, same folder."""
        other = GatewayKernel(
            self.url,
            token=self.token,
            kernel_name=kernel_name,
            working_dir=self.working_dir,
            username=self.username,
            options=self.options,
        )
        other._other_language = True
        return other

    @property
    def client(self) -> GatewayChannels:
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
        if self._other_language:
            await self._check_listed(timeout)
        model = await self._call("POST", "/api/kernels", body, retry=True, timeout=timeout)
        self.kernel_id = str(model["id"])
        try:
            await self._connect(timeout)
        except BaseException:
            await self.shutdown()
            raise

    async def _check_listed(self, timeout: float) -> None:
        """A kernelspec the gateway does not list is a clear error naming it (a gateway
        answers an unknown name with a 500 or a 404, or falls back to its default kernel)."""
        listing = await self._call("GET", "/api/kernelspecs", None, retry=True, timeout=timeout)
        specs = listing.get("kernelspecs")
        names = sorted(str(n) for n in specs) if isinstance(specs, dict) else []
        if self.kernel_name not in names:
            lists = ", ".join(names[:20]) or "none"
            raise KernelStartFailed(
                f"no kernelspec named {self.kernel_name!r} on the gateway {self.url}, "
                f"which lists: {lists}"
            )

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
        except NotFound:
            return False
        return model.get("execution_state") != "dead"

    async def seems_gone(self) -> bool:
        # What the gateway already told the channels (a "dead" status): no HTTP request.
        return self._client is not None and self._client.kernel_died

    def death_reason(self) -> str | None:
        if self._client is not None and self._client.kernel_died:
            return "the gateway reported that the kernel process died"
        return None

    async def shutdown(self) -> None:
        try:
            await self._disconnect()
            if self.kernel_id is not None:
                with contextlib.suppress(NotFound):
                    await self._call("DELETE", self._kernel_path(), None, retry=True)
                self.kernel_id = None
        finally:
            if self._http is not None:
                self._http.close()
                self._http = None

    # -- connection -------------------------------------------------------------------------
    async def _connect(self, timeout: float) -> None:
        client = GatewayChannels(
            self._ws_url(),
            self._headers(),
            reconnect_attempts=self.options.reconnect_attempts,
            backoff=self.options.backoff,
            reconnect_timeout=self.options.request_timeout,
        )
        try:
            await client.connect(timeout)
            await client.wait_ready(timeout)
            if not self._other_language:  # Python; the session sends another kernel its own
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
                if isinstance(exc, GatewayAuthError | NotFound) or attempt == attempts - 1:
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
        unreachable = f"gateway {self.url} is unreachable"
        with translate_errors(f"{method} {self.url + path}", unreachable=unreachable):
            response = await self._http.fetch(request)
        return _json_body(response)


def _json_body(response: HTTPResponse) -> dict[str, Any]:
    if not response.body:
        return {}
    data = json.loads(response.body)
    return data if isinstance(data, dict) else {"items": data}
