"""Where the gateway back end's foreign errors become kernelexec's: tornado's HTTP client (the
REST calls) and its WebSocket client (the channels), in ``translate_errors``, once.

Connection failures and 5xx answers become ``GatewayUnavailable``, 401/403 ``GatewayAuthError``
(a 403 that mentions a limit is a server refusing more kernels, not a bad token), 404 the
internal ``NotFound``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tornado.httpclient import HTTPClientError
from tornado.websocket import WebSocketClosedError

from .._errors import GatewayAuthError, GatewayUnavailable


class NotFound(GatewayUnavailable):
    """404: the kernel is gone (internal; callers decide what it means)."""


@contextlib.contextmanager
def translate_errors(where: str, *, unreachable: str) -> Iterator[None]:
    """Raise tornado's failures inside the block as ``GatewayUnavailable`` (or a subclass).

    ``where`` names the request in HTTP answers' messages (``"GET http://host/api/..."``);
    ``unreachable`` starts the message of a connection failure (refused, unreachable, DNS), which
    ends with the OS's own words.
    """
    try:
        yield
    except HTTPClientError as exc:
        raise _from_http_error(where, exc) from exc
    except WebSocketClosedError as exc:
        raise GatewayUnavailable("the kernel's WebSocket is closed") from exc
    except OSError as exc:
        raise GatewayUnavailable(f"{unreachable}: {exc}") from exc


def _from_http_error(where: str, exc: HTTPClientError) -> GatewayUnavailable:
    detail = ""
    if exc.response is not None and exc.response.body:
        detail = exc.response.body.decode("utf-8", "replace")[:300]
    if exc.code == 599:  # tornado's code for a transport failure or a client-side timeout
        return GatewayUnavailable(f"gateway did not answer {where}: {exc.message}")
    if exc.code == 401 or (exc.code == 403 and "limit" not in detail.lower()):
        return GatewayAuthError(f"gateway refused the request ({exc.code}) {where}: {detail}")
    if exc.code == 404:
        return NotFound(f"not found on the gateway: {where}")
    return GatewayUnavailable(f"gateway answered {exc.code} to {where}: {detail or exc.message}")
