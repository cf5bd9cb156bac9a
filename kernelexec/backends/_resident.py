"""The host's side of the resident spawner (``_spawner.py``): one per command back end.

A block's process that joins its cgroup between fork and exec waits for an RCU grace period,
5 to 20 ms each time (most of what a stateless block cost over a bare ``subprocess.run``). The
spawner joins the executor's cgroup once, and every block it starts is born inside: nothing it
starts can leave, and nothing pays the move. After each block everything in the cgroup but the
spawner is killed (no freeze when nothing is left, the usual case).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import _containment

_SCRIPT = str(Path(__file__).with_name("_spawner.py"))


class Spawner:
    """A running ``_spawner.py`` in a cgroup of its own (made for it), and its socket."""

    def __init__(self, mechanism_name: str) -> None:
        jail = _containment.make_jail(mechanism_name)
        if not isinstance(jail, _containment._CgroupJail):
            jail.close()
            raise ValueError(f"a spawner needs a cgroup, not {mechanism_name}")
        self.jail = jail
        self.busy = False  # a second block at once (another thread) gets a cgroup of its own
        self._owner = os.getpid()  # a forked copy of the host must not use or stop it
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # -I: nothing from the environment or a work dir; -S: no site (stdlib only, faster)
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _SCRIPT, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                **jail.popen_kwargs(),
            )
        except BaseException:
            ours.close()
            jail.close()
            raise
        finally:
            theirs.close()
            jail.started(0)
        self.pid = self._proc.pid
        self._sock = ours
        self._finalizer = weakref.finalize(self, _stop, ours, self._proc, jail, self._owner)

    def alive(self) -> bool:
        """Running and able to answer: a block may have killed or stopped it (SIGSTOP)."""
        if os.getpid() != self._owner or self._proc.poll() is not None:
            return False
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return True  # no /proc to tell: a stuck one is caught by the block's timeout
        return stat.rsplit(")", 1)[1].split()[0] not in {"T", "t"}

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        fds: Sequence[int],
    ) -> None:
        """Ask for ``argv`` to be started; the reply comes on the status pipe (``fds[0]``)."""
        body = json.dumps({"argv": list(argv), "cwd": str(cwd), "env": dict(env)}).encode()
        head = len(body).to_bytes(8, "big")
        fds_data = array.array("i", fds).tobytes()
        with self._lock:  # one request at a time on the stream
            # one call, the file descriptors riding with the first byte; the rest if it was cut
            sent = self._sock.sendmsg(
                [head + body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds_data)]
            )
            self._sock.sendall((head + body)[sent:])

    def sweep(self) -> None:
        """Kill every process in the cgroup but the spawner (nothing to do when none is left)."""
        self.jail.kill_others(keep=self.pid)

    def close(self) -> None:
        self._finalizer()


def _stop(
    sock: socket.socket,
    proc: subprocess.Popen[bytes],
    jail: _containment.Jail,
    owner: int,
) -> None:
    sock.close()  # the spawner exits on end of file
    if os.getpid() != owner:
        return
    jail.close()  # kills what is left, the spawner included, and removes the cgroup
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
