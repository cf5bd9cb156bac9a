"""The MCP tools over a ``Hub``, built with the official ``mcp`` SDK (the ``mcp`` extra).

``build_server(hub)`` returns an ``MCPServer`` whose tools are ``execute``, ``list_sessions``,
``restart``, ``interrupt``, ``close_session``, ``upload_file``, ``read_file``, ``list_files``,
``fork_session``, ``snapshot`` and ``restore`` (live snapshots: a durable one names a host path,
which an agent is not given) and, for detached blocks (``execute`` with ``detach``),
``job_status``, ``job_output`` and ``job_cancel``.
A tool's failure (unknown session, a path outside the work dir, ...) is a tool error the model
reads, never a protocol error. ``serve_stdio`` and ``serve_http`` run it.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import contextlib
import hmac
import json
import mimetypes
import os
import socket
import stat
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types import CallToolResult, ContentBlock, ImageContent, ResourceLink, TextContent

from .._door import Door
from .._errors import InvalidBlock, KernelExecError
from .._jobs import AsyncJob
from .._types import ExecutionResult, NbOutput
from .._version import __version__
from .hub import Hub

#: images larger than this are linked, not inlined
MAX_INLINE_IMAGE = 5 * 1024 * 1024
#: read_file returns at most this many bytes
MAX_READ = 2 * 1024 * 1024
#: progress notifications start after a block ran this long, and repeat at this interval
PROGRESS_AFTER = 1.0
_IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
}
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}

INSTRUCTIONS = """\
Run code in stateful IPython kernels. `execute` runs a block in a named session (created on first
use; "default" if none is given): variables, imports and files persist across calls. A block
past its timeout is interrupted and the session keeps its state. Images a block shows come back
as images; other files it writes come back as links. Use `upload_file` / `read_file` /
`list_files` for the session's work dir, `interrupt` to stop a running block, `restart` for a
clean kernel, `close_session` when done. A long block can run detached: `execute` with
`detach: true` returns a job id at once; read what it printed with `job_output` (from an
offset), see where it is with `job_status`, stop it with `job_cancel`. Blocks sent to the
session meanwhile run after it. A job outlives the connection that started it."""


_TOOL_ERRORS = (KernelExecError, ValueError, OSError)


def _text(text: str, *, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)


async def _tool_errors(call: Awaitable[CallToolResult]) -> CallToolResult:
    """kernelexec's own errors (and bad arguments) become tool errors the model can read."""
    try:
        return await call
    except _TOOL_ERRORS as exc:
        return _text(f"Error: {exc}", error=True)


def _status(result: ExecutionResult) -> str:
    if result.error is not None and result.error.ename == "JobCancelled":
        lost = "; the kernel was restarted and its state was lost" if result.state_lost else ""
        return f"cancelled{lost}"
    if result.not_run:
        lost = "; the kernel was restarted and its state was lost" if result.state_lost else ""
        return f"not run{lost}"
    if result.timed_out:
        return "timed out (the session and its state are kept)"
    if result.state_lost:
        return "failed; the kernel was restarted and its state was lost"
    return "ok" if result.ok else f"failed (exit code {result.exit_code})"


def result_content(result: ExecutionResult, work_dir: Path) -> list[ContentBlock]:
    """The text an LLM reads, each image as image content, other files as resource links."""
    text = result.output.rstrip("\n") or "(no output)"
    blocks: list[ContentBlock] = [TextContent(type="text", text=f"{text}\n[{_status(result)}]")]
    with Door(work_dir) as door:  # the code may have swapped a file for a link or a FIFO
        for path in result.files:
            st = _regular(door, path)
            if st is None:  # removed since the block ended, or no longer a regular file
                continue
            mime = _IMAGE_TYPES.get(path.suffix.lower())
            if mime is not None and st.st_size <= MAX_INLINE_IMAGE:
                try:
                    raw = door.read_bytes(path, head=MAX_INLINE_IMAGE)
                except (OSError, KernelExecError):
                    continue
                data = base64.b64encode(raw).decode("ascii")
                blocks.append(ImageContent(type="image", data=data, mime_type=mime))
                continue
            blocks.append(_link(path, work_dir, st.st_size))
    return blocks


def _regular(door: Door, path: Path) -> os.stat_result | None:
    """``path``'s lstat when it is a regular file reached through no link, else None."""
    try:
        st = door.lstat(path)
    except (OSError, KernelExecError):
        return None
    return st if st is not None and stat.S_ISREG(st.st_mode) else None


def _utf8_head(raw: bytes, *, cut: bool) -> str:
    """``raw`` as UTF-8 text; when the read was ``cut`` short, a character cut in two at its
    end is left out rather than calling the whole file binary."""
    return codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut)


def _inline_image(name: str, size: int) -> str | None:
    """The MIME type ``read_file`` sends a file named ``name`` as an image with (or None)."""
    mime = _IMAGE_TYPES.get(Path(name).suffix.lower())
    return mime if size <= MAX_INLINE_IMAGE else None


def _file_content(
    path: str, size: int, head: bytes, link: ResourceLink | None, mime: str | None
) -> CallToolResult:
    """read_file's answer from a file's first bytes (all of them for an inline image, of type
    ``mime``); a binary file is named with ``link``, or said to be the remote kernel's."""
    if mime is not None:
        encoded = base64.b64encode(head).decode("ascii")
        return CallToolResult(content=[ImageContent(type="image", data=encoded, mime_type=mime)])
    try:
        text = _utf8_head(head[:MAX_READ], cut=size > MAX_READ)
    except UnicodeDecodeError:
        if link is None:
            return _text(f"{path} is binary ({size} bytes); it lives with the remote kernel.")
        note = TextContent(type="text", text=f"{path} is binary ({size} bytes).")
        return CallToolResult(content=[note, link])
    if size > MAX_READ:
        text += f"\n[... truncated: the file has {size} bytes; read the first {MAX_READ}]"
    return _text(text)


def _link(path: Path, work_dir: Path, size: int) -> ResourceLink:
    try:
        name = path.resolve().relative_to(work_dir.resolve()).as_posix()
    except ValueError:
        name = path.name
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return ResourceLink(
        type="resource_link", name=name, uri=path.resolve().as_uri(), mime_type=mime, size=size
    )


def _execute_result(result: ExecutionResult, work_dir: Path) -> CallToolResult:
    return CallToolResult(content=result_content(result, work_dir), is_error=not result.ok)


def _job_state(session: str, job: AsyncJob) -> dict[str, Any]:
    """What ``job_status`` says of a job (JSON-ready)."""
    state: dict[str, Any] = {"job": job.id, "session": session, "status": job.status.value}
    if job.position is not None:
        state["position"] = job.position  # blocks that run before it (1: it is next)
    if job.started_at is not None:
        end = job.ended_at or time.time()
        state["running_s" if job.ended_at is None else "ran_s"] = round(end - job.started_at, 1)
    state["output_chars"] = job.log.end
    result = job.result
    if result is not None:
        state["exit_code"] = result.exit_code
        state["result"] = _status(result)
    return state


def _job_output(job: AsyncJob, offset: int) -> CallToolResult:
    """The job's text from ``offset`` on, then where it stands and the offset to ask next."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidBlock(f"offset must be a whole number >= 0, not {offset!r}")
    chunk, start = job.log.since(offset)
    notes = []
    if start > offset:
        notes.append(f"[characters {offset} to {start} were not kept]")
    result = job.result
    where = job.status.value if result is None else _status(result)
    if result is not None and result.error is not None and result.error.ename == "JobCancelled":
        where += f" ({result.error.evalue})"
    footer = f"[job {job.id} {where}; next offset {job.log.end}]"
    return _text("\n".join([*notes, chunk.rstrip("\n") or "(no new output)", footer]))


def _wants_progress(ctx: Context[Any, Any]) -> bool:
    """Whether the caller asked for progress notifications (sent a progress token)."""
    try:
        return progress_token_from_params(ctx.request_context.params) is not None
    except Exception:  # an SDK without the helper's shape: report anyway (a no-op if unasked)
        return True


class _Progress:
    """Collects a block's stream output; reports it as progress while the block runs."""

    def __init__(self) -> None:
        self.pending: list[str] = []

    def on_output(self, output: NbOutput) -> None:
        if output.get("output_type") == "stream":
            self.pending.append(str(output.get("text", "")))
            if len(self.pending) > 256:  # a chatty block: only the tail is reported
                self.pending = ["".join(self.pending)[-2000:]]

    async def report(self, ctx: Context[Any, Any]) -> None:
        start = time.monotonic()
        await anyio.sleep(PROGRESS_AFTER)
        while True:
            chunk, self.pending = "".join(self.pending), []
            elapsed = round(time.monotonic() - start, 1)
            message = chunk[-2000:] if chunk else f"running for {elapsed:g} s"
            await ctx.report_progress(elapsed, None, message)
            await anyio.sleep(PROGRESS_AFTER)


def build_server(hub: Hub, *, manage_hub: bool = True) -> MCPServer[Any]:
    """An ``MCPServer`` with kernelexec's tools over ``hub``.

    With ``manage_hub`` the server starts the hub when it starts serving and closes it when it
    stops (stdio: one connection). Over HTTP the caller runs the hub around the web server.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        if not manage_hub:
            yield
            return
        async with hub:
            yield

    server: MCPServer[Any] = MCPServer(
        "kernelexec",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        log_level="WARNING",
    )
    default_timeout = hub.options.timeout

    @server.tool()
    async def execute(
        code: str,
        ctx: Context[Any, Any],
        language: str = "python",
        session: str = "default",
        timeout: float | None = None,
        detach: bool = False,
    ) -> CallToolResult:
        """Run a code block in a session (created on first use); state persists across calls.

        language: python, shell / bash, r, javascript / js or typescript / ts (R and Deno run in
        kernels of their own in the session, started on first use; they share its files).
        timeout: seconds (default: the server's); a block past it is interrupted and the session
        keeps its state. detach: run it in the background and return a job id at once (see
        job_status, job_output, job_cancel); the timeout then still applies to the block.
        """

        async def run() -> CallToolResult:
            if detach:
                job = await hub.submit(
                    session,
                    code,
                    language,
                    timeout=default_timeout if timeout is None else timeout,
                )
                state = _job_state(session, job)
                return _text(
                    json.dumps(state)
                    + f"\nRunning detached. Read its output with job_output(job={job.id!r})."
                )
            if not _wants_progress(ctx):  # the common case: no task next to the block
                result, work_dir = await hub.execute(
                    session, code, language, timeout=default_timeout if timeout is None else timeout
                )
                return _execute_result(result, work_dir)
            progress = _Progress()
            failure: Exception | None = None
            async with anyio.create_task_group() as tg:
                tg.start_soon(progress.report, ctx)
                try:
                    result, work_dir = await hub.execute(
                        session,
                        code,
                        language,
                        timeout=default_timeout if timeout is None else timeout,
                        on_output=progress.on_output,
                    )
                except _TOOL_ERRORS as exc:  # raised out of the task group, not in a group
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            return _execute_result(result, work_dir)

        return await _tool_errors(run())

    @server.tool()
    async def job_status(job: str) -> CallToolResult:
        """Where a detached block is: queued (and its position), running, done or cancelled."""

        async def call() -> CallToolResult:
            session_name, found = hub.job(job)
            return _text(json.dumps(_job_state(session_name, found), indent=1))

        return await _tool_errors(call())

    @server.tool()
    async def job_output(job: str, offset: int = 0) -> CallToolResult:
        """A detached block's output from character ``offset`` on (0: from its start); the
        answer ends with its status and the offset to ask from next time."""

        async def call() -> CallToolResult:
            return _job_output(hub.job(job)[1], offset)

        return await _tool_errors(call())

    @server.tool()
    async def job_cancel(job: str) -> CallToolResult:
        """Stop a detached block (a kernel is interrupted and keeps its state; a queued job
        never runs). Cancelling a job that has ended changes nothing and says how it ended."""

        async def call() -> CallToolResult:
            _, found = hub.job(job)
            was = found.status.value
            result = await found.cancel()
            output = result.output.rstrip("\n") or "(no output)"
            return _text(
                f"job {found.id} was {was}; now {found.status.value}.\n{output}\n"
                f"[{_status(result)}]"
            )

        return await _tool_errors(call())

    @server.tool()
    async def list_sessions() -> CallToolResult:
        """The live sessions: name, executor, work dir, blocks run, busy, seconds idle."""
        return _text(json.dumps({"sessions": hub.describe()}, indent=1))

    @server.tool()
    async def restart(session: str = "default") -> CallToolResult:
        """Restart a session's kernel: a clean state, the same work dir and files."""

        async def call() -> CallToolResult:
            await hub.restart(session)
            return _text(f"Session {session!r} restarted; its variables are gone, files kept.")

        return await _tool_errors(call())

    @server.tool()
    async def interrupt(session: str = "default") -> CallToolResult:
        """Interrupt the block running in a session; the session keeps its state."""

        async def call() -> CallToolResult:
            ran = await hub.interrupt(session)
            return _text("Interrupted." if ran else f"No block is running in {session!r}.")

        return await _tool_errors(call())

    @server.tool()
    async def close_session(session: str = "default") -> CallToolResult:
        """Close a session: its kernel stops, its work dir and files are removed."""

        async def call() -> CallToolResult:
            await hub.close_session(session)
            return _text(f"Session {session!r} closed.")

        return await _tool_errors(call())

    @server.tool()
    async def fork_session(new_session: str, session: str = "default") -> CallToolResult:
        """Fork a kernel session: new_session starts with the same variables and imports and a
        copy of its files; the two then diverge. Refused while a block runs in the session."""

        async def call() -> CallToolResult:
            await hub.fork(session, new_session)
            return _text(f"Session {session!r} forked into {new_session!r}.")

        return await _tool_errors(call())

    @server.tool()
    async def snapshot(session: str = "default") -> CallToolResult:
        """Take a live snapshot of a kernel session (its state and files); returns its id, for
        restore. It lasts as long as the session."""

        async def call() -> CallToolResult:
            key = await hub.snapshot(session)
            return _text(f"Snapshot {key} of session {session!r} taken.")

        return await _tool_errors(call())

    @server.tool()
    async def restore(snapshot_id: str, session: str = "default") -> CallToolResult:
        """Put a kernel session back to a snapshot of it (or of the session it was forked
        from): its variables and files become the snapshot's."""

        async def call() -> CallToolResult:
            await hub.restore(session, snapshot_id)
            return _text(f"Session {session!r} restored to {snapshot_id}.")

        return await _tool_errors(call())

    @server.tool()
    async def upload_file(
        path: str, content: str, session: str = "default", encoding: str = "utf-8"
    ) -> CallToolResult:
        """Write a file into a session's work dir (the session starts if new).

        encoding: utf-8 (text) or base64 (bytes).
        """

        async def call() -> CallToolResult:
            if encoding == "base64":
                try:
                    data = base64.b64decode(content, validate=True)
                except binascii.Error as exc:
                    raise ValueError(f"content is not valid base64: {exc}") from None
            elif encoding in {"utf-8", "utf8", "text"}:
                data = content.encode("utf-8")
            else:
                raise ValueError("encoding must be 'utf-8' or 'base64'")
            await hub.open(session)
            await hub.write_file(session, path, data)
            return _text(f"Wrote {len(data)} bytes to {path} in session {session!r}.")

        return await _tool_errors(call())

    @server.tool()
    async def read_file(path: str, session: str = "default") -> CallToolResult:
        """Read a file from a session's work dir: text as text, images as images."""

        async def call() -> CallToolResult:
            target, remote = hub.locate(session, path)
            if remote:
                data = await hub.read_remote(session, path)
                return _file_content(path, len(data), data, None, _inline_image(path, len(data)))
            with Door(hub.path(session, ".")) as door:
                try:  # regular files only, no link followed: never a FIFO that blocks
                    with door.open_regular(target) as (handle, size):
                        mime = _inline_image(target.name, size)
                        head = handle.read(size if mime else min(size, MAX_READ))
                except (FileNotFoundError, IsADirectoryError):
                    raise ValueError(f"no such file in the work dir: {path}") from None
            link = _link(target, hub.path(session, "."), size)
            return _file_content(path, size, head, link, mime)

        return await _tool_errors(call())

    @server.tool()
    async def list_files(path: str = ".", session: str = "default") -> CallToolResult:
        """The files under a folder of a session's work dir (recursive), with their sizes."""

        async def call() -> CallToolResult:
            files = await hub.list_files_async(session, path)
            return _text(json.dumps({"files": files}, indent=1))

        return await _tool_errors(call())

    return server


# -- transports -------------------------------------------------------------------------------


async def serve_stdio(hub: Hub) -> None:
    """Serve over stdin/stdout until the client closes stdin.

    The SDK points fd 1 at stderr while it serves; the hub (and so every kernel) starts inside
    that, so a kernel's stray output never lands between protocol messages.
    """
    await build_server(hub).run_stdio_async()


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond this machine without a bearer token."""
    if host not in _LOCAL_HOSTS and not token:
        raise PermissionError(
            f"refusing to listen on {host} without a bearer token: anyone who can reach it could "
            "run code here. Set KERNELEXEC_MCP_TOKEN (or --token), or bind 127.0.0.1."
        )


ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def require_bearer(app: ASGIApp, token: str) -> ASGIApp:
    """An ASGI wrapper answering 401 to any HTTP request without ``Authorization: Bearer``."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"text/plain"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b"missing or wrong token\n"})
                return
        await app(scope, receive, send)

    return guarded


async def serve_http(
    hub: Hub, *, host: str = "127.0.0.1", port: int = 8000, token: str | None = None
) -> None:
    """Serve streamable HTTP at ``http://host:port/mcp``; prints the URL on stderr when ready."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    check_bind(host, token)
    server = build_server(hub, manage_hub=False)
    security = None
    if host not in _LOCAL_HOSTS:  # the token guards it; the Host header is whatever clients use
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app: ASGIApp = server.streamable_http_app(host=host, transport_security=security)
    if token:
        app = require_bearer(app, token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
        bound = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        web = uvicorn.Server(config)
        async with hub:
            shown = f"[{host}]" if ":" in host else host
            print(f"kernelexec mcp: listening on http://{shown}:{bound}/mcp", file=sys.stderr)
            sys.stderr.flush()
            await web.serve(sockets=[sock])
    finally:
        sock.close()
