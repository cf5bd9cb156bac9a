"""The fork server: imports ipykernel (and a warm-up list) once, then forks a kernel per request.

Run as a script (``python _fork_server.py [module ...]``; kernelexec imports it only for its
constants): it must stay free of threads and network sockets so a fork is safe, and it imports
nothing of kernelexec (its own folder is taken off ``sys.path`` before the warm-up imports).

Protocol, one JSON document per line, on the stdin and stdout it was started with (the answers
through a copy of stdout, so nothing else the server's process prints can reach them): the server
answers its start with ``{"ready": pid}`` or ``{"error": text}``; each request
``{"connection_file", "cwd", "env_file", "log"}`` (``"env"``, the environment itself, instead of
``"env_file"`` from an older host) gets ``{"pid": n}`` (or ``{"error": text}``). End of
input ends the server; kernels it forked watch it (ipykernel's parent poller) and end with it, so
nothing outlives the process that started the server.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType
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
    # what the kernel's shell resolves by name while it starts (traitlets classes by string)
    "IPython.core.completerlib",
    "IPython.core.debugger",
    "IPython.core.logger",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "IPython.utils.wildcard",
    "sqlite3",
    "tornado.platform.asyncio",
]
# Changed from ipykernel's defaults, for every forked kernel: the input history is kept in memory
# (In, Out, %history work as usual within the kernel), not in the user's profile database, whose
# first write costs a forked kernel tens of milliseconds and which hundreds of kernels would
# otherwise lock against each other.
KERNEL_ARGS = ["--HistoryManager.hist_file=:memory:"]
# Thread pools a library would start at import (BLAS, OpenMP): one thread, so none is running
# when the server forks. Kernels forked from it keep single-threaded BLAS.
SINGLE_THREADED = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# The descriptors the server itself opened and keeps (beyond 0, 1 and 2, which a child points
# elsewhere): its answers to the host, its end of a spare's socket. A child closes these and
# only these: a file a warm-up module opened as it was imported stays open in every kernel, as
# in a cold kernel that imported the module (closing every descriptor above 2 let zmq reuse its
# number, and the module's file then read zmq's eventfd).
_own_fds: set[int] = set()


def _close_own_fds() -> None:
    """In a forked child: the server's descriptors closed, and forgotten (a number closed here
    may be reused by the child, which must not close it again)."""
    for fd in _own_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _own_fds.clear()


def _close_own(fd: int) -> None:
    """In the server: one of its descriptors closed."""
    _own_fds.discard(fd)
    os.close(fd)


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
    _prime()
    _prepare_app()
    extra = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    native = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if extra or native > 1:
        names = ", ".join(extra) or f"{native - 1} native"
        return f"the warm-up list started threads ({names}); forking the server is unsafe"
    return None


def _prime() -> None:
    """Work every kernel's first cell repeats, done once here: the tokenizer compiles its large
    regular expressions on first use, and IPython's cell transformers theirs (measured: about
    15 ms of a forked kernel's first block)."""
    from IPython.core.inputtransformer2 import TransformerManager

    TransformerManager().transform_cell("x = 1\n%time x\n!true\n")  # type: ignore[no-untyped-call]


# The environment the kernel application's configuration was read under (its profile and
# config folders). A kernel asking for the same values starts from the server's prepared
# application; any other kernel reads its configuration itself, as a cold kernel would.
CONFIG_ENV = (
    "HOME",
    "IPYTHONDIR",
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_CONFIG_PATH",
    "JUPYTER_PLATFORM_DIRS",
)
_prepared: dict[str, str | None] | None = None


def _prepare_app() -> None:
    """Parse the kernel application's command line and read its profile and config files once,
    here (no thread, no socket): building the parser from every configurable class is about
    10 ms and 3 MiB of private memory in each kernel otherwise. Then build the kernel's shell
    (see ``_prepare_shell``)."""
    global _prepared
    from ipykernel.kernelapp import IPKernelApp
    from IPython.core.application import BaseIPythonApplication

    app = IPKernelApp.instance()
    BaseIPythonApplication.initialize(app, KERNEL_ARGS)  # type: ignore[no-untyped-call]
    _prepared = {name: os.environ.get(name) for name in CONFIG_ENV}
    _prepare_shell(app)
    _prepare_session(app)


# The kernel's message session (jupyter_client's Session), built once here from the prepared
# configuration: building it (configuration, a check of its packers, its signer) was about
# 2 ms of every forked start. What is each kernel's own is given again in the child (see
# ``_own_session``): its id, its process id and its key. A configured id or key (None here) is
# kept, as when cold.
_new_session_id = True
_server_key: bytes | None = None


def _prepare_session(app: Any) -> None:
    global _new_session_id, _server_key
    configured = app.config.get("Session", {})
    session = app.session  # built now; its key is random unless configured
    _new_session_id = "session" not in configured
    _server_key = None if "key" in configured or "keyfile" in configured else session.key


def _own_session(app: Any) -> None:
    """In a forked kernel, before it reads its connection file: a session id and process id of
    its own, and a random key if its file names none (a cold kernel's Session makes all three
    as it is built)."""
    from jupyter_client.session import new_id, new_id_bytes

    session = app.session
    if _new_session_id:
        session.session = new_id()  # its observer sets the bytes form too
    session.pid = os.getpid()
    session.digest_history.clear()
    load = app.init_connection_file

    def init_connection_file() -> None:
        load()
        if _server_key is not None and session.key == _server_key:
            session.key = new_id_bytes()

    app.init_connection_file = init_connection_file


def _keep_connection_file(app: Any) -> None:
    """The host wrote the kernel's connection file with every IPC address fixed (no port 0 to
    fill in): ipykernel would read it back to find nothing to add (about 0.7 ms)."""
    write = app.write_connection_file

    def write_connection_file(**kwargs: Any) -> None:
        if app.transport != "ipc":
            write(**kwargs)

    app.write_connection_file = write_connection_file


# The kernel's IPython shell, built once here: constructing it (prefilters, magics, completer,
# history, display formatters: some fifty configurable objects) was the largest part of a
# forked kernel's start (measured: about 8 ms of its 69 ms to the first result). A forked kernel
# adopts it when its kernel asks for a shell with the same arguments, after redoing what
# depends on the kernel's own process: its working folder, environment and history session.
_shell: Any = None
_shell_args: dict[str, Any] = {}


def _prepare_shell(app: Any) -> None:
    global _shell, _shell_args
    from ipykernel.ipkernel import IPythonKernel

    kernel_traits = IPythonKernel.class_traits()
    shell_class: Any = kernel_traits["shell_class"].default()
    _shell_args = {
        "profile_dir": app.profile_dir,
        "compiler_class": kernel_traits["compiler_class"].default(),
        "user_module": None,
        "user_ns": None,
    }
    _shell = shell_class.instance(parent=app, **_shell_args)
    # What the first block would set up lazily, done here once (pure calls: nothing recorded):
    # the formatters and their trait defaults, the input transformers.
    _shell.display_formatter.format(0)
    _shell.transform_cell("0\n")


def _adopt_shell() -> None:
    """In a forked kernel: the kernel's request for its shell gets the prepared one if the
    arguments match (its configuration was read under the same folders); otherwise a new one
    is built, as in any kernel."""
    shell, cls = _shell, type(_shell)
    own = cls.__dict__.get("instance")  # normally inherited from SingletonConfigurable

    def instance(of: Any, *args: Any, **kwargs: Any) -> Any:
        if own is None:  # once: any later request is served as usual
            del cls.instance
        else:
            cls.instance = own
        kernel = kwargs.get("kernel")
        if (
            of is not cls
            or args
            or kernel is None
            or any(kwargs.get(k) is not v for k, v in _shell_args.items())
        ):
            cls.clear_instance()
            return of.instance(*args, **kwargs)
        shell.parent = kwargs.get("parent", kernel)
        shell.kernel = kernel
        _own_process(shell)
        return shell

    cls.instance = classmethod(instance)


def _own_process(shell: Any) -> None:
    """What the shell took from the server's process when it was built, taken again here."""
    import datetime
    from pathlib import Path

    shell.starting_dir = os.getcwd()
    shell.init_environment()  # TERM, PAGER... in this kernel's (new) environment
    shell.init_encoding()
    history = shell.history_manager
    history.dir_hist[:] = [Path.cwd()]
    if history.session_number and history.db is not None:
        with history.db:  # the session began now, not when the server started
            history.db.execute(
                "UPDATE sessions SET start=? WHERE session==?",
                (datetime.datetime.now().isoformat(" "), history.session_number),
            )


def _unbounded_iopub(kernelapp: Any) -> None:
    """The kernel's IOPub socket gets no send limit before it is bound, not only later.

    The host's set-up code lifts the limit too, but libzmq gives each connection the options its
    socket had when it was bound: a host that connects after a forked kernel ran the set-up (a
    loaded machine) got zmq's 1,000-message limit, past which a PUB socket drops what it sends
    (seen in CI: 5,606 of 10,000 displays lost, exit status 0).
    """
    import zmq

    bind = getattr(kernelapp.IPKernelApp, "_bind_socket", None)
    if bind is None or getattr(bind, "_kx_unbounded", False):
        return

    def _bind_socket(self: Any, s: Any, port: Any) -> Any:
        if s.type in (zmq.PUB, zmq.XPUB):
            s.sndhwm = 0
        return bind(self, s, port)

    _bind_socket._kx_unbounded = True  # type: ignore[attr-defined]
    kernelapp.IPKernelApp._bind_socket = _bind_socket


def _join_cgroup(procs: str | None, *, prepared: bool) -> Callable[[], None]:
    """Put the kernel in its cgroup (the host made it); returns a call that waits until it is.

    A move into a cgroup waits out an RCU grace period (measured: 8 to 13 ms of a forked
    kernel's start, most of it asleep). With the prepared application, whose configuration the
    server already read, the move runs in a thread of the kernel's own while the kernel builds
    its sockets, and the kernel waits for it before anything configurable runs (extensions,
    startup files, the host's set-up code): nothing the kernel starts is outside the cgroup.
    Otherwise (configuration files still to read, which may run code) it is done at once.
    """
    if not procs:
        return lambda: None

    def join() -> None:
        with open(procs, "w", encoding="ascii") as f:
            f.write("0")  # the writer's whole process, every thread of it

    if not prepared:
        join()
        return lambda: None
    failed: list[BaseException] = []

    def run() -> None:
        try:
            join()
        except BaseException as exc:  # raised where the kernel waits for it
            failed.append(exc)

    mover = threading.Thread(target=run, name="kernelexec-cgroup")
    mover.start()

    def joined() -> None:
        mover.join()
        if failed:
            raise failed[0]

    return joined


def _uses_prepared(env: dict[str, str]) -> bool:
    """Whether the kernel can start from the application the server prepared (same config)."""
    return _prepared is not None and all(env.get(n) == _prepared[n] for n in CONFIG_ENV)


def _launch(
    connection_file: str, setup: str | None, prepared: bool, joined: Callable[[], None]
) -> None:
    """Run the kernel application (in the forked child; returns when the kernel ends); from the
    server's prepared application when the kernel's configuration folders are the server's."""
    from ipykernel import kernelapp

    _unbounded_iopub(kernelapp)
    # The parent poller ends the kernel when the server goes (set here: ipykernel read
    # JPY_PARENT_PID when the server imported it).
    parent = os.getppid()
    if not prepared:
        argv = ["-f", connection_file, f"--IPKernelApp.parent_handle={parent}", *KERNEL_ARGS]
        kernelapp.IPKernelApp.clear_instance()  # the prepared one read the server's folders
        if _shell is not None:
            type(_shell).clear_instance()
        app = kernelapp.IPKernelApp.instance()
        app.initialize(argv)  # type: ignore[no-untyped-call]
    else:
        app = _prepared_app(connection_file, parent, joined)
    joined()
    _run_setup(app, setup)
    app.start()  # type: ignore[no-untyped-call]


def _prepared_app(connection_file: str, parent: int, joined: Callable[[], None]) -> Any:
    from ipykernel import ipkernel, kernelapp
    from IPython.core.application import BaseIPythonApplication

    app = kernelapp.IPKernelApp.instance()
    app.connection_file, app.parent_handle = connection_file, parent
    gui_pylab = app.init_gui_pylab

    def init_gui_pylab() -> None:  # the first step that may run configured code: in the cgroup
        joined()
        gui_pylab()  # type: ignore[no-untyped-call]

    app.init_gui_pylab = init_gui_pylab  # type: ignore[method-assign]
    _own_session(app)
    _keep_connection_file(app)
    # IPKernelApp.initialize starts with its base's initialize, which the server already ran.
    BaseIPythonApplication.initialize = lambda self, argv=None: None  # type: ignore[method-assign]
    _adopt_shell()  # the server prepared its shell with its application
    vars(ipkernel)["sys"] = _SysView()
    try:
        app.initialize([])  # type: ignore[no-untyped-call]
    finally:
        vars(ipkernel)["sys"] = sys
    return app


# The host's set-up code, compiled here once, before forking: compiled in each kernel, its
# syntax tree and code objects took about 0.7 MiB of every idle kernel's own memory (measured
# beside this, 2026-11-26), pages a kernel now shares with the server.
_compiled: dict[str, CodeType] = {}


def _compile_setup(setup: str | None) -> None:
    if setup and setup not in _compiled:
        # On a syntax error it is compiled again in the kernel, whose log shows the error.
        with contextlib.suppress(SyntaxError):
            _compiled[setup] = compile(setup, "<kernelexec set-up>", "exec")


def _run_setup(app: Any, setup: str | None) -> None:
    """The host's set-up code, run in the kernel's namespace before the kernel answers anyone
    (what a silent first request would do, without the round trip). A failure ends the kernel
    with the traceback in its log: the host reports a kernel that did not start."""
    if setup:
        code = _compiled.get(setup) or compile(setup, "<kernelexec set-up>", "exec")
        exec(code, app.shell.user_ns)


# ipykernel's kernel lists every loaded module's file as it starts (for its debugger), reading
# each module object: in a forked kernel that copies a page per module (measured: 4.6 MiB of
# an idle kernel's private memory with numpy, pandas and matplotlib warm). The server lists them
# once, in objects of its own made together (a few pages), and the kernel reads that list; only
# modules imported since the fork are read from sys.modules itself (one removed since stays
# listed: the debugger's list of files not to step into then names one file more).
class _File:
    __slots__ = ("__file__",)

    def __init__(self, path: str) -> None:
        self.__file__ = path


_module_files: dict[str, _File] = {}
_last_module: str | None = None


def _list_module_files() -> None:
    global _last_module
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path:
            # copies, made now and side by side: reading them copies few pages in a kernel
            _module_files["".join(name)] = _File("".join(path))
    _last_module = next(reversed(sys.modules), None)


class _Modules:
    """sys.modules as ipykernel's kernel reads it while it starts (``copy()``), from the list."""

    def copy(self) -> dict[str, Any]:
        modules: dict[str, Any] = dict(_module_files)
        for name in reversed(sys.modules):  # imported since the server listed them
            if name is _last_module:
                break
            modules[name] = sys.modules[name]
        return modules

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.modules, name)


class _SysView:
    """The ``sys`` module as seen from ipykernel's kernel module while a forked kernel starts."""

    modules = _Modules()

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)


def _kernel(request: dict[str, Any]) -> None:
    """In the forked child: become a kernel process and never return."""
    code = 1
    try:
        os.setsid()  # its own group: interrupts and kills reach the kernel and its children
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})  # blocked while forking
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _own_streams(request["log"])
        _close_own_fds()  # the pipes to the host are the server's, not the kernel's
        env = _request_env(request)
        prepared = _uses_prepared(env)
        joined = _join_cgroup(request.get("cgroup"), prepared=prepared)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        time.tzset()  # the C library read TZ when the server started; this kernel's TZ decides
        _reseed()
        _as_launched(request["connection_file"])
        _reset_matplotlib()
        _launch(request["connection_file"], request.get("setup"), prepared, joined)
        code = 0
    except BaseException:
        import traceback

        # To the kernel's log (fd 2), not to sys.stderr: ipykernel may have replaced it with a
        # stream that only reaches IOPub, and nothing is flushed by os._exit.
        if sys.__stderr__ is not None:
            traceback.print_exc(file=sys.__stderr__)
            sys.__stderr__.flush()
    finally:
        os._exit(code)


def _own_streams(log_path: str) -> None:
    """The child's fds 0, 1 and 2, as a local kernel's: stdin and stdout /dev/null (never the
    server's protocol pipe; and what ipykernel echoes of a block's fd output, a flood of it,
    must not fill a disk), stderr the kernel's log, whose end the host quotes when a start
    fails."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(log, 2)
    for fd in {log, null} - {0, 1, 2}:
        os.close(fd)


def _request_env(request: dict[str, Any]) -> dict[str, str]:
    """The kernel's environment, from the file the host wrote for it: read and deleted here, in
    the kernel, so the server never holds its text (a token, a key), which would stay in the
    server's freed memory and be copied into every kernel forked after. An older host sends
    the environment in the request itself."""
    path = request.get("env_file")
    if path is None:
        return dict(request["env"])
    try:
        with open(path, encoding="utf-8") as f:
            env: dict[str, str] = json.load(f)
    finally:
        os.unlink(path)  # read or not: it is no one else's to read
    return env


def _reseed() -> None:
    """Seeds a forked kernel must not share with its siblings. numpy's legacy global generator
    (``np.random.rand``...) was seeded from OS entropy once, when the server imported
    ``numpy.random``: every kernel would draw the same numbers. (Python's ``random`` reseeds
    itself in a forked child; ``tempfile`` checks its pid before naming a file; ``uuid.uuid4``
    and ``secrets`` read the OS's entropy on each call. The string hash seed is fixed when the
    interpreter starts: every forked kernel has the server's, and nothing can change it.)"""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        with contextlib.suppress(Exception):  # a seed is not worth a kernel
            numpy_random.seed()


def _as_launched(connection_file: str) -> None:
    """``sys.argv`` (and ``sys.orig_argv``) as a cold kernel, ``python -m ipykernel_launcher
    -f FILE ...``, has them: code that reads its command line sees a kernel's, not the
    server's. (``sys.path`` needs nothing: the server took its own folder off it, and IPython
    inserts '', the kernel's folder, as the kernel starts, as in a cold kernel, whose launcher
    removes the folder ``python -m`` put first.)"""
    args = ["-f", connection_file, *KERNEL_ARGS]
    sys.argv = [_launcher_file(), *args]
    sys.orig_argv = [*sys.orig_argv[:1], "-m", "ipykernel_launcher", *args]


@functools.cache
def _launcher_file() -> str:
    """ipykernel_launcher's file (looked up once, in the server)."""
    spec = importlib.util.find_spec("ipykernel_launcher")
    return spec.origin if spec is not None and spec.origin else "ipykernel_launcher"


def _reset_matplotlib() -> None:
    """matplotlib read MPLBACKEND when the server imported it; the kernel's env decides."""
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is None:
        return
    wanted = os.environ.get("MPLBACKEND", INLINE_BACKEND)
    # The raw value (reading rcParams["backend"] may resolve it); setting it validates the
    # name against matplotlib's backend registry, which is skipped when nothing changes.
    if dict.__getitem__(matplotlib.rcParams, "backend") != wanted:
        matplotlib.rcParams["backend"] = wanted


# Memory a forked kernel allocates lands first in the server's free holes: a free block in a
# small-object pool, a free chunk in the C heap, each on a page the kernel shares with the server
# and so copies whole to write a few bytes. The server fills those holes before it forks (with
# objects and chunks it keeps): a kernel's allocations then go to fresh pages, side by side
# (measured: an idle kernel's private memory 15.5 to 14.3 MiB with numpy, pandas, matplotlib).
_filler: list[Any] = []


def _fill_holes() -> None:
    try:
        _fill_pools(_debugmallocstats())
        _fill_heap()
    except Exception:  # not glibc, or its reports changed: the holes stay, nothing else does
        pass


def _debugmallocstats() -> str:
    """What ``sys._debugmallocstats`` writes (to file descriptor 2, from C)."""
    import tempfile

    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        return f.read().decode("ascii", "replace")


def _fill_pools(stats: str) -> None:
    """A free block in a used pool of each size class taken by an object of that size: ``object()``
    is 16 bytes, a float 24 (the 32-byte class), ``bytes(n)`` 33 + n."""
    import re

    for size, free in re.findall(r"^\s+\d+\s+(\d+)\s+\d+\s+\d+\s+(\d+)\s*$", stats, re.M):
        size_, count = int(size), int(free)
        if size_ >= 48:
            _filler.append([bytes(size_ - 33) for _ in range(count)])
        elif size_ == 32:
            _filler.append([float(i) + 0.5 for i in range(count)])
        elif size_ == 16:
            _filler.append([object() for _ in range(count)])


def _fill_heap() -> None:
    """glibc's per-thread cache of each small chunk size first (7 entries), then every free
    chunk of an exact size its ``malloc_info`` lists (a few rounds: a split chunk leaves a
    smaller one)."""
    import ctypes
    import re

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    for chunk in range(32, 1041, 16):
        _filler.extend(libc.malloc(chunk - 8) for _ in range(7))
    for _ in range(3):
        sizes = re.findall(
            r'<size from="(\d+)" to="\1" total="\d+" count="(\d+)"', _malloc_info(libc)
        )
        for size, count in sizes:
            _filler.extend(libc.malloc(int(size) - 9) for _ in range(int(count)))


def _malloc_info(libc: Any) -> str:
    """The main heap's part of glibc's ``malloc_info`` report."""
    import ctypes

    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    text, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(text), ctypes.byref(size))
    if not stream:
        return ""
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    report = (text.value or b"").decode("ascii", "replace")
    libc.free(ctypes.cast(text, ctypes.c_void_p))
    return report.split('<heap nr="1">')[0].split("</sizes>")[0]


class _Reaper:
    """Reaps the server's kernels as they end and writes each one's exit status (negative: the
    signal that killed it) where its request said, so the host can tell a segfault from an
    exit: only the kernel's parent can learn it."""

    def __init__(self) -> None:
        self.where: dict[int, str] = {}
        self.early: dict[int, int] = {}  # ended before its pid was recorded

    def record(self, pid: int, path: str | None) -> None:
        if path is None:
            return
        if pid in self.early:
            self._write(path, self.early.pop(pid))
        else:
            self.where[pid] = path

    def forget(self, pid: int) -> None:
        """A spare that took no request: reaped (it was killed), its status dropped, so that a
        later kernel given the same pid is not reported as ended."""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        self.early.pop(pid, None)

    def __call__(self, signum: int, frame: Any) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            path = self.where.pop(pid, None)
            if path is None:
                self.early[pid] = code
            else:
                self._write(path, code)

    @staticmethod
    def _write(path: str, code: int) -> None:
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(str(code))
        except OSError:
            pass  # the kernel's folder is gone: its executor has closed


# The process the next kernel becomes, forked ahead once the server has had no request for this
# long: forking the server (numpy, pandas and matplotlib warm) takes about 6.5 ms, which a start
# then skips. Not at once after a request, so a burst of starts (a pool filling) does not fork
# twice per kernel, and a kernel starting is not competing with the fork for the two cores.
SPARE_AFTER = 0.05


class _Spare:
    """A process forked ahead of the next request, waiting for it on a socket of its own; it
    holds none of the server's other file descriptors (so the host sees the server's end at
    once) and ends when its socket closes unused (the server ended).

    A request is handed over only when the spare says it has read it: a spare can die at any
    moment (a kill, the OOM killer), and a dying process keeps its end open while its memory is
    torn down, so a write alone would succeed into a dead spare and its kernel never start."""

    def __init__(self, pid: int, sock: int) -> None:
        self.pid, self.sock = pid, sock

    @staticmethod
    def fork() -> _Spare | None:
        pair = socket.socketpair()
        # A write to a spare that is stopped (not dead) with a request larger than the
        # socket's buffer gives up after HANDOVER_WAIT too, instead of blocking the server.
        seconds = int(HANDOVER_WAIT)
        wait = struct.pack("ll", seconds, int((HANDOVER_WAIT - seconds) * 1e6))
        pair[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, wait)
        ours, theirs = (s.detach() for s in pair)
        try:
            pid = os.fork()
        except OSError:  # no spare then: the next request forks, and says why if it fails
            os.close(ours)
            os.close(theirs)
            return None
        if pid == 0:
            os.close(ours)
            _spare_waits(theirs)
        os.close(theirs)
        _own_fds.add(ours)
        return _Spare(pid, ours)

    def give(self, request: dict[str, Any]) -> int | None:
        """Hand ``request`` to the spare: its pid once it has read it, or None if it did not
        within HANDOVER_WAIT (it is gone, or ended now): a fresh fork then."""
        data = json.dumps(request).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self.sock, data) :]
            ready = select.select([self.sock], [], [], HANDOVER_WAIT)[0]
            if ready and os.read(self.sock, 1) == HANDED:
                return self.pid
        except OSError:  # it died: nothing reads the socket
            pass
        finally:
            _close_own(self.sock)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)  # stopped or stuck: it must not start later
        return None

    def end(self) -> None:
        """The server ends: the spare sees its socket close and exits; reaped here."""
        _close_own(self.sock)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


# How long the server waits for its spare to take a request (its rehearsal may still be running:
# a few milliseconds) before it forks afresh; and the byte that says it took it.
HANDOVER_WAIT = 5.0
HANDED = b"+"


#: a spare's process name while it waits (``ps -e``, ``top``); a kernel takes the server's back
SPARE_NAME = "kx-fork-spare"


def _rename(name: str) -> None:
    with contextlib.suppress(OSError), open("/proc/self/comm", "w", encoding="ascii") as f:
        f.write(name)


def _spare_waits(sock: int) -> None:
    """In a spare: wait for a request, say so, then become its kernel (never returns). It stays
    in the server's session until then (a kernel starts its own), which also tells the two
    apart."""
    try:
        with open("/proc/self/comm", encoding="ascii") as f:
            name = f.read().strip()
        _rename(SPARE_NAME)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the server's protocol pipes stay the server's alone
        os.dup2(null, 1)
        os.close(null)
        _close_own_fds()
        _rehearse()
        held = b""
        while not held.endswith(b"\n"):
            chunk = os.read(sock, 1 << 16)
            if not chunk:
                os._exit(0)  # the server ended without a (whole) request for it
            held += chunk
        os.write(sock, HANDED)  # at once: the server answers the host only after this
        os.close(sock)
        request = json.loads(held)
        _rename(name)
    except BaseException:
        os._exit(1)
    _kernel(request)


def _rehearse() -> None:
    """In a spare, before its request comes: a silent block through the prepared shell and a
    message through the prepared session, so that the pages a kernel's first block writes
    (reference counts of the code and objects it runs) are copied now, while nobody waits.
    Nothing of it stays: no history, no execution count, no names, no output, nothing sent."""
    if _shell is None:
        return
    from ipykernel.kernelapp import IPKernelApp

    with contextlib.suppress(Exception):
        _shell.run_cell("0\n", store_history=False, silent=True)
        _shell.display_formatter.format(0)  # a block's value, as the first block shows one
        session = IPKernelApp.instance().session
        session.serialize(session.msg("status", {"execution_state": "idle"}))


class _Requests:
    """Request lines from the host on a file descriptor, with a wait that can end early."""

    def __init__(self, fd: int) -> None:
        self._fd, self._held = fd, b""

    def next(self, timeout: float | None) -> bytes | None:
        """The next line (b"" at end of input), or None when none came within ``timeout``."""
        while b"\n" not in self._held:
            if timeout is not None and not select.select([self._fd], [], [], timeout)[0]:
                return None
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                return b""
            self._held += chunk
        line, _, self._held = self._held.partition(b"\n")
        return line


def serve(modules: list[str], inp: Any, out: Any) -> int:
    os.environ.setdefault("MPLBACKEND", INLINE_BACKEND)
    # debugpy's note about frozen modules, printed by every kernel otherwise
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    reaper = _Reaper()
    signal.signal(signal.SIGCHLD, reaper)  # kernels are reaped as they end: no zombies
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the host
    problem = _warm_up(modules)
    if problem is not None:
        _answer(out, error=problem)
        return 1
    _launcher_file()  # looked up here once, not in each kernel
    # Objects the server made stay put: the collector would otherwise touch (and so copy)
    # their pages in every forked kernel.
    _list_module_files()
    gc.collect()
    _fill_holes()
    gc.freeze()
    _answer(out, ready=os.getpid())
    requests, spare, tried = _Requests(inp.fileno()), None, False
    try:
        while True:
            line = requests.next(None if tried else SPARE_AFTER)
            if line is None:  # idle: the next kernel's process, forked now (tried once)
                spare, tried = _Spare.fork(), True
                continue
            if not line:
                return 0
            handed, spare, tried = spare, None, False
            _answer(out, **_start_kernel(line, handed, reaper))
    finally:
        if spare is not None:
            spare.end()


def _start_kernel(line: bytes, spare: _Spare | None, reaper: _Reaper) -> dict[str, Any]:
    """Fork a kernel for one request (or hand it to the spare): the answer for the host."""
    # The reaper waits until the new pid is recorded (a kernel may end at once).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        request = json.loads(line)
        _compile_setup(request.get("setup"))  # for the kernels forked from now on
        pid = spare.give(request) if spare is not None else None
        if pid is None and spare is not None:
            reaper.forget(spare.pid)
        if pid is None:
            pid = os.fork()
            if pid == 0:
                _kernel(request)
        reaper.record(pid, request.get("status"))
        return {"pid": pid}
    except (ValueError, OSError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def _protocol_out() -> Any:
    """The host's answers get a descriptor of their own; fd 1 (``print``, C code) then goes
    where fd 2 goes (the server's stderr, not its answers): a warm-up module that prints as it is
    imported (``this``, a library's banner) must not write into the answers."""
    fd = os.dup(1)
    _own_fds.add(fd)
    out = os.fdopen(fd, "w", encoding="utf-8")
    os.dup2(2, 1)
    return out


def _leave_script_folder() -> None:
    """Python put this script's folder (kernelexec's backends) first on ``sys.path``: its
    modules (``base``, ``sandboxed``...) would shadow a warm-up module of the same name and,
    in every kernel, the user's own in the kernel's folder. The server imports nothing from it."""
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == here:
        del sys.path[0]


if __name__ == "__main__":
    _leave_script_folder()
    sys.exit(serve(sys.argv[1:], sys.stdin, _protocol_out()))
