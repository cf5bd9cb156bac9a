"""The result model shared by every executor.

``CodeBlock`` goes in, ``ExecutionResult`` comes out. ``ExecutionResult.outputs`` holds nbformat v4
output dicts: the one output model. ``output`` (the text an LLM reads), ``files`` and the session
notebook are views of it.

The field names AG2 / AutoGen consumers read (``exit_code``, ``output``, ``code_file``,
``output_files``) are all present, so a result can be handed to them as it is.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ._door import read_regular
from ._render import show

# AutoGen's convention: 0 success, 1 error, 124 timeout.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_TIMEOUT = 124

# Raster formats vision chat APIs accept (SVG is not one of them).
# An image file past this is not put in a chat message (no API takes one that large).
_MAX_IMAGE_BYTES = 64 * 1024 * 1024
_IMAGE_SUFFIXES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}
_IMAGE_PREFERENCE = ("image/png", "image/jpeg", "image/gif", "image/webp")  # best first

NbOutput = dict[str, Any]
"""One nbformat v4 output (``stream``, ``display_data``, ``execute_result`` or ``error``)."""


@dataclass(frozen=True)
class CodeBlock:
    """A block of code and the language it is written in (as tagged in the message)."""

    code: str
    language: str = "python"


@dataclass(frozen=True)
class ErrorInfo:
    """An error raised by user code (not by kernelexec itself)."""

    ename: str
    evalue: str
    traceback: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.ename}: {self.evalue}" if self.evalue else self.ename


@dataclass(frozen=True, kw_only=True)
class NetworkEvent:
    """One connection the code asked the egress proxy for (``network=NetworkPolicy(...)``).

    ``allowed`` False means the proxy refused it and ``reason`` says why, in words a model can
    act on. Bytes count what crossed the proxy (``up``: from the code; ``down``: to it) until the
    connection ended, or until the block ended when it is still ``open``.
    """

    host: str
    port: int
    allowed: bool
    reason: str = ""
    method: str = "CONNECT"
    bytes_up: int = 0
    bytes_down: int = 0
    #: when the proxy received the request (``time.time()``)
    time: float = 0.0
    duration_s: float = 0.0
    open: bool = False
    #: the secrets (names, never values) whose value the proxy put in this request
    secrets_sent: tuple[str, ...] = ()
    #: secrets whose placeholder went to a host that does not carry them: left unsubstituted
    secrets_withheld: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for a result's ``output``."""
        verdict = "allowed" if self.allowed else f"refused: {self.reason}"
        if self.secrets_withheld:
            names = ", ".join(self.secrets_withheld)
            verdict += f"; secret_withheld: {names} (placeholder sent as is: not for this host)"
        return f"{self.method} {self.host}:{self.port} {verdict}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "allowed": self.allowed,
            "reason": self.reason,
            "method": self.method,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "time": self.time,
            "duration_s": round(self.duration_s, 6),
            "open": self.open,
            "secrets_sent": list(self.secrets_sent),
            "secrets_withheld": list(self.secrets_withheld),
        }


@dataclass(frozen=True, kw_only=True)
class ExecutionResult:
    """What running one block (or a list of blocks) produced.

    ``exit_code`` is 0 on success, 1 when the code failed, 124 when it timed out; a stateless
    process may also report its own non-zero status. ``not_run`` is True when nothing of the
    block ran (refused as given, refused by the kernel, or the kernel had died before it was
    sent): ``error`` then says why, and nothing of the block has to be undone.
    """

    exit_code: int
    output: str = ""
    stdout: str = ""
    stderr: str = ""
    error: ErrorInfo | None = None
    outputs: list[NbOutput] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    code_file: str | None = None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    language: str = "python"
    kernel_died: bool = False
    state_lost: bool = False
    #: the kernel died in this block and the session went on from this checkpoint (a live
    #: snapshot, with ``checkpoint="block"``): only this block's effects were lost
    recovered_from: str | None = None
    not_run: bool = False
    full_output_file: Path | None = None
    execution_count: int | None = None
    block_results: list[ExecutionResult] = field(default_factory=list)
    #: the connections the code asked the egress proxy for during the block (an allowlist
    #: ``NetworkPolicy`` only; empty otherwise)
    network_log: list[NetworkEvent] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def output_files(self) -> list[str]:
        """AG2's name for the artifacts: their paths as strings."""
        return [str(p) for p in self.files]

    @property
    def exitcode(self) -> int:
        """AutoGen 0.2's spelling of ``exit_code``."""
        return self.exit_code

    def to_reply(self) -> str:
        """The AutoGen-style reply an executor agent sends back to the writer."""
        status = "execution succeeded" if self.ok else "execution failed"
        if self.not_run:
            status = "not run"
        elif self.timed_out:
            status = "execution timed out"
        return f"exitcode: {self.exit_code} ({status})\nCode output: {self.output}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (``--json`` on the command line)."""
        return {
            "exit_code": self.exit_code,
            "output": self.output,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "error": None
            if self.error is None
            else {
                "ename": self.error.ename,
                "evalue": self.error.evalue,
                "traceback": list(self.error.traceback),
            },
            "outputs": self.outputs,
            "files": self.output_files,
            "code_file": self.code_file,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "duration_s": round(self.duration_s, 6),
            "language": self.language,
            "kernel_died": self.kernel_died,
            "state_lost": self.state_lost,
            "not_run": self.not_run,
            "full_output_file": None
            if self.full_output_file is None
            else str(self.full_output_file),
            "network_log": [event.to_dict() for event in self.network_log],
        }

    def with_changes(self, **changes: Any) -> ExecutionResult:
        return replace(self, **changes)

    def image_parts(self, *, detail: str | None = None) -> list[dict[str, Any]]:
        """The images this result saved, as chat-API content parts with ``data:`` URLs.

        Image files among ``files`` come first; images shown inline (``display_data``) follow
        unless the same bytes were already saved to a file. The parts use the OpenAI
        ``image_url`` shape, which OpenAI-compatible servers (vLLM, Ollama) accept too.
        """
        images: list[tuple[str, bytes]] = []
        for path in self.files:
            mime = _IMAGE_SUFFIXES.get(path.suffix.lower())
            raw = None if mime is None else read_regular(path, limit=_MAX_IMAGE_BYTES)
            if mime is not None and raw is not None:  # no FIFO, no link at the file's name
                images.append((mime, raw))
        for out in self.outputs:
            data = out.get("data") or {}
            # One output is one image: its best form (a PIL image carries PNG and JPEG).
            mime = next((m for m in _IMAGE_PREFERENCE if m in data), None)
            if mime is None:
                continue
            payload = data[mime]
            raw = payload if isinstance(payload, bytes) else base64.b64decode(payload)
            if all(raw != seen for _, seen in images):
                images.append((mime, raw))
        parts: list[dict[str, Any]] = []
        for mime, raw in images:
            image_url: dict[str, str] = {
                "url": f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
            }
            if detail is not None:
                image_url["detail"] = detail
            parts.append({"type": "image_url", "image_url": image_url})
        return parts

    def to_content_parts(self, *, detail: str | None = None) -> list[dict[str, Any]]:
        """The reply text then its images: a multimodal chat message's ``content``."""
        return [{"type": "text", "text": self.to_reply()}, *self.image_parts(detail=detail)]

    # In a host notebook (IPython), a result shows as the cell's own outputs would: each output
    # natively (a plot as image/png, a DataFrame as its table, errors as tracebacks), then a
    # status line when the block did not succeed.
    def _ipython_display_(self) -> None:
        show(self.outputs, footer=None if self.ok else self._status_line())

    def _status_line(self) -> str:
        if self.not_run:
            why = f": {self.error}" if self.error is not None else ""
            return f"[not run{why}]"
        if self.timed_out:
            return f"[timed out after {self.duration_s:.1f} s (exit code {self.exit_code})]"
        if self.kernel_died:
            return f"[the kernel died (exit code {self.exit_code})]"
        return f"[failed (exit code {self.exit_code})]"

    # Rich display for front ends that do not call _ipython_display_.
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.to_reply(), "text/html": self._repr_html_()}

    def _repr_html_(self) -> str:
        colour = "#2e7d32" if self.ok else "#c62828"
        parts = [
            f'<div><b style="color:{colour}">exit code {self.exit_code}</b>'
            f" <small>({self.duration_s:.3f} s)</small>",
            f"<pre>{html.escape(self.output)}</pre>",
        ]
        for out in self.outputs:
            data = out.get("data", {})
            for mime in ("image/png", "image/jpeg", "image/gif"):
                if mime in data:
                    payload = data[mime]
                    if isinstance(payload, bytes):
                        payload = base64.b64encode(payload).decode()
                    parts.append(f'<img src="data:{mime};base64,{payload}"/>')
                    break
            else:
                if "image/svg+xml" in data:
                    svg = data["image/svg+xml"]
                    parts.append(svg if isinstance(svg, str) else "".join(svg))
        parts.append("</div>")
        return "\n".join(parts)
