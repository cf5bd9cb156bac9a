"""Forks a running IPython kernel: sent as source to the kernel (never imported by the host).

The host loads this into the kernel with a silent request (once per kernel: its forks inherit
it) and calls ``fork(request)`` as its user expression (see ``forked_kernel``). The kernel forks
once and answers with the child's pid; a thread of its own reaps the child when it ends (a
second fork, so that init would be the parent, cost a copy of the page tables and the middle
process's exit on every fork: 20 to 40 ms of a 1 GiB session's). The kernel itself is
undisturbed: no name added, no history, no output. The child, copy-on-write, keeps the kernel's
whole Python state (every
variable, import, figure) and builds what is the kernel's own process around it again:

- its cgroup joined first where the request names one (a session's fork names none: the host
  moves it once the kernel answered, while it builds the rest), then a session of its own;
- fresh sockets from the host's new connection file, with a key of their own, fresh threads
  (iopub, control, heartbeat) and a fresh event loop: the parent's are never touched (a socket,
  pipe or event descriptor it shares with the parent is closed here, never used: an epoll set
  or zmq context shared with the parent would steal its messages);
- the same shell (``get_ipython()``, its namespace, ``In``/``Out``, execution count), given the
  new kernel;
- its own working folder (the host's copy of the work dir), its own log.

The child never returns into the parent's request: it runs its own kernel and exits with it.
No kernelexec import here: the kernel may run another interpreter than the host's.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

_kept: list[Any] = []  # the parent's objects, kept alive (never collected) in the child


def fork(request: dict[str, Any]) -> int:
    """In the kernel: fork the child described by ``request``; the child's pid."""
    import sys
    import threading

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            _hand_over(stream)
    setup = _compiled(request.get("setup"))  # here: each later fork inherits the code object
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        _become_kernel(request, setup, write_end)  # never returns
    os.close(write_end)
    reaper = threading.Thread(target=_reap, args=(child,), name="kernelexec-fork", daemon=True)
    reaper.start()
    # Answered once the child is in its own cgroup and session: a snapshot's kernel is paused
    # (its process group stopped) right after it forks, which must not stop the child too.
    with os.fdopen(read_end, "rb") as f:
        if not f.read(1):
            raise RuntimeError("the forked kernel's process did not start")
    return child


def _hand_over(stream: Any) -> None:
    """Empty ``stream`` before the fork: what it holds (and what waits in its fd pipe) is
    queued here for the kernel's iopub thread, in order, as at a request's end, not waited
    for (a round trip to that thread: 10 ms and more on a loaded machine). The queue is the
    parent's to send: the child never runs that thread, and its copy of the stream, empty,
    is never written to. A stream that is not kernelexec's (no drain), or that the iopub
    thread is sending just now, is flushed as ipykernel does (waiting)."""
    drain = getattr(stream, "_kx_drain", None)
    if drain is None or getattr(stream, "_kx_sending", True) or getattr(stream, "_hooks", True):
        stream.flush()
        return
    drain()
    stream._flush()


def _reap(pid: int) -> None:
    """Wait for the forked child (this pid alone: the kernel's own children are the blocks')."""
    with contextlib.suppress(OSError):  # a block's os.wait() may have reaped it first
        os.waitpid(pid, 0)


_codes: dict[str, Any] = {}  # the set-up code, compiled once per kernel (40 KB: 20 ms or more)


def _compiled(setup: str | None) -> Any:
    if not setup:
        return None
    code = _codes.get(setup)
    if code is None:
        code = _codes[setup] = compile(setup, "<kernelexec set-up>", "exec")
    return code


def _become_kernel(request: dict[str, Any], setup: Any, ready: int) -> None:
    code = 1
    try:
        _prepare_process(request, ready)
        app = _rebuild_app(request, setup)
        code = 0
        try:
            app.start()
        except BaseException:
            code = 0
    except BaseException:
        try:
            import traceback

            traceback.print_exc()
        except BaseException:
            pass
    finally:
        os._exit(code)


def _prepare_process(request: dict[str, Any], ready: int) -> None:
    import atexit
    import signal

    procs = request.get("cgroup")
    if procs:
        with open(procs, "w", encoding="ascii") as f:
            f.write("0")  # first: nothing the child runs is outside its cgroup
    os.setsid()  # its own session and process group: the host kills the group with it
    os.write(ready, b"1")  # the parent answers the host now
    os.close(ready)
    # The parent's exit handlers (its connection file's clean-up, its sockets') are not ours.
    atexit._clear()
    signal.set_wakeup_fd(-1)  # the parent's event loop's wake-up pipe, closed below
    _own_stdio(request["log"])
    _close_shared()
    os.chdir(request["cwd"])


def _own_stdio(log: str) -> None:
    """fd 1 to nowhere, fd 2 to the child's own log, as for a local kernel; the parent's output
    capture (a pipe its thread reads) let go of."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        _kept.append(stream)
        if hasattr(stream, "_should_watch"):
            stream._should_watch = False
    null = os.open(os.devnull, os.O_WRONLY)
    err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 1)
    os.dup2(err, 2)
    os.close(null)
    os.close(err)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__


def _close_shared() -> None:
    """Every socket, pipe and event descriptor inherited from the parent kernel (its zmq
    contexts, its event loop's epoll and wake-up pipe, its capture pipes): shared with the
    parent, they would steal its messages if used. Regular files a block opened stay open."""
    import stat

    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            mode = os.fstat(fd).st_mode
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode) or target.startswith("anon_inode:"):
            with contextlib.suppress(OSError):
                os.close(fd)


def _rebuild_app(request: dict[str, Any], setup: Any) -> Any:
    """The kernel application, with new sockets, threads and kernel around the same shell."""
    import asyncio
    import logging
    import sys

    from ipykernel.kernelapp import IPKernelApp
    from jupyter_client.session import Session

    app: Any = IPKernelApp.instance()
    old_loop = asyncio.events._get_running_loop()
    _kept.extend([old_loop, app.kernel, app.context, app.heartbeat, app.iopub_thread])
    _kept.extend([app.control_thread, getattr(app, "shell_channel_thread", None), app.poller])
    _kept.extend([app.session, sys.displayhook, app.shell_socket, app.stdin_socket])
    # A fresh event loop for this thread: the parent's is never run, closed or collected here.
    asyncio.events._set_running_loop(None)
    asyncio.set_event_loop(asyncio.new_event_loop())
    for handler in logging.getLogger().handlers + list(app.log.handlers):
        if isinstance(handler, logging.StreamHandler):
            handler.stream = sys.__stderr__
    app.context = app.heartbeat = app.iopub_thread = app.control_thread = None
    if hasattr(app, "shell_channel_thread"):
        app.shell_channel_thread = None
    app.poller = None  # no parent to watch: the host's cgroup and process group hold the child
    app.parent_handle = 0
    app.connection_file = request["connection_file"]
    # Ports set win over the connection file's: a fork whose sockets are not its parent's
    # kind (a Docker kernel's fork: TCP on the container's loopback) names its own.
    for name, port in (request.get("ports") or {}).items():
        setattr(app, name, port)
    app.session = Session(parent=app)
    app.init_connection_file()
    app.session.pid = os.getpid()
    app.init_sockets()
    app.init_heartbeat()
    app.init_io()
    app.init_signal()
    shell: Any = app.shell
    type(app.kernel).clear_instance()
    app.init_kernel()
    shell.parent = shell.kernel = app.kernel
    app.shell = shell
    if setup is not None:
        exec(setup, shell.user_ns)
    sys.stdout.flush()
    sys.stderr.flush()
    return app
