"""Helpers shared by the snapshot tests of the back ends (Docker, gateway)."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import zipfile
from pathlib import Path


def resign(path: Path, out: Path, change: dict[str, object], key: bytes) -> None:
    """A copy of the snapshot with its manifest changed, signed again with the right key."""
    data = path.read_bytes()
    fresh = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data[40:])) as src, zipfile.ZipFile(fresh, "w") as dst:
        for info in src.infolist():
            content = src.read(info)
            if info.filename == "manifest.json":
                content = json.dumps({**json.loads(content), **change}).encode()
            dst.writestr(info, content)
    signed = fresh.getvalue()
    out.write_bytes(data[:8] + hmac.new(key, signed, hashlib.sha256).digest() + signed)
