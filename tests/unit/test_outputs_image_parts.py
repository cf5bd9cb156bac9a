"""One rich output is one image: in the files and in the chat-API content parts."""

from __future__ import annotations

import base64
from pathlib import Path

from kernelexec import ExecutionResult

PNG = b"\x89PNG\r\n\x1a\none-image"
JPEG = b"\xff\xd8\xff\xe0the-same-image-as-jpeg"


def test_an_output_with_png_and_jpeg_forms_gives_one_image_part(tmp_path: Path) -> None:
    saved = tmp_path / "cell1-1.png"
    saved.write_bytes(PNG)
    data = {
        "text/plain": "<PIL.Image.Image>",
        "image/png": base64.b64encode(PNG).decode(),
        "image/jpeg": base64.b64encode(JPEG).decode(),
    }
    result = ExecutionResult(
        exit_code=0, files=[saved], outputs=[{"output_type": "display_data", "data": data}]
    )
    parts = result.image_parts()
    assert len(parts) == 1
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_jpeg_only_output_is_still_sent() -> None:
    data = {"image/jpeg": base64.b64encode(JPEG).decode()}
    result = ExecutionResult(exit_code=0, outputs=[{"output_type": "display_data", "data": data}])
    [part] = result.image_parts()
    assert part["image_url"]["url"].startswith("data:image/jpeg;base64,")
