"""The fork server: imports ipykernel (and a warm-up list) once, then forks a kernel per request.

Run as a script (``python _fork_server.py [module ...]``), never imported by kernelexec: it must
stay free of threads and sockets so a fork is safe, and it imports nothing of kernelexec.

Protocol, one JSON document per line: the server answers its start with ``{"ready": pid}`` or
``{"error": text}``; each request ``{"connection_file", "cwd", "env", "log"}`` gets ``{"pid": n}``
(or ``{"error": text}``). End of input ends the server; kernels it forked watch it (ipykernel's
parent poller) and end with it, so nothing outlives the process that started the server.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import sys
import threading
from typing import Any

INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
# What every kernel imports while it starts (measured: a kernel's sys.modules against the
# server's); imported once here, a forked kernel starts in tens of milliseconds.
BASE = [
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "ipykernel.comm",
    "ipykernel.debugger",
    "debugpy.server",
    "IPython",
    "tornado.ioloop",
    "jupyter_client.session",
    "faulthandler",
    "gzip",
    "http.server",
    "xmlrpc.client",
]
# Thread pools a library would start at import (BLAS, OpenMP): one thread, so none is running
# when the server forks. Kernels forked from it keep single-threaded BLAS.
SINGLE_THREADED = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _answer(out: Any, **document: Any) -> None:
    out.write(json.dumps(document) + "\n")
    out.flush()


def _warm_up(modules: list[str]) -> str | None:
    """Import ipykernel's kernel app and the warm-up list; an error text if that fails or
    leaves a thread running (a thread does not survive a fork: its locks would)."""
    for name in SINGLE_THREADED:
        os.environ.setdefault(name, "1")
    for name in [*BASE, *modules]:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import failure is reported as text
            return f"cannot import {name!r} in the fork server: {type(exc).__name__}: {exc}"
    extra = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    native = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if extra or native > 1:
        names = ", ".join(extra) or f"{native - 1} native"
        return f"the warm-up list started threads ({names}); forking the server is unsafe"
    return None


def _kernel(request: dict[str, Any]) -> None:
    """In the forked child: become a kernel process and never return."""
    code = 1
    try:
        if request.get("cgroup"):  # first: nothing the kernel runs is ever outside it
            with open(request["cgroup"], "w") as procs:
                procs.write("0")
        os.setsid()  # its own group: interrupts and kills reach the kernel and its children
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)  # never the server's protocol pipe: a kernel writes to its log only
        os.dup2(log, 2)
        os.closerange(3, 256)  # the pipes to the host are the server's, not the kernel's
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _reset_matplotlib()
        from ipykernel import kernelapp

        # The parent poller ends the kernel when the server goes (set here: ipykernel read
        # JPY_PARENT_PID when the server imported it).
        parent = f"--IPKernelApp.parent_handle={os.getppid()}"
        kernelapp.launch_new_instance(argv=["-f", request["connection_file"], parent])
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _reset_matplotlib() -> None:
    """matplotlib read MPLBACKEND when the server imported it; the kernel's env decides."""
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is not None:
        matplotlib.rcParams["backend"] = os.environ.get("MPLBACKEND", INLINE_BACKEND)


def serve(modules: list[str], inp: Any, out: Any) -> int:
    os.environ.setdefault("MPLBACKEND", INLINE_BACKEND)
    # debugpy's note about frozen modules, printed by every kernel otherwise
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # kernels are reaped by the OS, no zombies
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the host
    problem = _warm_up(modules)
    if problem is not None:
        _answer(out, error=problem)
        return 1
    # Objects the server made stay put: the collector would otherwise touch (and so copy)
    # their pages in every forked kernel.
    gc.collect()
    gc.freeze()
    _answer(out, ready=os.getpid())
    for line in inp:
        try:
            request = json.loads(line)
            pid = os.fork()
        except (ValueError, OSError) as exc:
            _answer(out, error=f"{type(exc).__name__}: {exc}")
            continue
        if pid == 0:
            _kernel(request)
        _answer(out, pid=pid)
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:], sys.stdin, sys.stdout))
