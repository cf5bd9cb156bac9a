"""The lean IOPub decoding: what ``Session.deserialize`` gives, dates left as strings."""

from __future__ import annotations

import json
import random

import pytest
from jupyter_client.session import Session

from kernelexec._budget import LongText, full_value
from kernelexec.backends._iopub import decode, unpack_bounded


def _frames(session: Session, content: dict[str, object]) -> list[bytes]:
    msg = session.msg("display_data", content, parent={"msg_id": "p1", "msg_type": "x"})
    return [bytes(f) for f in session.serialize(msg)]


def test_decode_matches_deserialize_but_dates() -> None:
    sender, receiver = Session(key=b"k"), Session(key=b"k")
    frames = _frames(sender, {"data": {"text/plain": "1"}, "metadata": {}})
    msg = decode(receiver, frames)
    ref = Session(key=b"k").deserialize(Session(key=b"k").feed_identities(frames)[1])
    assert msg["msg_type"] == ref["msg_type"] == "display_data"
    assert msg["content"] == ref["content"]
    assert msg["parent_header"]["msg_id"] == "p1"
    assert isinstance(msg["header"]["date"], str)


def test_decode_refuses_a_bad_or_replayed_signature() -> None:
    sender, receiver = Session(key=b"k"), Session(key=b"k")
    frames = _frames(sender, {"data": {}})
    decode(receiver, frames)
    with pytest.raises(ValueError, match="Duplicate"):
        decode(receiver, frames)
    forged = _frames(Session(key=b"other"), {"data": {}})
    with pytest.raises(ValueError, match="Invalid"):
        decode(receiver, forged)


# -- 30.5: a huge string is not decoded whole ---------------------------------------------------
def _text(n: int, seed: int) -> str:
    """``n`` characters that JSON escapes often and UTF-8 encodes in 1 to 4 bytes."""
    rng = random.Random(seed)
    alphabet = ["a", "é", "€", "😀", "\n", '"', "\\", "\x01", "\t", "x" * 40, "\\u00e9"]
    return "".join(rng.choice(alphabet) for _ in range(n))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_long_string_comes_whole_a_piece_at_a_time(seed: int) -> None:
    big = _text(400_000, seed)  # several MiB: pieces cut among escapes and UTF-8 sequences
    content = {"ename": "E", "evalue": big, "traceback": ["x", big + "!"], "n": [1, 2.5, None]}
    frame = json.dumps(content, ensure_ascii=False).encode()
    got = unpack_bounded(frame)
    assert isinstance(got["evalue"], LongText) and got["evalue"].length == len(big)
    assert "".join(got["evalue"].chunks()) == big
    assert full_value(got["traceback"]) == ["x", big + "!"]
    assert got["ename"] == "E" and got["n"] == [1, 2.5, None]
    assert len(got["evalue"]) < 21_000  # what code that does not know sees: bounded


def test_a_run_of_backslashes_and_a_long_key_are_decoded_right() -> None:
    big = "\\" * 3_000_001 + '"'
    frame = json.dumps({big: [big], "k": {"v": "small"}}).encode()
    got = full_value(unpack_bounded(frame))
    assert got == {big: [big], "k": {"v": "small"}}


def test_a_huge_message_is_decoded_with_long_strings_left_undecoded() -> None:
    sender, receiver = Session(key=b"k"), Session(key=b"k")
    content = {"name": "stdout", "text": "y" * 5_000_000}
    frames = [bytes(f) for f in sender.serialize(sender.msg("stream", content))]
    text = decode(receiver, frames)["content"]["text"]
    assert isinstance(text, LongText) and text.length == 5_000_000
    assert "".join(text.chunks()) == "y" * 5_000_000
