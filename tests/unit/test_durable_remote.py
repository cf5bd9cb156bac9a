"""A hostile remote kernel answering a durable snapshot's file transfers (a mock, in addition to
the real gateway and Swarm tests): the host writes only inside its private mirror, no more
bytes than a file's stated size, and skips what it cannot take."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path

import pytest

from kernelexec._door import Door
from kernelexec._durable import fetch_remote
from kernelexec._errors import InvalidPath
from kernelexec._files import KernelFiles

pytestmark = pytest.mark.unit

FLOOD = b"x" * (3 << 20)


async def hostile(code: str, expression: str) -> str:
    """Claims 10 bytes for every file, then sends megabytes for each read."""
    op = re.match(r"__kx_files__\('(\w+)'", expression)
    assert op is not None
    if op.group(1) == "size":
        answer: dict[str, object] = {"size": 10}
    else:
        answer = {"data": base64.b64encode(FLOOD).decode()}
    return repr(json.dumps(answer))


def test_paths_a_kernel_names_stay_in_the_mirror(tmp_path: Path) -> None:
    mirror_dir = tmp_path / "mirror"
    mirror_dir.mkdir()
    files = KernelFiles(hostile, "/remote/work", limit=1 << 62)
    work = ["ok.txt", "../escape.txt", "/etc/escape", "a/../../escape", ".kernelexec/own", "a/b"]
    saved = {"names": {"v": {"status": "saved", "file": "1.pkl"}}}
    with Door(mirror_dir) as mirror:
        asyncio.run(fetch_remote(files, saved, ".kernelexec/snap", work, mirror))
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert found == ["mirror/.kernelexec/snap/1.pkl", "mirror/a/b", "mirror/ok.txt"]
    assert (mirror_dir / "ok.txt").read_bytes() == b"x" * 10  # the stated size, not the flood


def test_a_pickle_named_outside_its_folder_is_refused(tmp_path: Path) -> None:
    files = KernelFiles(hostile, "/remote/work", limit=1 << 62)
    saved = {"names": {"v": {"status": "saved", "file": "../../../outside.pkl"}}}
    with Door(tmp_path) as mirror, pytest.raises(InvalidPath):
        asyncio.run(fetch_remote(files, saved, ".kernelexec/snap", [], mirror))
    assert not list(tmp_path.parent.glob("outside.pkl"))


def test_an_answer_is_read_as_the_string_the_kernel_gave(tmp_path: Path) -> None:
    """The quick reading of a plain answer (no escape in it) and Python's reading of any other
    give the same string; what is not a string's repr is refused as before."""
    from kernelexec._files import _unquoted

    for value in ['{"data": "QUJD"}', "it's", 'back\\slash "q"', "new\nline", "é ✓", ""]:
        assert _unquoted(repr(value)) == value
        assert _unquoted(repr(json.dumps({"data": value}))) == json.dumps({"data": value})
    for not_a_repr in ("'a' + 'b'", "__import__('os')"):  # a quote inside: parsed, not cut
        with pytest.raises((ValueError, SyntaxError)):
            _unquoted(not_a_repr)
