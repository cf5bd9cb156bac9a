"""A resident spawner: starts each block's process from inside the executor's cgroup (standalone).

``python -I -S _spawner.py FD`` reads requests from the Unix stream socket ``FD``. Moving a process
into a cgroup waits for an RCU grace period (5 to 20 ms, more under load) every time; a process
forked by one already inside inherits the cgroup for free. So the executor starts this helper once,
in its cgroup, and has it start every block.

A request is an 8-byte big-endian length then that many bytes of JSON (``argv``, ``cwd``,
``env``); three file descriptors ride with its first byte: a status pipe, and the block's stdout
and stderr. The reply goes to the status pipe, one line each: ``pid N`` once started (or
``error TEXT``), then ``exit CODE`` (negative: killed by that signal), then the pipe closes.
The helper exits when the socket closes (its executor closed, or its host died).
Only the standard library: it runs apart from kernelexec.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading

_HEADER = 8


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _request(sock: socket.socket) -> tuple[dict[str, object], list[int]]:
    head, fds, _, _ = socket.recv_fds(sock, _HEADER, 3)
    if not head:
        raise EOFError
    head += _recv_exact(sock, _HEADER - len(head))
    return json.loads(_recv_exact(sock, int.from_bytes(head, "big"))), fds


def _wait(proc: subprocess.Popen[bytes], status: int) -> None:
    code = proc.wait()
    with contextlib.suppress(OSError):
        os.write(status, f"exit {code}\n".encode())
    os.close(status)


def _spawn(request: dict[str, object], fds: list[int]) -> None:
    status, out, err = fds
    try:
        proc = subprocess.Popen(
            list(request["argv"]),  # type: ignore[call-overload]
            cwd=str(request["cwd"]),
            env=dict(request["env"]),  # type: ignore[call-overload]
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # killpg(pid) reaches the block, not this helper
        )
    except Exception as exc:  # a missing program, a bad request: told, and the next one served
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        with contextlib.suppress(OSError):
            os.write(status, f"error {why}\n".encode())
        os.close(status)
        return
    finally:
        os.close(out)
        os.close(err)
    os.write(status, f"pid {proc.pid}\n".encode())
    threading.Thread(target=_wait, args=(proc, status), daemon=True).start()


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    while True:
        try:
            request, fds = _request(sock)
        except (EOFError, OSError, ValueError):
            return  # the executor is gone: the blocks still running die with its cgroup
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        _spawn(request, fds)


if __name__ == "__main__":
    main()
