"""The lean IOPub decoding: what ``Session.deserialize`` gives, dates left as strings."""

from __future__ import annotations

import pytest
from jupyter_client.session import Session

from kernelexec.backends._iopub import decode


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
