"""ExecutionResult.image_parts / to_content_parts: saved images as data-URL content parts."""

from __future__ import annotations

import base64
from pathlib import Path

from kernelexec import ExecutionResult

# The smallest valid PNG (1x1), and a different one-byte-changed payload for inline images.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
JPEG = b"\xff\xd8\xff\xe0fake-jpeg"


def data_url(mime: str, raw: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def test_saved_image_files_become_image_url_parts(tmp_path: Path) -> None:
    png, jpg, csv, svg = (tmp_path / n for n in ("a.png", "b.JPG", "c.csv", "d.svg"))
    png.write_bytes(PNG)
    jpg.write_bytes(JPEG)
    csv.write_text("x,y\n")
    svg.write_text("<svg/>")
    result = ExecutionResult(exit_code=0, files=[png, csv, jpg, svg, tmp_path / "gone.png"])
    assert result.image_parts() == [
        {"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}},
        {"type": "image_url", "image_url": {"url": data_url("image/jpeg", JPEG)}},
    ]
    assert result.image_parts(detail="low")[0]["image_url"]["detail"] == "low"


def test_inline_images_are_included_once(tmp_path: Path) -> None:
    png = tmp_path / "plot.png"
    png.write_bytes(PNG)
    other = b"\x89PNG-another-image"
    outputs = [
        # the same figure, shown inline and saved: sent once
        {"output_type": "display_data", "data": {"image/png": base64.b64encode(PNG).decode()}},
        {"output_type": "display_data", "data": {"image/png": other, "text/plain": "<Figure>"}},
        {"output_type": "stream", "name": "stdout", "text": "hi"},
    ]
    result = ExecutionResult(exit_code=0, files=[png], outputs=outputs)
    urls = [p["image_url"]["url"] for p in result.image_parts()]
    assert urls == [data_url("image/png", PNG), data_url("image/png", other)]


def test_content_parts_start_with_the_reply_text() -> None:
    result = ExecutionResult(exit_code=0, output="42\n")
    assert result.to_content_parts() == [{"type": "text", "text": result.to_reply()}]
