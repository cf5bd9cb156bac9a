"""The egress proxy: the one way out for code under ``network=NetworkPolicy(...)``.

The code's environment keeps no interface but loopback. This host-side proxy (HTTP ``CONNECT``
and plain HTTP forwarding, asyncio on a loop thread of its own) listens on a unix socket in a
private folder; the code reaches it on ``127.0.0.1:PROXY_PORT`` inside, where a small relay
carries each connection across:

* Docker (runc and gVisor alike): ``_docker_relay``'s relay runs in the container through one
  ``docker exec`` as a uid of its own (``RELAY_USER``: the block's ``kill -1`` and the kernel's
  reaper cannot touch it), listens on the loopback port and multiplexes its connections over
  the exec's stdin/stdout; its host side hands each to ``Egress.connect``.
  gVisor connects to no host unix socket (``--host-uds`` is off), so one transport serves both.
* bubblewrap: the proxy's socket is bound into the sandbox and ``SOCKET_RELAY_SCRIPT`` runs
  inside, relaying the loopback port to it.

The proxy decides on the request's host (the ``CONNECT`` target, the URL and its ``Host``
header, and a TLS client hello's server name when one is sent), resolves names itself and
connects to the address it checked; every attempt goes to the ``EgressLog`` that the executor
drains into each block's ``network_log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .._errors import BackendUnavailable
from .._network import Address, NetworkPolicy, normalize_name, parse_address
from .._types import NetworkEvent
from ._docker_relay import Relay
from ._secrets import Redactor, SessionSecrets, write_bundle
from ._wheels import WheelCache

log = logging.getLogger("kernelexec.egress")

#: the proxy's port on the code's loopback (``HTTP_PROXY=http://127.0.0.1:PROXY_PORT``)
PROXY_PORT = 3128
#: the uid:gid the in-container relay runs as: not the block's, so the block cannot signal it
RELAY_USER = "65533:65533"
#: a request head past this is refused (431)
MAX_HEAD = 64 * 1024
#: seconds a client may take to send its request head
HEAD_TIMEOUT = 30.0
_CHUNK = 65536
#: where a container's resolver points under a policy: the relay's DNS trap
DNS_TRAP = "127.0.0.1"
_NO_DNS = (
    "no DNS inside: names are resolved by the egress proxy, on the host, and only for "
    "allowed hosts (use the HTTP(S) proxy in HTTP_PROXY/HTTPS_PROXY)"
)
_PROXY_DOWN = (
    "the egress proxy was not running (it is restarted now: try again); "
    "kernelexec reported this, the code's request never left the host"
)


def sandbox_environment(egress: Egress, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus the proxy's variables, for a bubblewrap sandbox. Its interpreter is the
    host's, often a virtualenv (no user site), so pip installs into a folder of the sandbox's
    private /tmp (``PIP_TARGET``) that the code's Python finds first; named after the egress
    folder, so no host path of that name is bound there (PYTHONPATH's folders are shown)."""
    proxy = proxy_environment(egress.policy)
    del proxy["PIP_USER"]
    site = f"/tmp/{egress.folder.name}-site"
    # the session's packages= (installed at its start, read-only to the code) after the
    # block's own installs, so a block may still install another version for itself
    session = [str(egress.site)] if egress.policy.packages else []
    path = [site, *session, *filter(None, [env.get("PYTHONPATH")])]
    secret = {}
    if egress.secrets is not None and egress.bundle_path is not None:
        # the egress folder is bound read-only into the sandbox: the bundle keeps its path
        secret = egress.secrets.environment(str(egress.bundle_path))
    return {**env, **proxy, **secret, "PIP_TARGET": site, "PYTHONPATH": os.pathsep.join(path)}


def proxy_environment(policy: NetworkPolicy) -> dict[str, str]:
    """The variables that point the code's HTTP clients (and pip) at the proxy.

    ``NO_PROXY`` lists loopback only when no loopback address is allowed: with one allowed
    (``127.0.0.1:8080``, the host's own port) the code's requests to it must go through the
    proxy, which reaches the host's loopback, not the sandbox's.
    """
    url = f"http://127.0.0.1:{PROXY_PORT}"
    loopback = any(r.address is not None and r.address.is_loopback for r in policy.rules)
    no_proxy = "" if loopback else "localhost,127.0.0.1,::1"
    env = {"PIP_PROXY": url, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_USER": "1"}
    # The image's Python is the distribution's (PEP 668): user installs into the sandbox's own
    # HOME are what a session's packages are, not a change to the system's.
    env["PIP_BREAK_SYSTEM_PACKAGES"] = "1"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = url
    for name in ("NO_PROXY", "no_proxy"):
        env[name] = no_proxy
    return env


def host_index() -> tuple[str, list[str]]:
    """The package index the host's pip uses (``PIP_INDEX_URL``, else its configuration, else
    PyPI) and the allowlist entries its downloads need."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            url = proc.stdout.strip() if proc.returncode == 0 else ""
    url = url or "https://pypi.org/simple"
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or "pypi.org"
    hosts = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    if host == "pypi.org":
        hosts.append("files.pythonhosted.org:443")  # where PyPI's files are
    return url, hosts


# -- the log ---------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class _Record:
    host: str
    port: int
    method: str
    allowed: bool
    reason: str = ""
    up: int = 0
    down: int = 0
    started: float = field(default_factory=time.time)
    ended: float | None = None
    #: secrets (names) whose value went in the request, and placeholders left as they were
    secrets_sent: list[str] = field(default_factory=list)
    secrets_withheld: list[str] = field(default_factory=list)

    def event(self) -> NetworkEvent:
        end = self.ended if self.ended is not None else time.time()
        return NetworkEvent(
            host=self.host,
            port=self.port,
            allowed=self.allowed,
            reason=self.reason,
            method=self.method,
            bytes_up=self.up,
            bytes_down=self.down,
            time=self.started,
            duration_s=max(0.0, end - self.started),
            open=self.ended is None,
            secrets_sent=tuple(self.secrets_sent),
            secrets_withheld=tuple(self.secrets_withheld),
        )


class EgressLog:
    """Connection attempts since the last ``take``, at most ``limit`` kept (the rest counted)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._records: list[_Record] = []
        self._dropped = 0

    def add(self, record: _Record) -> _Record:
        with self._lock:
            if len(self._records) < self._limit:
                self._records.append(record)
            else:
                self._dropped += 1
        return record

    def take(self, settle: float = 0.5) -> list[NetworkEvent]:
        """The attempts so far as events; allowed connections still open get up to ``settle``
        seconds to end first (a client that just finished closes a moment later)."""
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            with self._lock:
                if all(r.ended is not None for r in self._records):
                    break
            time.sleep(0.02)
        with self._lock:
            records, self._records = self._records, []
            dropped, self._dropped = self._dropped, 0
        events = [r.event() for r in records]
        if dropped:
            events.append(
                NetworkEvent(
                    host="(more)",
                    port=0,
                    allowed=False,
                    reason=f"{dropped} more connection attempts, not listed (log limit "
                    f"{self._limit} per block)",
                    method="-",
                    time=time.time(),
                )
            )
        return events


# -- the proxy -------------------------------------------------------------------------------------
class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class EgressProxy:
    """The proxy's server: a loop thread serving ``socket_path`` until ``stop``."""

    def __init__(
        self,
        policy: NetworkPolicy,
        socket_path: Path,
        egress_log: EgressLog,
        secrets: SessionSecrets | None = None,
    ) -> None:
        self.policy = policy
        self.secrets = secrets
        self.socket_path = socket_path
        self.log = egress_log
        self._open = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._server is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="kernelexec-egress")
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Stop serving: open connections are cut, the socket goes. Safe to call twice."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
        self._server = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            self._server = loop.run_until_complete(
                asyncio.start_unix_server(self._serve, path=str(self.socket_path))
            )
            os.chmod(self.socket_path, 0o666)  # the folder's mode and owner guard it
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server, self._server = self._server, None
            if server is not None:
                server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        except Exception:  # one connection's bug must not end the proxy
            log.exception("kernelexec egress proxy: a connection failed")
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except asyncio.LimitOverrunError:
            await _reply(writer, 431, "the request head is longer than 64 KiB")
            return
        request = _parse_head(head)
        if request is None:
            await _reply(writer, 400, "not an HTTP proxy request")
            return
        method, host, port, rest = request
        record = self.log.add(_Record(host=host, port=port, method=method, allowed=False))
        try:
            if self._open >= self.policy.max_connections:
                raise _Refused(
                    503,
                    f"too many connections open at once (limit {self.policy.max_connections})",
                )
            self._open += 1
            try:
                await self._forward(record, method, rest, head, reader, writer)
            finally:
                self._open -= 1
        except _Refused as refused:
            record.reason = refused.reason
            record.allowed = False
            await _reply(writer, refused.status, refused.reason)
        finally:
            record.ended = time.time()

    async def _forward(
        self,
        record: _Record,
        method: str,
        rest: bytes,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        host, port = record.host, record.port
        reason = self.policy.check_request(host, port)
        if reason is not None:
            raise _Refused(403, reason)
        address = await self._resolve(host, port)
        secrets = self.secrets
        if method == "CONNECT" and secrets is not None and secrets.carries(host, port):
            await self._intercept(secrets, record, address, reader, writer)
            return
        redactor = None
        if secrets is not None and method != "CONNECT":
            rest = _rewrite(secrets, record, rest)
            redactor = secrets.redactor(host, port)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(str(address), port), self.policy.connect_timeout
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise _Refused(502, f"cannot connect to {host}:{port} ({address}): {exc}") from exc
        record.allowed = True
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                await self._check_sni(record, reader, up_writer)
            else:
                up_writer.write(rest)
                record.up += len(rest)
            await self._pump(record, reader, writer, up_reader, up_writer, redactor)
        finally:
            up_writer.close()

    async def _intercept(
        self,
        secrets: SessionSecrets,
        record: _Record,
        address: Address,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """A CONNECT to a secret's host: TLS terminated here with the session CA, upstream
        verified as any client would, the request's placeholders replaced (see ``_secrets``).
        One request per connection (``Connection: close``): each head is read and rewritten."""
        host, port = record.host, record.port
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(
                    str(address), port, ssl=secrets.upstream_context, server_hostname=host
                ),
                self.policy.connect_timeout,
            )
        except ssl.SSLError as exc:
            raise _Refused(
                502, f"{host}:{port} (a secret's host) failed TLS verification: {exc}"
            ) from exc
        except (OSError, asyncio.TimeoutError) as exc:
            raise _Refused(502, f"cannot connect to {host}:{port} ({address}): {exc}") from exc
        record.allowed = True
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            try:
                if sys.version_info < (3, 11):  # no StreamWriter.start_tls before 3.11
                    raise ssl.SSLError("secrets need Python 3.11 or later on the host")
                await writer.start_tls(secrets.server_context, ssl_handshake_timeout=HEAD_TIMEOUT)
            except (ssl.SSLError, ConnectionError) as exc:
                record.allowed = False
                record.reason = (
                    f"the code's TLS client did not accept kernelexec's session CA for this "
                    f"secret's host (a client that pins certificates cannot use secrets): {exc}"
                )
                raise OSError(record.reason) from exc
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            except asyncio.LimitOverrunError:
                record.reason = "the request head is longer than 64 KiB"
                await _reply(writer, 431, record.reason)
                writer.transport.abort()  # no TLS goodbye: the client is still sending
                return
            head = _rewrite(secrets, record, _close_after(head))
            up_writer.write(head)
            record.up += len(head)
            redactor = secrets.redactor(host, port)
            await self._pump(record, reader, writer, up_reader, up_writer, redactor)
        finally:
            # abort, not close: a TLS close waits for the server's goodbye, which a proxy
            # stopping (or a server gone quiet) would leave pending past the loop's end
            up_writer.transport.abort()

    async def _resolve(self, host: str, port: int) -> Address:
        literal = parse_address(host)
        if literal is not None:
            return literal  # allowed by address (check_request said so)
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM),
                self.policy.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise _Refused(502, f"{host} does not resolve on the host ({exc})") from exc
        reasons = []
        for info in infos:
            address = parse_address(str(info[4][0]))
            if address is None:
                continue
            why = self.policy.check_resolved(host, port, address)
            if why is None:
                return address
            reasons.append(why)
        raise _Refused(403, reasons[0] if reasons else f"{host} has no usable address")

    async def _check_sni(
        self, record: _Record, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter
    ) -> None:
        """A TLS client hello naming another server than the CONNECT target is cut (domain
        fronting through an allowed name); other first bytes pass as they are."""
        try:
            first = await asyncio.wait_for(reader.read(_CHUNK), HEAD_TIMEOUT)
        except asyncio.TimeoutError:
            return
        name = tls_server_name(first)
        expected = normalize_name(record.host) or record.host
        if name is not None and normalize_name(name) != expected:
            record.allowed = False
            record.reason = f"the TLS server name {name!r} is not the CONNECT target {expected!r}"
            raise OSError(record.reason)
        if first:
            record.up += len(first)
            up_writer.write(first)

    async def _pump(
        self,
        record: _Record,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        redactor: Redactor | None = None,
    ) -> None:
        limit = self.policy.max_upload_bytes

        async def upload() -> None:
            while data := await reader.read(_CHUNK):
                record.up += len(data)
                if record.up > limit:
                    record.reason = f"cut: the upload passed the limit of {limit} bytes"
                    return
                up_writer.write(data)
                await up_writer.drain()
            with contextlib.suppress(OSError):
                up_writer.write_eof()

        async def download() -> None:
            while data := await up_reader.read(_CHUNK):
                record.down += len(data)
                writer.write(data if redactor is None else redactor.feed(data))
                await writer.drain()
            if redactor is not None:
                writer.write(redactor.flush())
                await writer.drain()

        tasks = [asyncio.ensure_future(upload()), asyncio.ensure_future(download())]
        try:
            # The download ends the connection; an upload ending first only half-closes it.
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if tasks[0].done() and not tasks[1].done() and not record.reason:
                await asyncio.wait({tasks[1]})  # the answer to a finished request
            # else: the download ended it, or the upload was cut for the limit
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _rewrite(secrets: SessionSecrets, record: _Record, head: bytes) -> bytes:
    """``head`` with the placeholders of the record's host's secrets substituted; the names
    sent and withheld go to the record."""
    rewritten = secrets.rewrite_head(head, record.host, record.port)
    record.secrets_sent += rewritten.sent
    record.secrets_withheld += rewritten.withheld
    return rewritten.head


def _close_after(head: bytes) -> bytes:
    """A request head (inside a terminated TLS connection) asking the server to close after
    answering: the next request comes on a new connection, whose head is read again."""
    lines = head.split(b"\r\n")
    drop = (b"connection", b"keep-alive", b"proxy-connection")
    kept = [line for line in lines[1:] if line and line.split(b":")[0].strip().lower() not in drop]
    return b"\r\n".join([lines[0], *kept, b"Connection: close"]) + b"\r\n\r\n"


def _parse_head(head: bytes) -> tuple[str, str, int, bytes] | None:
    """``(method, host, port, head to send upstream)`` of a proxy request, or None."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:
        return None
    line, _, header_text = text.partition("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, target, version = parts
    headers = [h for h in header_text.split("\r\n") if h]
    if method == "CONNECT":
        hostport = _host_port(target, None)
        return None if hostport is None else (method, *hostport, b"")
    if not target.lower().startswith("http://"):
        return None
    authority, slash, path = target[7:].partition("/")
    hostport = _host_port(authority, 80)
    if hostport is None or "@" in authority:
        return None
    host, port = hostport
    kept = [f"{method} /{path if slash else ''} {version}"]
    for header in headers:
        name, _, value = header.partition(":")
        key = name.strip().lower()
        if key == "host":
            given = _host_port(value.strip(), 80)
            if given is None or (given[0].lower(), given[1]) != (host.lower(), port):
                return None  # a Host header naming another server than the URL
        if key in ("host", "connection", "proxy-connection", "proxy-authorization", "keep-alive"):
            continue
        kept.append(header)
    kept += [f"Host: {authority}", "Connection: close"]
    return method, host, port, ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1")


def _host_port(text: str, default: int | None) -> tuple[str, int] | None:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        return None
    if not port_text:
        return None if default is None else (host, default)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return host, int(port_text)


async def _reply(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    """A refusal the code's HTTP client reads, saying why (a model acts on the words)."""
    titles = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large"}
    title = titles.get(status, {502: "Bad Gateway", 503: "Service Unavailable"}.get(status, ""))
    body = f"kernelexec egress proxy refused the request: {reason}\n".encode()
    head = (
        f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        f"X-Kernelexec-Refused: {reason[:200]}\r\n\r\n"
    )
    writer.write(head.encode("utf-8", "replace") + body)
    with contextlib.suppress(OSError):
        await writer.drain()


def tls_server_name(data: bytes) -> str | None:
    """The server name (SNI) in a TLS client hello's first record, or None (not TLS, no SNI,
    cut short)."""
    try:
        if len(data) < 5 or data[0] != 0x16 or data[5] != 0x01:
            return None
        pos = 5 + 4 + 2 + 32  # record header, handshake header, version, random
        pos += 1 + data[pos]  # session id
        pos += 2 + struct.unpack_from(">H", data, pos)[0]  # cipher suites
        pos += 1 + data[pos]  # compression methods
        end = pos + 2 + struct.unpack_from(">H", data, pos)[0]
        pos += 2
        while pos + 4 <= end:
            kind, size = struct.unpack_from(">HH", data, pos)
            pos += 4
            if kind == 0:  # server_name: list length, type, name length, name
                name_len = struct.unpack_from(">H", data, pos + 3)[0]
                return data[pos + 5 : pos + 5 + name_len].decode("ascii")
            pos += size
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


# -- the owner: proxy, log, relays -----------------------------------------------------------------
class Egress:
    """One session's egress: its proxy (restarted when found dead), its log, its relays."""

    def __init__(self, policy: NetworkPolicy, *, shared: bool = False) -> None:
        self.policy = policy
        self.log = EgressLog(policy.max_log_entries)
        # A private folder (0700): only this process gets in, unless ``shared`` with a sandbox.
        self.folder = Path(tempfile.mkdtemp(prefix="kernelexec-egress-"))
        if shared:
            # A sandbox's user connects to the socket (0666) but may not list, add or remove
            # anything in the folder (root's, 0711).
            os.chmod(self.folder, 0o711)
        self.socket_path = self.folder / "proxy.sock"
        #: the session's placeholders and CA (``policy.secrets``), and the CA bundle's file
        self.secrets = SessionSecrets(policy) if policy.secrets else None
        self.bundle_path = write_bundle(self.secrets, self.folder) if self.secrets else None
        #: the session's wheelhouse (read-only inside; see ``_wheels``) and, in a sandbox, the
        #: site its ``packages=`` are installed into (read-only for the code too)
        self.wheels = self.folder / "wheels"
        self.site = self.folder / "site"
        #: a sandbox's resolver (``nameserver 127.0.0.1``: the launcher's DNS responder) and
        #: where that responder reports each name asked for (a datagram socket, drained by
        #: ``take_log``)
        self.resolv_conf = self.folder / "resolv.conf"
        self.dns_path = self.folder / "dns.sock"
        self._dns: socket.socket | None = None
        if shared:
            self.resolv_conf.write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:2\n")
            os.chmod(self.resolv_conf, 0o644)
            self._dns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._dns.bind(str(self.dns_path))
            self._dns.setblocking(False)
            os.chmod(self.dns_path, 0o666)
        if policy.packages:
            self.wheels.mkdir(mode=0o755)
            os.chmod(self.wheels, 0o755)
        self._lock = threading.Lock()
        self._proxy = EgressProxy(policy, self.socket_path, self.log, self.secrets)
        self._proxy.start()
        self._relays: dict[str, Relay] = {}
        self.restarts = 0

    @property
    def proxy(self) -> EgressProxy:
        return self._proxy

    @contextlib.contextmanager
    def widened(self, hosts: Sequence[str]) -> Iterator[None]:
        """The policy plus ``hosts`` while the block runs (a session's package install, before
        any code of the session's runs)."""
        proxy = self._proxy
        proxy.policy = self.policy.with_hosts(hosts)
        try:
            yield
        finally:
            proxy.policy = self.policy

    def ensure_running(self) -> bool:
        """Restart the proxy when it is found dead (after each block, and at once when a
        relayed connection found it so); True when it was restarted."""
        with self._lock:
            if self._proxy.alive:
                return False
            log.warning("kernelexec: the egress proxy had stopped; restarting it")
            self._proxy.stop()
            self._proxy = EgressProxy(self.policy, self.socket_path, self.log, self.secrets)
            self._proxy.start()
            self.restarts += 1
            return True

    def connect(self) -> socket.socket | None:
        """A connection to the proxy for one relayed connection; None (logged as a refusal,
        the proxy restarted) when it is down."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if not self._proxy.alive:
                raise ConnectionRefusedError("the proxy is not running")
            sock.connect(str(self.socket_path))
            return sock
        except OSError:
            sock.close()
        self.log.add(_down_record())
        threading.Thread(target=self.ensure_running, daemon=True).start()
        return None

    def dns_refused(self, name: str) -> None:
        """A DNS query from the code (refused inside): logged, never sent anywhere. The name is
        the code's bytes: anything but a name's characters is shown as ``?`` (a newline in a
        label must not forge a line of the block's output)."""
        shown = re.sub(r"[^A-Za-z0-9._*-]", "?", name[:253])
        self.log.add(
            _Record(
                host=shown or "(empty name)",
                port=53,
                method="DNS",
                allowed=False,
                reason=_NO_DNS,
                ended=time.time(),
            )
        )

    def take_log(self) -> list[NetworkEvent]:
        """The block's attempts; a proxy found dead meanwhile is restarted (the block's code saw
        its requests refused saying so)."""
        if self.ensure_running():
            # Found dead after the block: a sandbox's relay met the closed socket (and told the
            # code so); the block's log says it too.
            self.log.add(_down_record())
        with self._lock:
            relays = list(self._relays.values())
        for relay in relays:
            if relay.alive:
                relay.sync(_SYNC_TIMEOUT)
        self._drain_dns()
        return self.log.take()

    def _drain_dns(self) -> None:
        """Log the names a sandbox's DNS responder reported: each was sent before its query
        was answered, so a block's are all queued when its result is read."""
        while self._dns is not None:
            try:
                name = self._dns.recv(512)
            except OSError:  # nothing more (or closed)
                return
            self.dns_refused(name.decode("ascii", "replace"))

    def add_relay(self, key: str, relay: Relay) -> None:
        with self._lock:
            old = self._relays.pop(key, None)
            self._relays[key] = relay
        if old is not None:
            old.close()

    def drop_relay(self, key: str) -> None:
        with self._lock:
            relay = self._relays.pop(key, None)
        if relay is not None:
            relay.close()

    def close(self) -> None:
        with self._lock:
            relays, self._relays = list(self._relays.values()), {}
        for relay in relays:
            relay.close()
        self._proxy.stop()
        dns, self._dns = self._dns, None
        if dns is not None:
            dns.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_SYNC_TIMEOUT = 5.0  # seconds a block's result waits for its relay's frames, at most


#: ``run(pip install arguments) -> (exit status, output)``: pip run where the packages go
PipRun = Callable[[list[str]], tuple[int, str]]


def install_packages(egress: Egress, run: PipRun, wheels_inside: str) -> None:
    """Install the policy's packages with ``run``: from the host's wheel cache alone when it has
    them (no network at all), else after the host filled the cache, the index's hosts allowed
    for this step only (no code of the session runs yet). ``wheels_inside``: where ``run`` sees
    the session's wheelhouse. ``BackendUnavailable`` with pip's words when it fails."""
    specs = list(egress.policy.packages)
    cache = WheelCache.open()
    if cache is not None and cache.wheelhouse(egress.wheels, specs):
        code, _ = run(["--no-index", "--find-links", wheels_inside, "--", *specs])
        if code == 0:
            return
    url, hosts = host_index()
    if cache is not None and cache.fill(specs, url):
        cache.wheelhouse(egress.wheels, specs)
    links = ["--find-links", wheels_inside] if cache is not None else []
    with egress.widened(hosts):
        code, output = run(["--index-url", url, *links, "--", *specs])
    if code != 0:
        raise BackendUnavailable(
            f"installing the packages {specs} from {url} failed "
            f"(pip exit status {code}):\n{output[-3000:]}"
        )


def relay_refusal() -> bytes:
    """What the code's client reads when its connection finds the proxy down."""
    body = f"kernelexec: {_PROXY_DOWN}\n".encode()
    return (
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _down_record() -> _Record:
    return _Record(
        host="(proxy)",
        port=PROXY_PORT,
        method="-",
        allowed=False,
        reason=_PROXY_DOWN,
        ended=time.time(),
    )


# The helpers the script uses (copy, connect_when_listening, answer_dns), as source.
_INSIDE = Path(__file__).with_name("_relay_inside.py").read_text()

# -- bubblewrap: the sandbox's loopback port to the proxy's socket bound inside ------------------
# Runs inside the sandbox (``python -I -S -c SANDBOX_LAUNCHER SOCKET PORT MAX argv...``): binds
# the loopback port, forks the relay (its stdio closed: the block's output must end with the
# block), and execs ``argv``. The relay ends with the sandbox (its pid namespace).
SANDBOX_LAUNCHER = (
    _INSIDE
    + r"""
import os, socket, sys, threading
path, port, limit, report = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
argv = sys.argv[5:]
trap = os.environ.pop("KERNELEXEC_DNS_FD", None)
if os.environ.get("PIP_TARGET"):
    # pip installs there: a folder on the path that is missing when the interpreter starts is
    # never looked at again (the kernel's), so it exists from the start
    os.makedirs(os.environ["PIP_TARGET"], exist_ok=True)
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(128)
if os.fork():
    listener.close()
    if trap is not None:
        os.close(int(trap))
    os.execvp(argv[0], argv)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
active = [0]
lock = threading.Lock()
REFUSED = b"kernelexec: the egress proxy is not running\n"

def pump(src, dst):
    if copy(src, dst):
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

def serve(conn):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        head = b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
        try:
            conn.sendall(head % len(REFUSED) + REFUSED)
        except OSError:
            pass
    else:
        t = threading.Thread(target=pump, args=(up, conn), daemon=True)
        t.start()
        pump(conn, up)
        t.join()
    conn.close()
    up.close()
    with lock:
        active[0] -= 1

told = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

def tell_dns(name):
    # The sandbox's resolver is 127.0.0.1: each name goes to the host (which logs it) as a
    # datagram, before its query is answered; dropped when the host's queue is full.
    try:
        told.sendto(name, socket.MSG_DONTWAIT, report)
    except OSError:
        pass

if trap is not None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, fileno=int(trap))
    threading.Thread(target=answer_dns, args=(sock, tell_dns), daemon=True).start()
while True:
    conn, _ = listener.accept()
    with lock:
        full = active[0] >= limit
        if not full:
            active[0] += 1
    if full:
        conn.close()
        continue
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""
)


def sandbox_argv(egress: Egress, argv: list[str], python: str) -> list[str]:
    """``argv`` behind ``SANDBOX_LAUNCHER`` (run by ``python``, in the sandbox)."""
    limit = str(egress.policy.max_connections * 2)
    launcher = [python, "-I", "-S", "-c", SANDBOX_LAUNCHER, str(egress.socket_path)]
    return [*launcher, str(PROXY_PORT), limit, str(egress.dns_path), *argv]


# Run by root inside the sandbox, before its rights are dropped (``bwrap_argv(as_root=...)``):
# port 53 is a privileged port of the sandbox's network namespace, which the unprivileged
# launcher cannot bind. The socket is handed down by number (``KERNELEXEC_DNS_FD``); the
# launcher gives it to its relay and closes it before the code runs.
DNS_BINDER = r"""
import os, socket, sys
trap = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    trap.bind(("127.0.0.1", 53))
    os.set_inheritable(trap.fileno(), True)
    os.environ["KERNELEXEC_DNS_FD"] = str(trap.fileno())
except OSError:
    pass  # no responder: lookups fail unlogged
os.execv(sys.argv[1], sys.argv[1:])
"""


def sandbox_dns(egress: Egress) -> dict[str, Any]:
    """``bwrap_argv``'s arguments that give a sandbox the egress DNS responder."""
    return {
        "files": {str(egress.resolv_conf): "/etc/resolv.conf"},
        "as_root": [sys.executable, "-I", "-S", "-c", DNS_BINDER],
    }
