"""Waiting for a freshly started kernel to answer, without jupyter_client's fixed sleeps.

``KernelClient.wait_for_ready`` ends with a 0.2 s quiet period on IOPub and, when it cannot ask
a manager, polls a heartbeat every 0.2 s: most of a fast kernel's start. Here the kernel counts
as ready once a ``kernel_info_request`` was answered on the shell channel *and* its ``idle``
status arrived on IOPub (so the subscription is live and no output of the first block can be
missed). With IPC transport the client connects only once the kernel has bound its sockets, so
no connect waits out zmq's reconnect interval.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from queue import Empty
from typing import Any

import zmq

#: Messages the host holds for a kernel's channels before zmq pushes back on the kernel (zmq's
#: default is 1,000; with the kernel's 256 KiB stream messages that let a flood put up to 256 MB
#: in the host). The kernel's PUB socket has no send limit (see ``_kernel``), so a full queue here
#: makes the kernel wait: nothing is dropped, and the host's memory stays bounded.
RECEIVE_QUEUE = 64

_POLL = 0.002  # seconds between looks at the socket files
_TRY = 0.5  # seconds one kernel_info request gets before another is sent


class NotReady(Exception):
    """The kernel did not answer in time, or ``alive()`` said it is gone."""

    def __init__(self, died: bool) -> None:
        super().__init__("the kernel exited" if died else "no answer")
        self.died = died


def start_channels(client: Any) -> None:
    """Start a jupyter_client client's channels with a bounded receive queue.

    The limit must be in place when a socket connects (libzmq sizes a connection's queue then;
    setting it afterwards was measured to change nothing), so it is set as the default of the
    client's zmq context just before the channels' sockets are made.
    """
    client.context.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
    client.start_channels(hb=False)  # liveness comes from the process itself


async def wait_bound(paths: Iterable[str], deadline: float, alive: Callable[[], bool]) -> None:
    """Wait until every IPC socket file exists (the kernel has bound its channels)."""
    pending = list(paths)
    while pending:
        pending = [p for p in pending if not os.path.exists(p)]
        if not pending:
            return
        if not alive():
            raise NotReady(died=True)
        if time.monotonic() > deadline:
            raise NotReady(died=False)
        await asyncio.sleep(_POLL)


async def wait_ready(client: Any, deadline: float, alive: Callable[[], bool]) -> None:
    """Ask ``kernel_info`` until both its reply and its idle status arrive."""
    while True:
        msg_id = client.kernel_info()
        if await _answered(client, msg_id, min(deadline, time.monotonic() + _TRY)):
            return
        if not alive():
            raise NotReady(died=True)
        if time.monotonic() > deadline:
            raise NotReady(died=False)


async def _answered(client: Any, msg_id: str, until: float) -> bool:
    replied = idle = False
    while not (replied and idle):
        left = until - time.monotonic()
        if left <= 0:
            return False
        if replied:  # only the idle status is missing now
            try:
                msg = await client.get_iopub_msg(timeout=left)
            except Empty:
                return False
            idle = _parent(msg) == msg_id and _state(msg) == "idle"
            continue
        try:
            msg = await client.get_shell_msg(timeout=min(left, 0.05))
        except Empty:
            msg = None
        if msg is not None and _parent(msg) == msg_id:
            replied = msg.get("msg_type") == "kernel_info_reply"
        idle = idle or await _idle_seen(client, msg_id)  # it may come before the reply
    return True


def _parent(msg: dict[str, Any]) -> Any:
    return (msg.get("parent_header") or {}).get("msg_id")


def _state(msg: dict[str, Any]) -> Any:
    return msg.get("content", {}).get("execution_state")


async def _idle_seen(client: Any, msg_id: str) -> bool:
    """Drain what IOPub has now; True if it held the request's idle status."""
    seen = False
    while True:
        try:
            msg = await client.get_iopub_msg(timeout=0)
        except Empty:
            return seen
        seen = seen or (_parent(msg) == msg_id and _state(msg) == "idle")
