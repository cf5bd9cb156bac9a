"""The stateful executor: blocks run in a long-lived IPython kernel over the Jupyter protocol.

Everything here is protocol-level (execute requests, iopub / shell / stdin messages, interrupt,
restart, liveness through ``KernelBackend``), so the local, Docker and gateway back ends share it.
One block = one ``execute_request``; we drain the iopub messages whose parent is that request
until its ``idle`` status, so a kernel is never left busy to queue the next block.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import enum
import functools
import inspect
import json
import logging
import os
import queue
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ._branch import (
    FORKABLE,
    AsyncLiveSnapshot,
    LiveSnapshot,
    copy_work_dir,
    empty_work_dir,
    pause,
)
from ._budget import full_value
from ._charts import kernel_setup_code
from ._door import Door
from ._durable import (
    SnapshotManifest,
    Verified,
    cloudpickle_sources,
    fetch_remote,
    kernel_call,
    send_remote,
    snapshot_key,
    write,
)
from ._errors import (
    BackendUnavailable,
    ExecutionTimeout,
    ForkUnsupported,
    KernelDied,
    KernelExecError,
    KernelStartFailed,
    RequestAborted,
    SessionBusy,
    SnapshotError,
)
from ._executor import AsyncExecutor, PreparedBlock, SyncExecutor, error_result, make_work_dir
from ._files import FileStore, KernelFiles
from ._jobs import AsyncJob, Job
from ._languages import chdir_code, install_hint, language_kernels, setup_code
from ._outputs import Collected, OutputCollector
from ._types import EXIT_ERROR, EXIT_OK, EXIT_TIMEOUT, ErrorInfo, ExecutionResult, NbOutput
from ._workdir import INTERNAL_DIR
from .backends._iopub import iopub_batch
from .backends.base import KernelBackend
from .backends.docker_fork import DockerForkedKernel
from .backends.forked_kernel import ForkedKernel, fork_backend, fork_request
from .backends.local_kernel import LocalKernel

_log = logging.getLogger("kernelexec")

InputCallback = Callable[[str], "str | Awaitable[str]"]
"""Answers ``input()`` in a block: gets the prompt, returns the line typed."""

_INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
_POLL = 0.5  # seconds between liveness checks while a block is quiet
# After the reply, iopub silent this long: ask the kernel for a marker (see ``_BlockRun._pump``).
_IOPUB_GRACE = 0.5
_LATE_GRACE = 0.2  # the same, for a kernel whose idle status may come before its last output
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # IPython colours its help; the API gives text
_REPLY_GRACE = 2.0  # after ``idle``, how long to wait for the execute_reply
_ABORT_RETRY_PAUSE = 0.2  # before sending again a block the kernel aborted
# Idle longer than this, a kernel whose back end has no cheap liveness check is asked (over the
# network) whether it is still there before a block is sent.
_IDLE_CHECK = 5.0
_ABORTED = (
    "the kernel aborted the request twice (ipykernel refuses requests for a while after a"
    " request that failed with stop_on_error, e.g. from another client of this kernel)"
)

# Run silently after every (re)start: the kernel interpreter's own bin dir first on PATH, so
# ``pip`` in a shell block installs into the kernel's environment. Then the kernel's output is
# made lossless and bounded:
# - its iopub PUB socket gets no send high-water mark: a PUB socket drops messages past it
#   (zmq's default, 1,000) when the reader lags; without it the backlog waits in the kernel
#   (the reader's bounded receive queue pushes back) and nothing is lost; a connection made
#   later keeps the limit (libzmq's rule), so an XPUB socket also waits instead of dropping;
# - its stdout / stderr send what they hold once it passes _STREAM_CHUNK characters, and cut a
#   longer write into such pieces, so no single message is huge: a 100 MB print reaches the
#   host as bounded messages, never as one 100 MB message decoded at once.
_STREAM_CHUNK = 256 * 1024
_ECHO_LIMIT = 1024 * 1024  # bytes of fd 1 / fd 2 output a kernel also writes to its log
_SETUP_CODE = f"""\
def _kx_setup():
    import os, sys
    # A kernel started without PATH (Enterprise Gateway passes none) searches os.defpath; kept
    # after the bin dir, or "bin:" (an empty entry: the work dir) left no sh, no bash at all.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + (
        os.environ.get("PATH") or os.defpath
    )

    def fast_lookup():
        # Each display asks eleven formatters for a printer, each looking the object's classes
        # up in two registries with a trait read per class and registry (about 150 per display,
        # a third of a display's time): here each registry is read once per lookup. Same
        # registries, same order, same result; a subclass with its own deferred lookup keeps
        # the original.
        from IPython.core import formatters
        from IPython.lib.pretty import _get_mro

        base = formatters.BaseFormatter
        slow = base.lookup_by_type
        if getattr(slow, "_kx_fast", False):
            return

        def lookup_by_type(self, typ):
            if isinstance(typ, str) or type(self)._in_deferred_types is not in_deferred:
                return slow(self, typ)
            printers = self.type_printers
            deferred = self.deferred_printers
            for cls in _get_mro(typ):
                if cls in printers or (deferred and self._in_deferred_types(cls)):
                    return printers[cls]
            raise KeyError("No registered printer for " + repr(typ))

        in_deferred = base._in_deferred_types
        lookup_by_type._kx_fast = True
        lookup_by_type._kx_original = slow
        lookup_by_type.__doc__ = slow.__doc__
        base.lookup_by_type = lookup_by_type

    def per_request(shell):
        # Work ipykernel and IPython repeat on every request, done once where the answer
        # cannot change: the signature check of run_cell (inspect.signature each time), the
        # second transform of the same cell (ipykernel transforms it, then IPython's run_cell
        # does again; kept for that one next call and dropped when the cell ends), and debug
        # records built for a logger whose every handler drops them.
        from ipykernel import ipkernel
        from ipykernel.kernelapp import IPKernelApp

        check = getattr(ipkernel, "_accepts_parameters", None)
        if check is not None and not getattr(check, "_kx_cached", False):
            answers = {{}}

            def accepts_parameters(meth, param_names):
                key = (getattr(meth, "__func__", meth), tuple(param_names))
                if key not in answers:
                    answers[key] = check(meth, param_names)
                return dict(answers[key])

            accepts_parameters._kx_cached = True
            ipkernel._accepts_parameters = accepts_parameters

        log = IPKernelApp.instance().log
        levels = [h.level for h in log.handlers]
        if levels and not log.propagate and min(levels) > log.level:
            log.setLevel(min(levels))

        transform = getattr(shell, "transform_cell", None)
        if transform is None or getattr(transform, "_kx_once", False):
            return
        held = [None]

        def transform_cell(raw_cell):
            last, held[0] = held[0], None
            if last is not None and last[0] is raw_cell:
                return last[1]
            cell = transform(raw_cell)
            held[0] = (raw_cell, cell)
            return cell

        def forget(*args):
            held[0] = None

        transform_cell._kx_once = True
        shell.transform_cell = transform_cell
        shell.events.register("post_execute", forget)

    def coalesce_wakes(thread):
        # Every message the kernel sends is queued for its iopub thread, and ipykernel wakes
        # that thread once per message (a socket send and a thread switch each). Here a wake is
        # sent only when none is pending: the thread clears the mark before it takes what is
        # queued, so anything queued after that is either taken then or followed by a wake of
        # its own. The queue, and so the order of messages, is ipykernel's.
        import types

        events, puller = thread._events, thread._event_puller
        if getattr(thread, "_kx_pending", None) is not None or not thread.thread.is_alive():
            return

        def schedule(self, f):
            if not self.thread.is_alive():
                return f()
            events.append(f)
            if not self._kx_pending:
                self._kx_pending = True  # before the send: the thread may clear it at once
                try:
                    self._event_pipe.send(b"")
                except BaseException:
                    self._kx_pending = False  # no wake went: the next message sends one
                    raise

        def handle_event(self, msg):
            self._kx_pending = False
            self._kx_running = True  # what it takes is sent before it reads False again
            try:
                for _ in range(len(events)):
                    events.popleft()()
            finally:
                self._kx_running = False

        def install():  # in the iopub thread: its new handler first, then the senders' side
            puller.on_recv(types.MethodType(handle_event, thread))
            thread.schedule = types.MethodType(schedule, thread)
            thread._kx_ready = True

        thread._kx_pending = thread._kx_running = False
        thread.schedule(install)

    def quiet(thread, stream):
        # True when nothing this stream holds, and nothing queued before now, is still on
        # its way to the iopub socket: a flush would only wait for a thread round trip.
        # Checked in this order (text, then the sender), so text taken after the check
        # is seen as being sent.
        return (
            getattr(thread, "_kx_ready", False)
            and not stream._buffers
            and not stream._kx_sending
            and not thread._events
            and not thread._kx_running
            and not thread._kx_pending
        )

    def own_reader(stream, thread):
        # ipykernel moves what is written to fd 1 / fd 2 (C code, subprocesses) into the stream
        # from a thread of its own, so a flush cannot know whether such text is still on its
        # way and a line printed just before a block ends could miss it. Here a new pipe takes
        # the fd, read by a thread that holds a lock while it moves text into the stream; a
        # flush takes the lock and empties the pipe first. ipykernel's pipe is closed on the
        # writing side, so its thread reads what was left and ends.
        import codecs, fcntl, select, stat, termios, threading

        fd = getattr(stream, "_original_stdstream_fd", None)
        copy = getattr(stream, "_original_stdstream_copy", None)
        if getattr(stream, "_fid", None) is None or copy is None:
            return
        if fd is None:
            # ipykernel 6 does not note which fd it took: the stream's own (1 or 2), if that
            # is still the pipe its reader reads.
            fd = {{"stdout": 1, "stderr": 2}}.get(stream.name)
            if fd is None:
                return
            pipe, read_end = os.fstat(fd), os.fstat(stream._fid)
            if (pipe.st_ino, pipe.st_dev) != (read_end.st_ino, read_end.st_dev):
                return
        pipe = os.fstat(fd)
        left = []  # ipykernel's own write end of that pipe, kept open beside fd
        for name in os.listdir("/proc/self/fd"):
            n = int(name)
            try:
                st = os.fstat(n)
                writes = fcntl.fcntl(n, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
            except OSError:
                continue
            same = (st.st_ino, st.st_dev) == (pipe.st_ino, pipe.st_dev)
            if n != fd and stat.S_ISFIFO(st.st_mode) and writes and same:
                left.append(n)
        r, w = os.pipe()
        os.set_blocking(r, False)
        lock = threading.RLock()
        inside = threading.local()  # set while this thread moves text into the stream
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode

        def take():  # with the lock held: the bytes read, or None when the pipe is empty
            try:
                data = os.read(r, 65536)
            except BlockingIOError:
                return None
            text = decode(data) if data else ""
            if text and stream._should_watch:
                # The stream's write flushes past 256 KiB; that flush must not drain the pipe
                # again from inside this write (a long write to the fd nested one drain per
                # 256 KiB until the reader died of recursion, and the writer then waited).
                inside.on = True
                try:
                    stream.write(text)
                finally:
                    inside.on = False
            return data

        echoed = [0]

        def echo(data):
            # As ipykernel does, what was written to the fd also goes where the fd went before
            # (the kernel's log: the last words of a crash are kept there), up to a bound: a
            # block that floods the fd must not fill the log's disk.
            room = {_ECHO_LIMIT} - echoed[0]
            if room <= 0:
                return
            try:
                echoed[0] += os.write(copy, data[:room])
            except OSError:
                pass

        def drain(final=False):
            if getattr(inside, "on", False):
                return
            taken = []
            with lock:
                while (data := take()):
                    taken.append(data)
                # At a request's end, the start of a character cut off by the end of what was
                # written is shown there, not carried into the next request's text.
                rest = decode(b"", True) if final else ""
                if rest and stream._should_watch:
                    stream.write(rest)
            for data in taken:
                echo(data)

        def watch():
            # ipykernel 6.29 ties a thread started during a request to that request's header
            # for good (so the set-up run's): its text went out under that request, shown in
            # no block. This thread writes for the request running, as ipykernel's own does.
            for table in ("_thread_to_parent_header", "_thread_to_parent"):
                getattr(stream, table, {{}}).pop(threading.get_ident(), None)
            while stream._should_watch:
                try:
                    select.select([r], [], [])
                except (OSError, ValueError):
                    return
                with lock:
                    data = take()
                if data == b"" or not stream._should_watch:
                    return  # the pipe closed, or ipykernel is closing the stream
                if data:
                    echo(data)

        empty = bytes(4)

        def before_write():
            # A line of Python-level text (print) comes after what was written to the fd before
            # it (by this thread, or a child that has ended): text still in the pipe goes first,
            # or a print overtook an os.write just before it (2 of 5 blocks of 30 pairs mixed
            # up). FIONREAD: one cheap call when the pipe is empty, as it nearly always is.
            try:
                waiting = fcntl.ioctl(r, termios.FIONREAD, empty) != empty
            except OSError:
                waiting = True
            if waiting:
                drain()
            else:
                # Empty, or the reader has just taken the text out and is moving it into the
                # stream, which it does holding the lock: waited for, or this print overtakes
                # it (seen on a loaded machine: p4 before f3).
                with lock:
                    pass

        reader = threading.Thread(target=watch, name="kernelexec-" + stream.name, daemon=True)
        os.dup2(w, fd)  # from here on, what is written to fd goes to the new pipe
        os.close(w)
        for n in left:
            os.close(n)
        stream._kx_drain = drain
        stream._kx_before_write = before_write
        stream._fid = r
        stream.watch_fd_thread = reader  # joined by ipykernel when it closes the stream
        reader.start()

    def quick_flush(stream, thread):
        # A flush from the kernel's own thread waits for a round trip through the iopub thread,
        # four per request (before the reply and before idle, stdout and stderr): that wait is
        # skipped when nothing is on its way (see quiet), after text still in the fd pipe has
        # been moved into the stream. With text to send, ipykernel's flush runs as before.
        import threading

        from ipykernel.kernelbase import Kernel

        slow, send = stream.flush, getattr(stream, "_flush", None)
        if getattr(slow, "_kx_quick", False) or send is None:
            return
        own = set()
        for name in ("execute_request", "dispatch_shell"):
            code = getattr(getattr(Kernel, name, None), "__code__", None)
            if code is not None:
                own.add(code)
        if not isinstance(getattr(stream, "_buffers", None), dict) or not hasattr(stream, "_hooks"):
            # Another ipykernel's stream (ipykernel 6: one buffer): its own flush stays, after
            # the fd pipe is emptied into it. Without that, what a child wrote just before the
            # block ended reached the stream after the idle status: in the next block, or
            # (sent under this block's header after its idle) nowhere.
            def drained_flush():
                if threading.current_thread() is not thread.thread:
                    ending = sys._getframe(1).f_code in own
                    getattr(stream, "_kx_drain", lambda final=False: None)(ending)
                return slow()

            drained_flush._kx_quick = True
            stream.flush = drained_flush
            return
        stream._kx_sending = False

        def sending():
            stream._kx_sending = True
            try:
                return send()
            finally:
                stream._kx_sending = False

        def flush():
            if threading.current_thread() is not thread.thread:
                ending = sys._getframe(1).f_code in own
                getattr(stream, "_kx_drain", lambda final=False: None)(ending)
                if quiet(thread, stream):
                    return
                if ending and not stream._kx_sending and not stream._hooks:
                    # ipykernel's own flush after a request, with the iopub thread not sending
                    # this stream: the text is taken and its message queued here, ahead of the
                    # idle status (one queue, sent in order), instead of waiting for that thread
                    # to take it. (Scheduling the flush for that thread would let the idle status
                    # overtake the text: the thread queues the message it builds behind it.)
                    stream._flush()
                    return
            return slow()

        flush._kx_quick = True
        stream._flush = sending
        stream.flush = flush

    def lossless(socket):
        # No send limit for the connections the socket has now. libzmq gives a connection
        # made later the options the socket had when it was bound (1,000 messages), so an
        # XPUB socket (ipykernel 7) is also told to wait, not drop, when one is full: a
        # subscriber that connects later and lags pauses the kernel's output, loses none.
        socket.setsockopt(zmq.SNDHWM, 0)
        if socket.type == zmq.XPUB and hasattr(zmq, "XPUB_NODROP"):
            socket.setsockopt(zmq.XPUB_NODROP, 1)

    try:
        import zmq
        from ipykernel.kernelapp import IPKernelApp
        if IPKernelApp.initialized():
            app = IPKernelApp.instance()
            thread = app.iopub_thread
            thread.schedule(lambda: lossless(thread.socket))
            # ipykernel sleeps 0.5 ms before each reply "so outputs reach clients first"; the
            # executor waits for the block's idle status and its marker instead.
            if hasattr(app.kernel, "_execute_sleep"):
                app.kernel._execute_sleep = 0
            coalesce_wakes(thread)
            for stream in (sys.stdout, sys.stderr):
                if type(stream).__name__ == "OutStream" and stream.pub_thread is thread:
                    try:
                        own_reader(stream, thread)
                    except Exception:
                        continue  # ipykernel's reader stays, and so does its flush
                    quick_flush(stream, thread)
    except Exception:
        pass

    def bound(stream, chunk={_STREAM_CHUNK}):
        write = getattr(stream, "write", None)
        if type(stream).__name__ != "OutStream" or getattr(write, "_kx_bounded", False):
            return
        held = [0]
        line_start = [True]

        def bounded_write(text):
            # Text still in the fd pipe goes first when a new line starts (once per line, not
            # per write: the check is a system call, and print writes twice).
            before = getattr(stream, "_kx_before_write", None)
            if line_start[0] and before is not None:
                before()
            if isinstance(text, str) and text:
                line_start[0] = text.endswith("\\n")
            if not isinstance(text, str) or held[0] + len(text) < chunk:
                held[0] += len(text) if isinstance(text, str) else 0
                return write(text)
            for start in range(0, len(text), chunk):
                write(text[start:start + chunk])
                stream.flush()
            held[0] = 0
            return len(text)

        bounded_write._kx_bounded = True
        stream.write = bounded_write

    def bound_streams():
        bound(sys.stdout)
        bound(sys.stderr)

    bound_streams()

    # Before each display ipykernel flushes stdout and stderr, and a flush from the main thread
    # waits for a round trip through the iopub thread: two per display, most of the kernel's
    # time in a display loop. When a stream holds no text there is nothing to send ahead of
    # the display, so its flush is skipped; text waiting is flushed (and waited for) as before.
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    pub = getattr(shell, "display_pub", None)
    if pub is not None and hasattr(pub, "_flush_streams"):

        def flush_streams():
            for stream in (sys.stdout, sys.stderr):
                # Waited for when text is waiting: ipykernel takes a stream's text when its
                # thread sends it, and text printed after the display must not go with it.
                if getattr(stream, "_buffers", True):  # not an OutStream, or text is waiting
                    stream.flush()

        pub._flush_streams = flush_streams
    try:
        fast_lookup()
    except Exception:
        pass
    try:
        per_request(shell)
    except Exception:
        pass
    # IPython 9 swaps a stream's ``write`` for a history tee around each cell and puts back
    # what it found afterwards, which drops the patch: so it is put on again as each cell starts.
    if shell is not None:
        shell.events.register("pre_execute", bound_streams)


_kx_setup()
del _kx_setup
"""


# Sent as one string literal: IPython tokenizes a cell twice before running it, and the set-up
# code's thousand tokens cost each new kernel about 7 ms (measured: the set-up run took 15.6 ms
# as code, 8.5 ms as one literal, in a forked kernel).
def _setup_cell(code: str) -> str:
    return f"exec(compile({code!r}, '<kernelexec set-up>', 'exec'))\n"


class _Ending(enum.Enum):
    DONE = "done"  # idle (or the reply) came back
    TIMED_OUT = "timed out"  # the interrupt took; state kept
    STUCK = "stuck"  # the interrupt did not take; the kernel must be replaced
    DIED = "died"  # the kernel process is gone


@dataclass(frozen=True)
class _Run:
    ending: _Ending
    reply: dict[str, Any] | None


class AsyncKernelExecutor(AsyncExecutor):
    """Runs blocks in an IPython kernel (stateful): variables and imports persist."""

    kind = "kernel"

    def __init__(
        self,
        backend: KernelBackend | None = None,
        *,
        kernel_name: str = "python3",
        python: str | os.PathLike[str] | None = None,
        input: InputCallback | None = None,
        restart_on_death: bool = True,
        interrupt_grace: float = 3.0,
        startup_timeout: float = 60.0,
        checkpoint: str | None = None,
        languages: Mapping[str, str | None] | None = None,
        **options: Any,
    ) -> None:
        if backend is not None and python is not None:
            raise ValueError("give either backend= or python=, not both")
        if checkpoint not in (None, "block"):
            raise ValueError(f"checkpoint is None or 'block', not {checkpoint!r}")
        self.backend = backend or LocalKernel(kernel_name=kernel_name, python=python)
        if checkpoint is not None and self.backend.kind not in FORKABLE:
            raise ForkUnsupported(
                f"checkpoint='block' keeps a forked copy of the kernel, which a"
                f" {self.backend.kind} back end does not allow"
            )
        if checkpoint is not None and _dies_with_kernel(self.backend):
            # The copy would live in the kernel's sandbox, which ends when the kernel dies.
            raise ForkUnsupported(
                "checkpoint='block' is not for a sandboxed kernel: its checkpoint would live in"
                " the kernel's sandbox, which ends with the kernel it is meant to outlive"
            )
        #: ``"block"``: a live snapshot is kept after each successful block, so a block that
        #: kills its kernel costs only itself (see ``_died``)
        self.checkpoint = checkpoint
        self._checkpoint: AsyncLiveSnapshot | None = None
        #: canonical language -> kernelspec, for blocks in other languages (``_languages``)
        self.languages = language_kernels(languages)
        super().__init__(**options)
        self.input_callback = input
        self.restart_on_death = restart_on_death
        self.interrupt_grace = interrupt_grace
        self.startup_timeout = startup_timeout
        # Read when built, never at import. Figures go to the notebook-style inline backend even
        # if the host's environment names another one.
        host = os.environ if self.backend.inherits_host_env else {}
        self._env = {**host, "MPLBACKEND": _INLINE_BACKEND, **self.options.env}
        # ipykernel stops capturing fd-level output (os.write, child processes) when it sees
        # pytest's marker; a kernel started from a test is not itself a test.
        self._env.pop("PYTEST_CURRENT_TEST", None)
        self._dead: str | None = None
        self._idle_since = 0.0  # loop time the last block ended (or the kernel started)
        self._sent_at = 0.0  # time.time() just before the running block was sent
        # The set-up code runs inside each kernel as it starts where the back end offers it
        # (a forked kernel: one round trip less, about 6 ms of its start), else as a request.
        self._setup_code = _SETUP_CODE + (kernel_setup_code() if self.options.charts else "")
        self._setup_at_start = self._python and self.backend.run_at_start(self._setup_code)
        # Forks of a session and their snapshots share its lineage: a snapshot restores into
        # any of them, never into another session.
        self._lineage: object = object()
        self._snapshots: list[AsyncLiveSnapshot] = []
        # A sandboxed session restored from a live snapshot runs a fork inside the sandbox its
        # first kernel made; that kernel is kept (its sandbox ends with it) until a restart
        # (a fresh sandbox) or close.
        self._origin: KernelBackend | None = None
        self._fork_jobs: list[AsyncJob] = []  # submit(on_fork=True): jobs on forks of this session
        #: a resumed executor: the durable snapshot's manifest (what came back, name by name)
        self.restored: SnapshotManifest | None = None
        #: a fork: ``"process"`` (the kernel process forked) or ``"snapshot"`` (a fresh kernel
        #: loaded from a durable snapshot of the parent: ``restored`` says what came back)
        self.forked_via: str | None = None
        self._fork_source: _ForkSource | None = None
        self._blank = False  # a fork's kernel, started and not yet used (see ``_begin_fork``)
        # The other languages' kernels, by kernelspec (JavaScript and TypeScript share Deno's),
        # started on a block's first use; ``_running`` is the one a block runs in now.
        self._others: dict[str, _LanguageKernel] = {}
        self._running: AsyncKernelExecutor | None = None

    #: False for another language's kernel: no IPython set-up code, no ``%%bash`` cells
    _python = True
    #: True for a kernel that may publish a block's output after its ``idle`` status (Deno 2.9
    #: did, for 3 of 6 first blocks): its blocks end with a marker request instead
    _late_outputs = False

    @property
    def supported_languages(self) -> tuple[str, ...]:
        own = ("python", "shell")
        if not self._python or not self.backend.runs_other_kernels:
            return own
        return (*own, *(lang for lang in self.languages if lang not in own))

    async def interrupt(self) -> None:
        """Interrupt the running block (it ends with ``KeyboardInterrupt``); state is kept."""
        self._check_open()
        running = self._running
        if running is not None and running is not self:
            await running.backend.interrupt()
        elif self._started:
            await self.backend.interrupt()

    async def complete(self, code: str, cursor_pos: int | None = None) -> list[str]:
        """What the kernel would complete at ``cursor_pos`` (default: the end of ``code``):
        whole replacements for ``code[start:cursor_pos]``, as Jupyter's completer sends them,
        with ``start`` in ``completion_start(...)`` terms. Empty where the kernel offers none."""
        reply = await self._ask("complete", code, cursor_pos)
        return [str(m) for m in reply.get("matches") or []]

    async def completion_start(self, code: str, cursor_pos: int | None = None) -> int:
        """Where the text the completions replace begins."""
        reply = await self._ask("complete", code, cursor_pos)
        return int(reply.get("cursor_start", len(code) if cursor_pos is None else cursor_pos))

    async def inspect(self, code: str, cursor_pos: int | None = None, detail_level: int = 0) -> str:
        """The kernel's help for the name at ``cursor_pos`` (``obj?``; ``detail_level=1``:
        ``obj??``, with the source), as plain text; empty when it knows none."""
        reply = await self._ask("inspect", code, cursor_pos, detail_level=detail_level)
        if not reply.get("found"):
            return ""
        return _ANSI.sub("", str((reply.get("data") or {}).get("text/plain", "")))

    async def _ask(
        self, kind: str, code: str, cursor_pos: int | None, **extra: Any
    ) -> dict[str, Any]:
        """A shell request of the kernel's own (complete, inspect) and its reply's content.
        Behind any running block (the shell channel's replies are read by one reader)."""
        self._check_open()
        position = len(code) if cursor_pos is None else cursor_pos
        async with self._lock:
            self._check_open()
            await self._ensure_started()
            send = getattr(self.backend.client, kind, None)
            if send is None:  # a remote channel without the request: nothing to offer
                return {}
            msg_id = send(code, position, **extra)
            try:
                reply = await asyncio.wait_for(_reply_for(self.backend, msg_id), self.timeout)
            except asyncio.TimeoutError as exc:
                raise ExecutionTimeout(
                    f"the kernel did not answer within {self.timeout} s"
                ) from exc
        return reply if reply.get("status") == "ok" else {}

    async def restart(self) -> None:
        """A new kernel (all state is lost); a block running meanwhile (another task or thread)
        is interrupted first rather than waited for."""
        await self._stop_running_block()
        await super().restart()

    async def close(self) -> None:
        """Shut the kernel down; a block running meanwhile (another task or thread) is
        interrupted first rather than waited for (it returns its ``KeyboardInterrupt``); jobs
        are cancelled first (they end ``cancelled``, not with that interrupt)."""
        if not self.closed and os.getpid() == self._owner:
            await self._end_fork_jobs()
            await self._end_jobs()
        await self._stop_running_block()
        started = self._started
        await super().close()
        if not started and isinstance(self.backend, (ForkedKernel, DockerForkedKernel)):
            await self.backend.shutdown()  # a fork never started: its forked process goes

    async def _stop_running_block(self) -> None:
        # Only once the kernel is up: SIGINT to a kernel still starting could end it.
        if self._lock.locked() and self._started and not self.closed:
            with contextlib.suppress(Exception):
                await self.interrupt()

    # -- AsyncExecutor hooks ---------------------------------------------------------------
    async def _start(self) -> None:
        await self.backend.start(
            work_dir=self.work_dir, env=self._env, timeout=self.startup_timeout
        )
        await self._setup()
        self._idle_since = asyncio.get_running_loop().time()

    async def _restart(self) -> None:
        await self._drop_checkpoint()  # a fresh kernel: the old state is not to come back
        await self._stop_others()
        await self._replace_kernel()

    async def _close(self) -> None:
        # The session's live snapshots are paused kernels of its own: they go with it.
        try:
            await self._drop_checkpoint()
            await self._release_snapshots()
            await self._stop_others()
        finally:
            try:
                await self.backend.shutdown()
            finally:
                origin, self._origin = self._origin, None
                if origin is not None:
                    await origin.shutdown()

    async def _release_snapshots(self) -> None:
        snapshots, self._snapshots = self._snapshots, []
        for snapshot in snapshots:
            with contextlib.suppress(Exception):
                await snapshot.release()

    async def _stop_others(self) -> None:
        """Shut the other languages' kernels down (a restart starts them again on first use)."""
        others, self._others = list(self._others.values()), {}
        for other in others:
            with contextlib.suppress(Exception):
                await other.close()

    # -- fork and live snapshots -------------------------------------------------------------
    async def fork(self, n: int | None = None, *, via: str | None = None) -> Any:
        """A new executor whose kernel holds this one's state (every variable, import, figure)
        and whose work dir is a copy of this one's; the two then diverge. ``fork(n=3)``: a
        list of three. The kernel process is forked copy-on-write (local, fork-server,
        sandboxed and Docker kernels; a Docker kernel's fork is a process of the same
        container, working in ``/kx-branches/<name>``: absolute ``/workspace`` paths there
        still name this session's folder); a kernel whose process cannot be forked but whose
        back end offers a ``fresh_copy`` (gateway, provisioned; Docker with ``bind_dir``)
        forks through a durable snapshot: a fresh kernel of the same kind loaded from it,
        ``forked_via == "snapshot"``, its ``restored`` naming what did not come back;
        ``ForkUnsupported`` elsewhere. ``via="snapshot"`` asks for that route where both exist
        (a Docker fork in a container of its own), ``via="process"`` for a process fork only.
        This session is undisturbed. Refused with ``SessionBusy`` while a block runs. Each
        fork is closed on its own."""
        count = 1 if n is None else n
        children = await self._forked(count, via)
        try:
            for child in children:
                await child._begin_fork()
        except BaseException:
            await _close_all(children)
            raise
        finally:
            _drop_fork_sources(children)
        return children[0] if n is None else children

    async def submit(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
        on_fork: bool = False,
        keep_fork: bool = False,
    ) -> AsyncJob:
        """Start a block in the background and return its job at once (see
        ``AsyncExecutor.submit``). ``on_fork=True``: the job runs on a fork of this session,
        taken now (``SessionBusy`` while a block runs here), so the session stays free for
        other blocks; the job's state is the fork's (``job.fork``), which is closed when the
        job ends, unless ``keep_fork=True`` (then it closes with this session, or before)."""
        if not on_fork:
            if keep_fork:
                raise ValueError("keep_fork=True is for a job on a fork (on_fork=True)")
            return await super().submit(code, language, timeout=timeout)
        child: AsyncKernelExecutor = await self.fork()
        try:
            job = await child.submit(code, language, timeout=timeout)
        except BaseException:
            await child.close()
            raise
        job.fork, job.fork_kept = child, keep_fork
        self._fork_jobs.append(job)
        job.at_end(functools.partial(self._fork_job_ended, job))
        return job

    async def _fork_job_ended(self, job: AsyncJob) -> None:
        if not job.fork_kept:
            with contextlib.suppress(ValueError):
                self._fork_jobs.remove(job)
            await cast(AsyncKernelExecutor, job.fork).close()

    async def _end_fork_jobs(self) -> None:
        """At close: jobs on forks cancelled, and their forks (kept ones too) closed."""
        jobs, self._fork_jobs = self._fork_jobs, []
        await asyncio.gather(*(job.cancel() for job in jobs), return_exceptions=True)
        for job in jobs:
            with contextlib.suppress(Exception):
                await cast(AsyncKernelExecutor, job.fork).close()

    async def _forked(self, count: int, via: str | None = None) -> list[AsyncKernelExecutor]:
        """``count`` forks, their kernels forked and not yet connected to: each is started on
        the event loop that will drive it (the sync twin gives each its own)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"n is a number of forks (1 or more), not {count!r}")
        if via not in (None, "process", "snapshot"):
            raise ValueError(f"via is None, 'process' or 'snapshot', not {via!r}")
        backend = self.backend
        live = backend.kind in FORKABLE and backend.forks_live
        if via == "snapshot" or (via is None and not live):
            if backend.fresh_copy() is not None:
                return await self._forks_via_snapshot(count)
            if via == "snapshot":
                raise ForkUnsupported(f"a {backend.kind} back end cannot fork through a snapshot")
        if via == "process" and backend.kind in FORKABLE and not live:
            raise ForkUnsupported(f"this {backend.kind} back end cannot fork its kernel process")
        try:
            async with self._branching("fork()"):
                return await self._forks(count, lineage=self._lineage, live=True)
        except ForkUnsupported:
            # Refused before anything was forked (gVisor under a low pids_limit): where a
            # snapshot route exists, a plain fork() takes it (forked_via says so).
            if via is not None or backend.fresh_copy() is None:
                raise
        return await self._forks_via_snapshot(count)

    async def snapshot(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        key: bytes | str | os.PathLike[str] | None = None,
    ) -> Any:
        """A live snapshot: a paused forked copy of the kernel (milliseconds, copy-on-write)
        and a copy of the work dir. ``restore(snapshot)`` makes it current again (as often as
        asked); ``snapshot.release()`` frees it; closing the session releases it too. Its
        pages count toward the machine's memory as the session's own do when written.

        With ``path``: a durable snapshot, one file signed with ``key`` (see ``_durable``):
        the namespace name by name, the imports, the work dir's files; its
        ``SnapshotManifest`` is returned (which names could not be saved, and why)."""
        if path is not None:
            return await self._save_durable(Path(path), snapshot_key(key))
        async with self._branching("snapshot()"):
            snapshot = await self._paused_copy()
        self._snapshots.append(snapshot)
        return snapshot

    async def _paused_copy(self) -> AsyncLiveSnapshot:
        """A live snapshot: a fork of the kernel (the session's lock held), started, then
        paused. A fork that fails leaves nothing behind."""
        (holder,) = await self._forks(1, lineage=self._lineage)
        try:
            await holder.start()
        except BaseException:
            await holder.close()
            raise
        await _pause(holder, paused=True)
        return AsyncLiveSnapshot(
            holder, lineage=self._lineage, kind=self.backend.kind, release=holder.close
        )

    async def restore(
        self,
        snapshot: AsyncLiveSnapshot | LiveSnapshot | str | os.PathLike[str],
        *,
        key: bytes | str | os.PathLike[str] | None = None,
    ) -> Any:
        """Make a live snapshot of this session (or of a fork of it) current: the kernel is
        replaced by a fresh fork of the snapshot (which stays as it was, for another restore)
        and the work dir's files by the snapshot's. Refused with ``SnapshotError`` for a
        released snapshot or one of another session, ``SessionBusy`` while a block runs.

        A path: a durable snapshot, checked against ``key`` before anything in it is read,
        loaded into a fresh kernel; returns its ``SnapshotManifest`` (each name restored or
        not restorable, and why)."""
        if isinstance(snapshot, (str, os.PathLike)):
            return await self._restore_durable(Path(snapshot), snapshot_key(key))
        if isinstance(snapshot, LiveSnapshot):
            snapshot = snapshot.aio
        if not isinstance(snapshot, AsyncLiveSnapshot):
            raise SnapshotError(f"not a live snapshot: {snapshot!r}")
        if snapshot.released:
            raise SnapshotError("this snapshot was released: it can no longer be restored")
        if snapshot._lineage is not self._lineage:
            raise SnapshotError(
                "this snapshot was taken from another session: restore it there (or into a"
                " fork of that session)"
            )
        async with self._branching("restore()", live=False):
            await self._restore_live(snapshot)

    async def _restore_live(self, snapshot: AsyncLiveSnapshot, *, files: bool = True) -> None:
        """Replace the kernel by a fresh fork of ``snapshot`` (the session's lock held);
        ``files``: the work dir's files put back as the snapshot has them."""
        holder: AsyncKernelExecutor = snapshot._holder
        if not await snapshot.at_home(holder.backend.is_alive):
            # a sandboxed session's snapshots live in its sandbox, which a restart ended
            raise SnapshotError("this snapshot's paused kernel has ended: it cannot be restored")
        backend = self._forked_backend()
        backend.run_at_start(_SETUP_CODE)
        request = backend.prepare(work_dir=self.work_dir)

        async def fork_holder() -> int:
            await _pause(holder, paused=False)
            try:
                async with holder._lock:
                    return await holder._fork_process(request)
            finally:
                await _pause(holder, paused=True)

        try:
            pid = await snapshot.at_home(fork_holder)
        except BaseException as exc:
            await backend.shutdown()  # its folder and cgroup, prepared for nothing
            # Killed meanwhile: a loaded machine shows a killed process a while longer.
            alive = holder.backend.is_alive
            if isinstance(exc, Exception) and not await snapshot.at_home(alive):
                raise SnapshotError(
                    "this snapshot's paused kernel has ended: it cannot be restored"
                ) from None
            raise
        backend.adopted(pid)
        if files:
            await asyncio.to_thread(
                copy_work_dir, holder._door, self._door, replace=True, owner=backend.owner
            )
        old, self.backend = self.backend, backend
        try:
            await backend.start(work_dir=self.work_dir, env=self._env, timeout=self.startup_timeout)
        except BaseException:
            self.backend = old  # the session keeps the kernel it had
            await backend.shutdown()
            raise
        self._dead = None
        self._idle_since = asyncio.get_running_loop().time()
        if old.holds_forks:
            self._origin = old  # the new kernel lives in its sandbox (or container)
            if old.retires:
                await old.retire()  # a Docker kernel: its process ends, its container stays
        else:
            await old.shutdown()

    # -- fork through a durable snapshot (a kernel whose process cannot be forked) --------------
    async def _forks_via_snapshot(self, count: int) -> list[AsyncKernelExecutor]:
        """``count`` new executors, each on a fresh back end of this one's kind, to be loaded
        (by ``_begin_fork``, on the loop that drives each) from one durable snapshot of this
        session, signed with a key made for it alone and removed once they are loaded. The
        snapshot is taken meanwhile (a task on this loop, the session's lock held from the
        start): each fork's kernel starts while it is written (a gateway's kernel takes
        seconds to start; the snapshot as long, or longer)."""
        source = _ForkSource()
        source.saving = asyncio.ensure_future(self._save_durable(source.path, source.key))
        await asyncio.sleep(0)  # it takes the lock now (or finds a block running: SessionBusy)
        try:
            if source.saving.done():
                source.saving.result()
            children: list[AsyncKernelExecutor] = []
            for _ in range(count):
                backend = self.backend.fresh_copy()
                if backend is None:  # pragma: no cover - checked by the caller
                    raise ForkUnsupported(f"a {self.backend.kind} back end cannot be copied")
                child = self._child(backend)
                child._fork_source = source
                children.append(child)
        except BaseException:
            await source.drop()
            raise
        return children

    async def _begin_fork(self) -> None:
        """Start a fork: a process fork is connected to; a fork through a snapshot is a fresh
        kernel, started while the snapshot is taken, that it is then loaded into
        (``restored`` says, name by name, what came back)."""
        source = self._fork_source  # removed by the caller once every fork began
        if source is None:
            await self.start()
            self.forked_via = "process"
            return
        await self.start()
        await source.taken()
        self._blank = True  # nothing ran in it: the snapshot is loaded into this very kernel
        self.restored = await self.restore(source.path, key=source.key)
        self.forked_via = "snapshot"

    async def _take_checkpoint(self, block: PreparedBlock) -> None:
        """``checkpoint="block"``: a live snapshot after a successful block, in place of the
        last one. One that cannot be taken (no memory to fork) leaves the last one, said in
        the log: the block's result is not changed by it."""
        try:
            snapshot = await self._paused_copy()
        except Exception as exc:
            _log.warning("no checkpoint after block %s: %s", block.index, exc)
            return
        snapshot.label = f"checkpoint after block {block.index}"
        if self.backend.retires:
            # A Docker kernel is its container's first process: the session moves to a fork
            # of the checkpoint (same state, same files), so that a block that kills its kernel
            # no longer ends the container the checkpoint lives in.
            try:
                await self._restore_live(snapshot, files=False)
            except Exception as exc:
                _log.warning("no checkpoint after block %s: %s", block.index, exc)
                await snapshot.release()
                return
        old, self._checkpoint = self._checkpoint, snapshot
        if old is not None:
            await old.release()

    async def _drop_checkpoint(self) -> None:
        old, self._checkpoint = self._checkpoint, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.release()

    @classmethod
    async def resume(
        cls,
        path: str | os.PathLike[str],
        *,
        key: bytes | str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> AsyncKernelExecutor:
        """A new executor (built with ``options``) holding a durable snapshot's state; its
        ``restored`` attribute is the snapshot's manifest, name by name."""
        executor = cls(**options)
        try:
            executor.restored = await executor.restore(path, key=key)
        except BaseException:
            await executor.close()
            raise
        return executor

    async def _save_durable(self, path: Path, key: bytes) -> SnapshotManifest:
        async with self._durable_lock("snapshot(path=...)"):
            await self._ensure_cloudpickle()
            folder = self._scratch()
            try:
                saved = await self._kernel_json(f"save({self._in_kernel(folder)!r})")
                async with self._durable_files(folder, saved) as door:
                    return await asyncio.to_thread(
                        write,
                        path,
                        key,
                        saved=saved,
                        pickles=door,
                        folder=folder,
                        work=door,
                        kind=self.backend.kind,
                        kernel_name=getattr(self.backend, "kernel_name", None),
                    )
            finally:
                await self._drop_scratch(folder)

    async def _restore_durable(self, path: Path, key: bytes) -> SnapshotManifest:
        verified = await asyncio.to_thread(Verified, path, key)
        try:
            async with self._durable_lock("restore()"):
                fresh, self._blank = not self._started or self._blank, False
                await self._check_python(verified.manifest["python"], path)
                if not fresh:
                    await self._replace_kernel()  # a fresh kernel, as a resume gets
                await self._ensure_cloudpickle()
                folder = self._scratch()
                try:
                    await self._unpack_durable(verified, folder)
                    names = json.dumps(verified.manifest["names"])
                    call = f"load({self._in_kernel(folder)!r}, {names!r})"
                    fates = await self._kernel_json(call)
                finally:
                    await self._drop_scratch(folder)
                return verified.result(path, fates)
        finally:
            verified.close()

    # A kernel on another machine (gateway, provisioned) does not share the work dir: the
    # pickles and files of a durable snapshot move through the kernel, via a local mirror.
    @contextlib.asynccontextmanager
    async def _durable_files(self, folder: str, saved: dict[str, Any]) -> Any:
        """A door onto the snapshot's pickles (in ``folder``) and the work dir's files."""
        if self.backend.shares_work_dir:
            yield self._door
            return
        work = await self._kernel_json(f"files({self._in_kernel('.')!r})")
        with (
            tempfile.TemporaryDirectory(prefix="kernelexec-snapshot-") as mirror,
            Door(mirror) as door,
        ):
            await fetch_remote(self._remote_files(), saved, folder, work, door)
            yield door

    async def _unpack_durable(self, verified: Verified, folder: str) -> None:
        if self.backend.shares_work_dir:
            # A container's or sandbox's user must own what it is to write again.
            owner = self.backend.owner
            await asyncio.to_thread(_unpack, verified, self._door, folder, owner)
            return
        with (
            tempfile.TemporaryDirectory(prefix="kernelexec-resume-") as mirror,
            Door(mirror) as door,
        ):
            await asyncio.to_thread(_unpack, verified, door, folder)
            await self._kernel_json(f"empty({self._in_kernel('.')!r})")
            await send_remote(self._remote_files(), door)

    def _remote_files(self) -> KernelFiles:
        # No per-file cap: the data streams to disk, never whole in memory. 4 MiB messages
        # (5.4 MiB in base64, under Tornado's 10 MiB WebSocket limit) halved a 16 MiB
        # transfer's time against 1 MiB ones on a gateway.
        return KernelFiles(self._evaluate, self._in_kernel("."), limit=1 << 62, chunk=4 << 20)

    async def _drop_scratch(self, folder: str) -> None:
        if self.backend.shares_work_dir:
            shutil.rmtree(self.work_dir / folder, ignore_errors=True)
        else:
            with contextlib.suppress(Exception):  # a dead kernel took its folder with it
                await self._kernel_json(f"drop({self._in_kernel(folder)!r})")

    async def _ensure_cloudpickle(self) -> None:
        """A kernel without cloudpickle (the Docker image, a gateway's kernel) gets the host's
        copy, sent as source text: the kernel serves it from a finder of its own (see
        ``_durable.ship``), so no package is installed anywhere."""
        if await self._kernel_json("has_cloudpickle()"):
            return
        sources = cloudpickle_sources()
        if sources is not None:
            await self._kernel_json(f"ship({sources!r})")

    @contextlib.asynccontextmanager
    async def _durable_lock(self, what: str) -> Any:
        self._check_open()
        if self._lock.locked():
            raise SessionBusy(
                f"a block is running in this session: {what} is refused while it runs"
            )
        async with self._lock:
            self._check_open()
            await self._ensure_started()
            yield

    def _scratch(self) -> str:
        """A fresh folder under kernelexec's own folder of the work dir (relative path); a
        remote kernel makes it itself (``save``)."""
        folder = f"{INTERNAL_DIR}/snapshot-{uuid.uuid4().hex[:12]}"
        if self.backend.shares_work_dir:
            self._door.makedirs(folder)
            # A container user (the Docker kernel) owns the work dir, not root: it writes the
            # pickles here, so the folder is given to the work dir's owner.
            root = os.stat(self.work_dir)
            if os.geteuid() == 0 and root.st_uid != 0:
                self._door.chown(folder, root.st_uid, root.st_gid)
        return folder

    def _in_kernel(self, rel: str) -> str:
        return f"{self.backend.workspace or self.work_dir}/{rel}"

    async def _kernel_json(self, call: str) -> Any:
        cell, expression = kernel_call(call)
        try:
            reply = await self._quiet_request(cell, {"r": expression}, self.timeout)
        except asyncio.TimeoutError as exc:
            raise ExecutionTimeout(f"the kernel did not answer within {self.timeout} s") from exc
        value = (reply.get("user_expressions") or {}).get("r") or {}
        if reply.get("status") != "ok" or value.get("status") != "ok":
            failed = reply if reply.get("status") != "ok" else value
            raise SnapshotError(
                f"the kernel could not do it: {failed.get('ename')}: {failed.get('evalue')}"
            )
        return json.loads(ast.literal_eval(str(full_value(value["data"]["text/plain"]))))

    async def _check_python(self, written: list[int], path: Path) -> None:
        running = await self._kernel_json("version()")
        if list(written[:2]) != list(running[:2]):
            raise SnapshotError(
                f"{path} was written by Python {written[0]}.{written[1]}; this kernel runs"
                f" {running[0]}.{running[1]}: pickles do not carry across versions"
            )

    @contextlib.asynccontextmanager
    async def _branching(self, what: str, *, live: bool = True) -> Any:
        """The session's lock for a fork, snapshot or restore: refused at once (not queued)
        while a block runs, and only for a back end whose kernel process can be forked;
        ``live``: the kernel must be alive (not for a restore, which replaces it)."""
        self._check_open()
        if self.backend.kind not in FORKABLE:
            raise ForkUnsupported(
                f"{what} forks the kernel process, which a {self.backend.kind} back end does"
                f" not allow; it works with {', '.join(FORKABLE)}"
            )
        if self._lock.locked():
            raise SessionBusy(
                f"a block is running in this session: {what} is refused while it runs (a"
                " half-run block is no state to branch from); call it after the block ends"
            )
        async with self._lock:
            self._check_open()
            await self._ensure_started()
            if live and self._dead is not None:
                raise KernelDied(f"the kernel died ({self._dead}); nothing to fork")
            yield

    def _forked_backend(self, *, live: bool = False) -> Any:
        backend = fork_backend(self.backend)
        if live and isinstance(backend, DockerForkedKernel):
            backend.branch()  # a fork() (not a snapshot): its own folder under /kx-branches
        return backend

    async def _forks(
        self, count: int, *, lineage: object, live: bool = False
    ) -> list[AsyncKernelExecutor]:
        children: list[AsyncKernelExecutor] = []
        try:
            for _ in range(count):
                backend = self._forked_backend(live=live)
                child = self._child(backend)
                child._lineage = lineage
                children.append(child)
                await asyncio.to_thread(copy_work_dir, self._door, child._door, owner=backend.owner)
                request = backend.prepare(work_dir=child.work_dir)
                backend.adopted(await self._fork_process(request))
        except BaseException:
            await _close_all(children)
            raise
        return children

    def _child(self, backend: KernelBackend) -> AsyncKernelExecutor:
        """A new executor like this one (same options, own work dir) for a forked kernel."""
        options = self.options
        # A sandboxed process fork's work dir was made in its sandbox; any other child's is new.
        home = backend.work_home
        child = type(self)(
            backend,
            work_dir=home,
            timeout=options.timeout,
            env=dict(options.env),
            output_limit=options.output_limit,
            cleanup_code_files=options.cleanup_code_files,
            outputs_dir=options.outputs_dir,
            refuse_dangerous=options.refuse_dangerous,
            code_extractor=self.code_extractor,
            input=self.input_callback,
            restart_on_death=self.restart_on_death,
            interrupt_grace=self.interrupt_grace,
            startup_timeout=self.startup_timeout,
        )
        child._owns_work_dir = True  # made for it (a sandboxed fork's, in the sandbox)
        return child

    async def _fork_process(self, request: dict[str, Any]) -> int:
        """Ask the running kernel (its lock held by the caller) to fork into ``request``; the
        child's pid. A kernel that cannot fork (out of memory, a process limit) raises
        ``KernelStartFailed`` saying why; the kernel itself carries on."""
        request = dict(request)
        # A Docker kernel's fork writes its own connection file in the container, just before.
        prelude = request.pop("prelude", "")
        cell, expression = fork_request(request)
        cell = prelude + cell
        try:
            reply = await self._quiet_request(cell, {"pid": expression}, self.startup_timeout)
        except asyncio.TimeoutError as exc:
            raise KernelStartFailed("the kernel did not answer the request to fork") from exc
        value = (reply.get("user_expressions") or {}).get("pid") or {}
        if reply.get("status") != "ok" or value.get("status") != "ok":
            failed = reply if reply.get("status") != "ok" else value
            why = f"{failed.get('ename')}: {failed.get('evalue')}"
            raise KernelStartFailed(f"the kernel could not fork ({why})")
        try:
            return int(value["data"]["text/plain"])
        except (KeyError, TypeError, ValueError) as exc:
            raise KernelStartFailed("the kernel did not say which process it forked") from exc

    async def _run_block(self, block: PreparedBlock, timeout: float) -> ExecutionResult:
        kernel = self.languages.get(block.language) if self._python else None
        if kernel is not None:
            return await self._run_elsewhere(block, kernel, timeout)
        self._running = self
        try:
            return await self._run_here(block, timeout)
        finally:
            self._running = None

    async def _run_elsewhere(
        self, block: PreparedBlock, kernel: str, timeout: float
    ) -> ExecutionResult:
        """A block in another language, in that language's kernel (started on first use)."""
        other = self._others.get(kernel)
        if other is None:
            made = self._other_kernel(kernel)
            if isinstance(made, ExecutionResult):
                return made.with_changes(language=block.language)
            other = self._others[kernel] = made
            other.chdir_language = block.language
            other._late_outputs = "deno" in kernel.lower()
        # Read at each block: a caller may set them after the session was made.
        other.on_output, other.input_callback = self.on_output, self.input_callback
        if not other._started:
            try:
                await other._ensure_started()
            except (KernelStartFailed, BackendUnavailable) as exc:
                self._others.pop(kernel, None)  # the next block of it tries afresh
                with contextlib.suppress(Exception):
                    await other.close()
                hint = self.backend.install_hint(kernel)
                return _cannot_start(block, kernel, str(exc), hint)
        self._running = other
        try:
            return await other._run_here(block, timeout)
        finally:
            self._running = None

    def _other_kernel(self, kernel: str) -> _LanguageKernel | ExecutionResult:
        backend = self.backend.other_kernel(kernel)
        if backend is None:  # supported_languages said so already; a subclass may differ
            why = f"the {self.backend.kind} back end runs only Python kernels"
            return error_result(
                f"unsupported language: {why}",
                language="",
                ename="UnsupportedLanguage",
                not_run=True,
            )
        return _LanguageKernel(
            backend,
            work_dir=self.work_dir,
            timeout=self.options.timeout,
            env=self.options.env,
            output_limit=self.options.output_limit,
            outputs_dir=self.options.outputs_dir,
            restart_on_death=self.restart_on_death,
            interrupt_grace=self.interrupt_grace,
            startup_timeout=self.startup_timeout,
        )

    async def _run_here(self, block: PreparedBlock, timeout: float) -> ExecutionResult:
        if self._dead is not None:
            raise KernelDied(f"the kernel died ({self._dead}); call restart() to get a new one")
        gone = await self._gone_while_idle()
        if gone is not None:
            return await self._died(_not_run(block, ""), gone, idle=True)
        try:
            await self._ensure_workspace()
        except RequestAborted:
            return _not_run(block, _ABORTED)  # the kernel refused to go back to its work dir
        code = self._code_for(block)
        self._sent_at = time.time()  # wall clock, as the engine records a container's end
        collector, run = await self._send(block, code, timeout)
        if _aborted(run):
            # ipykernel answers "aborted" without running anything, for a while after a request
            # that failed with stop_on_error (not ours: kernelexec never asks for it; another
            # client's, or an older kernel): sending again is safe, once.
            await asyncio.sleep(_ABORT_RETRY_PAUSE)
            collector, run = await self._send(block, code, timeout)
        result = (
            _not_run(block, _ABORTED)
            if _aborted(run)
            else await self._conclude(block, collector, run, timeout)
        )
        if self.checkpoint == "block" and result.ok and not result.kernel_died:
            await self._take_checkpoint(block)
        self._idle_since = asyncio.get_running_loop().time()
        return result

    async def _send(
        self, block: PreparedBlock, code: str, timeout: float
    ) -> tuple[OutputCollector, _Run]:
        collector = OutputCollector(
            work_dir=self.work_dir,
            cell=block.index,
            limit=self.options.output_limit,
            spill_path=self._internal_path("output", f"block-{block.index}.txt"),
            on_output=self._emit,
            outputs_dir=self.options.outputs_dir,
            door=self._door,
        )
        block_run = _BlockRun(self, code, collector, timeout)
        try:
            return collector, await block_run.wait()
        except asyncio.CancelledError:
            # The caller gave up on the block (``asyncio.wait_for``, a cancelled task): it must
            # not run on in the kernel, where the next block would queue behind it and be
            # charged its time. It is stopped as a timeout stops it; the kernel's state is kept.
            with contextlib.suppress(Exception):
                await asyncio.shield(block_run.abandon())
            raise

    async def _gone_while_idle(self) -> str | None:
        """Why the kernel is gone before a block is sent (None: it is not known to be). Back
        ends with a cheap check make it before every block; the rest are asked over the
        network only after the kernel sat idle a while (between an agent's turns)."""
        idle = asyncio.get_running_loop().time() - self._idle_since
        if not await self.backend.seems_gone() and idle < _IDLE_CHECK:
            return None
        if await self.backend.is_alive():
            return None
        return self.backend.death_reason() or "it exited"

    # -- helpers ------------------------------------------------------------------------------
    async def _setup(self) -> None:
        if self._python and not self._setup_at_start:
            await self._run_quietly(_setup_cell(self._setup_code))

    async def _run_quietly(self, code: str) -> None:
        """Run kernelexec's own code (not recorded in history, no outputs)."""
        try:
            reply = await self._quiet_request(code, None, self.startup_timeout)
        except asyncio.TimeoutError as exc:
            raise KernelStartFailed("the kernel did not run its set-up code") from exc
        if reply.get("status") != "ok":
            detail = f"{reply.get('ename')}: {reply.get('evalue')}"
            raise KernelStartFailed(f"the kernel's set-up code failed ({detail})")

    async def _quiet_request(
        self, code: str, expressions: dict[str, str] | None, timeout: float
    ) -> dict[str, Any]:
        """The reply to kernelexec's own silent request. A kernel in its abort window answers
        ``aborted`` to it as to a block, having run nothing: sent again once, as a block is;
        refused twice, ``RequestAborted`` (an "aborted" reply read as a failure said "the
        set-up code failed" or "no answer")."""
        client = self.backend.client
        for attempt in range(2):
            if attempt:
                await asyncio.sleep(_ABORT_RETRY_PAUSE)
            msg_id = client.execute(
                code,
                silent=True,
                store_history=False,
                user_expressions=expressions or {},
                stop_on_error=False,
            )
            reply = await asyncio.wait_for(_reply_for(self.backend, msg_id), timeout)
            if reply.get("status") != "aborted":
                return reply
        raise RequestAborted(f"kernelexec's own request was not run: {_ABORTED}; try again later")

    def _file_store(self) -> FileStore:
        if self.backend.shares_work_dir:
            return super()._file_store()
        return KernelFiles(self._evaluate, self.backend.workspace or str(self.work_dir))

    async def _evaluate(self, code: str, expression: str) -> str:
        """Run ``code`` silently, then return ``expression``'s text/plain (kernelexec's own)."""
        try:
            reply = await self._quiet_request(code, {"r": expression}, self.timeout)
        except asyncio.TimeoutError as exc:
            raise ExecutionTimeout(f"the kernel did not answer within {self.timeout} s") from exc
        value = (reply.get("user_expressions") or {}).get("r") or {}
        if reply.get("status") != "ok" or value.get("status") != "ok":
            detail = value.get("evalue") or reply.get("evalue") or "no answer"
            raise KernelExecError(f"the kernel could not carry out a file operation: {detail}")
        return str(full_value(value["data"]["text/plain"]))  # a long reply is decoded whole

    async def _ensure_workspace(self) -> None:
        """A block may have deleted the work dir: recreate it and put the kernel back in it."""
        if self.work_dir.is_dir():
            return
        make_work_dir(self.work_dir)
        where = self.backend.workspace or str(self.work_dir)
        await self._run_quietly(f"import os as _kx_os; _kx_os.chdir({where!r}); del _kx_os")

    def _code_for(self, block: PreparedBlock) -> str:
        if block.target is not None:
            self._save_code(block.target, block.code)
        if block.language == "shell" and not block.code.strip():
            return ""  # nothing to run; %%bash refuses an empty cell body
        if block.language == "shell":
            # IPython's bash cell magic: streams output, runs in the kernel's cwd and env, and
            # fails the cell on a non-zero exit status.
            return "%%bash\n" + block.code
        return block.code

    async def _conclude(
        self, block: PreparedBlock, collector: OutputCollector, run: _Run, timeout: float
    ) -> ExecutionResult:
        # %%bash reports a failed script as a CalledProcessError with IPython's own frames;
        # the exit status is all that matters.
        shell_failed = (
            collector.pop_error("CalledProcessError") if block.language == "shell" else None
        )
        if run.ending in (_Ending.TIMED_OUT, _Ending.STUCK):
            interrupted = collector.pop_error("KeyboardInterrupt") or shell_failed
            result = _base_result(block, collector.finish(), run)
            if run.ending is _Ending.STUCK:
                await self._replace_kernel()
            return _timed_out(result, interrupted, timeout, run.ending is _Ending.STUCK)
        result = _base_result(block, collector.finish(), run)
        if run.ending is _Ending.DIED:
            reason = self.backend.death_reason() or "it exited"
            if await self.backend.died_before(self._sent_at):
                return await self._died(_not_run(block, ""), reason, idle=True)
            return await self._died(result, reason)
        if _asked_exit(run.reply):
            return await self._exited(result)
        return result if shell_failed is None else _shell_failed(result, shell_failed)

    async def _replace_kernel(self) -> None:
        origin, self._origin = self._origin, None
        if origin is not None:  # restored in a sandbox: its first kernel restarts (a new one)
            current, self.backend = self.backend, origin
            await current.shutdown()
        if self.backend.holds_forks:
            await self._release_snapshots()  # they live in the sandbox the restart ends
        await self.backend.restart(timeout=self.startup_timeout)
        self._dead = None
        await self._setup()
        self._idle_since = asyncio.get_running_loop().time()

    async def _died(
        self, result: ExecutionResult, reason: str, *, idle: bool = False
    ) -> ExecutionResult:
        if idle:
            note = (
                f"Not run: the kernel had died while idle, before this block was sent ({reason});"
                " nothing of the block ran."
            )
        else:
            note = f"The kernel died while running this block ({reason})."
        recovered = await self._recover()
        if recovered is not None:
            note += (
                f" The session continues from the {recovered}: only this block's effects were lost."
            )
            error = ErrorInfo(ename="KernelDied", evalue=note)
            return result.with_changes(
                exit_code=EXIT_ERROR,
                output=_append(result.output, note),
                error=error,
                outputs=[*result.outputs, _error_output(error)],
                kernel_died=True,
                state_lost=False,
                recovered_from=recovered,
            )
        if self.restart_on_death:
            await self._replace_kernel()
            note += " It was restarted: all variables and imports were lost."
        else:
            self._dead = reason
            note += " It was not restarted (restart_on_death=False)."
        error = ErrorInfo(ename="KernelDied", evalue=note)
        return result.with_changes(
            exit_code=EXIT_ERROR,
            output=_append(result.output, note),
            error=error,
            outputs=[*result.outputs, _error_output(error)],
            kernel_died=True,
            state_lost=self.restart_on_death,
        )

    async def _recover(self) -> str | None:
        """With a checkpoint: the kernel replaced by a fork of it; its label, or None."""
        snapshot = self._checkpoint
        if snapshot is None or snapshot.released:
            return None
        try:
            await self._restore_live(snapshot)
        except Exception as exc:
            _log.warning("the checkpoint could not be restored: %s", exc)
            return None
        return snapshot.label

    async def _exited(self, result: ExecutionResult) -> ExecutionResult:
        """``exit()`` / ``quit()``: the kernel would stop right after; replace it now."""
        note = "The block called exit(); the kernel stopped."
        if self.restart_on_death:
            await self._replace_kernel()
            note += " A new kernel was started: all variables and imports were lost."
        else:
            self._dead = "exit() was called"
        return result.with_changes(output=_append(result.output, note), state_lost=True)


class _ForkSource:
    """The durable snapshot forks are loaded from: a private temp folder, a one-off key, and
    the task writing it on the session's loop (``saving``)."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="kernelexec-fork-")
        self.path = Path(self._dir) / "session.kx"
        self.key = os.urandom(32)
        self.saving: asyncio.Future[Any] | None = None
        self._loop = asyncio.get_running_loop()

    async def taken(self) -> None:
        """Wait for the snapshot, from any loop (a sync fork runs on a loop of its own); its
        error (``SessionBusy``, ``SnapshotError``) is the fork's."""
        if self.saving is None:
            return
        if self._loop is asyncio.get_running_loop():
            await asyncio.shield(self.saving)
            return
        future = asyncio.run_coroutine_threadsafe(_shielded(self.saving), self._loop)
        await asyncio.wrap_future(future)

    async def drop(self) -> None:
        """Remove it, once no task writes it (one still writing is let finish: cut short, it
        would leave the session's kernel with a request half answered)."""
        saving, self.saving = self.saving, None
        if saving is not None:
            with contextlib.suppress(BaseException):
                await saving
        shutil.rmtree(self._dir, ignore_errors=True)

    def close(self) -> None:
        """``drop()`` from any thread, once the forks are loaded (or have failed)."""
        if self.saving is not None and not self.saving.done() and not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.drop(), self._loop)
            return
        shutil.rmtree(self._dir, ignore_errors=True)


async def _shielded(future: asyncio.Future[Any]) -> Any:
    return await asyncio.shield(future)


def _drop_fork_sources(children: list[AsyncKernelExecutor]) -> None:
    for child in children:
        source, child._fork_source = child._fork_source, None
        if source is not None:
            source.close()


def _unpack(
    verified: Verified, door: Door, folder: str, owner: tuple[int, int] | None = None
) -> None:
    """The snapshot's work dir files in place of the work dir's, its pickles in ``folder``;
    ``owner``: (uid, gid) the work dir's files and folders are given to, through the door."""
    empty_work_dir(door)
    for info in verified.archive.infolist():
        name = info.filename
        if name.startswith("work/") and not info.is_dir():
            target = name[len("work/") :]
        elif name.startswith("ns/"):
            target = f"{folder}/{name[len('ns/') :]}"
        else:
            continue
        with verified.archive.open(info) as src, door.replacing(target) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if owner is not None and name.startswith("work/"):
            parts = target.split("/")
            for depth in range(1, len(parts) + 1):  # its folders too (made by the door)
                door.chown("/".join(parts[:depth]), *owner)


def _pid_of(executor: AsyncKernelExecutor) -> int | None:
    pid: int | None = getattr(executor.backend, "pid", None)
    return pid


async def _pause(executor: AsyncKernelExecutor, *, paused: bool) -> None:
    """Stop (or continue) a live snapshot's kernel: by its host pid, or by its back end (a
    fork in a Docker container, signalled in there)."""
    own = getattr(executor.backend, "pause", None)
    if own is not None:
        await own(paused=paused)
    else:
        pause(_pid_of(executor), paused=paused)


def _dies_with_kernel(backend: KernelBackend) -> bool:
    """Whether what holds the kernel's forks (a sandbox) ends when the kernel dies: a Docker
    kernel's container does not, once the kernel retires (``DockerKernel.retire``)."""
    return backend.holds_forks and not backend.retires


async def _close_all(executors: list[AsyncKernelExecutor]) -> None:
    for executor in executors:
        with contextlib.suppress(Exception):
            await executor.close()


class _BlockRun:
    """Sends one execute request and follows it until it is over, however it ends."""

    def __init__(
        self, executor: AsyncKernelExecutor, code: str, collector: OutputCollector, timeout: float
    ) -> None:
        self._ex = executor
        self._backend = executor.backend
        self._client = executor.backend.client
        self._code = code
        self._collector = collector
        self._timeout = timeout
        self._msg_id = ""

    async def wait(self) -> _Run:
        allow_stdin = self._ex.input_callback is not None
        # stop_on_error=False: after a block that fails, ipykernel would otherwise abort (not
        # run, "aborted" reply) every request arriving within its abort window; a kernel of
        # the image's ipykernel (6.17) did so to the block sent next, under load.
        self._msg_id = self._client.execute(
            self._code, allow_stdin=allow_stdin, stop_on_error=False
        )
        reply = asyncio.ensure_future(_reply_for(self._backend, self._msg_id))
        # IRkernel asks for input even when told not to, and would wait for it for good:
        # another language's kernel is always answered (with no callback, an empty line).
        serve = allow_stdin or not self._ex._python
        stdin = asyncio.ensure_future(self._serve_stdin()) if serve else None
        try:
            ending = await self._pump(reply)
            if ending is _Ending.DIED or ending is _Ending.STUCK:
                return _Run(ending, None)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(reply), _REPLY_GRACE)
            if not reply.done():
                return _Run(ending, None)
            self._show_pages(reply.result())
            return _Run(ending, reply.result())
        finally:
            for task in (reply, stdin):
                if task is not None:
                    await _settle(task)

    def _show_pages(self, reply: Mapping[str, Any]) -> None:
        """What IPython sends to a pager (``obj?``, ``obj??``, ``%pinfo``, ``%magic?``) rides
        on the reply, not on IOPub: it becomes a display output of the block, as a notebook
        shows it, so ``result.output`` holds the help text."""
        for payload in reply.get("payload") or []:
            if payload.get("source") == "page" and isinstance(payload.get("data"), dict):
                content = {"data": payload["data"], "metadata": {}}
                self._collector.feed({"msg_type": "display_data", "content": content})

    async def abandon(self) -> None:
        """After the caller cancelled ``wait``: interrupt the block at once and follow it to its
        end, so the next block does not queue behind it and get charged its time; a block
        that ignores the interrupt gets the kernel replaced, as at a timeout."""
        if not self._msg_id:
            return
        self._timeout = 0.0
        reply = asyncio.ensure_future(_reply_for(self._backend, self._msg_id))
        try:
            ending = await self._pump(reply)
        finally:
            await _settle(reply)
        if ending is _Ending.STUCK:
            _log.warning(
                "a cancelled block did not stop when interrupted: the kernel was restarted, and "
                "its variables and imports were lost"
            )
            self._ex._state_lost_by_cancel = True  # a job's cancelled result says so
            await self._ex._replace_kernel()

    async def _pump(self, reply: asyncio.Future[dict[str, Any]]) -> _Ending:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        grace_end: float | None = None  # set once the block was interrupted
        last_seen = last_check = loop.time()
        marker: str | None = None
        idle_trusted = not self._ex._late_outputs
        while True:
            now = loop.time()
            if grace_end is None and now >= deadline:
                await self._backend.interrupt()
                grace_end = now + self._ex.interrupt_grace
            if grace_end is not None and now >= grace_end:
                return _Ending.STUCK
            if now - last_check >= _POLL:
                last_check = now
                if not await self._backend.is_alive():
                    return _Ending.DIED
            limit = grace_end if grace_end is not None else deadline
            wait = max(0.01, min(_POLL, limit - now))
            try:
                msgs = await iopub_batch(self._client, wait)
            except queue.Empty:
                # The reply is in and iopub is quiet: its messages may lag the reply (a loaded
                # machine), or the idle was lost. Waiting a fixed while cut off lagging output
                # (seen: "yes" lost, exit 0). Instead send an empty request: iopub is one
                # ordered stream, so once its messages arrive, all of this block's have.
                quiet = _IOPUB_GRACE if idle_trusted else _LATE_GRACE
                if marker is None and reply.done() and loop.time() - last_seen >= quiet:
                    marker = self._client.execute(
                        "", silent=True, store_history=False, stop_on_error=False
                    )
                continue
            feed, msg_id = self._collector.feed, self._msg_id
            for msg in msgs:
                parent = _parent_id(msg)
                if marker is not None and parent == marker:
                    return _Ending.TIMED_OUT if grace_end is not None else _Ending.DONE
                if parent != msg_id:
                    continue  # another request's message (a set-up run, an earlier block)
                if _is_idle(msg) and idle_trusted:  # the batch ends there: nothing after it
                    return _Ending.TIMED_OUT if grace_end is not None else _Ending.DONE
                feed(msg)
            last_seen = loop.time()  # after feeding: a slow feed is not silence

    async def _serve_stdin(self) -> None:
        callback = self._ex.input_callback
        while True:
            msg = await self._client.get_stdin_msg(timeout=None)
            if _parent_id(msg) != self._msg_id or msg.get("msg_type") != "input_request":
                continue
            prompt = str(msg.get("content", {}).get("prompt", ""))
            if callback is None:
                text = (
                    f"kernelexec: the block asked for input ({prompt!r}) and no input callback"
                    " is set (input=...); it got an empty line\n"
                )
                self._collector.feed(
                    {"msg_type": "stream", "content": {"name": "stderr", "text": text}}
                )
                self._client.input("")
                continue
            try:
                answer = await asyncio.to_thread(callback, prompt)
                if inspect.isawaitable(answer):
                    answer = await answer
            except Exception as exc:  # the caller's callback failed: say so, unblock the kernel
                text = f"kernelexec: the input callback failed: {type(exc).__name__}: {exc}\n"
                self._collector.feed(
                    {"msg_type": "stream", "content": {"name": "stderr", "text": text}}
                )
                answer = ""
            self._client.input(str(answer))


async def _settle(task: asyncio.Future[Any]) -> None:
    """A helper task of a block, ended: cancelled if still running, its failure marked seen."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    elif not task.cancelled():
        # A failed channel (e.g. a gateway socket that could not come back) also reaches the
        # iopub pump, which reports it; mark this copy as seen.
        task.exception()


async def _reply_for(backend: KernelBackend, msg_id: str) -> dict[str, Any]:
    """The shell reply to ``msg_id`` (replies to other requests are skipped)."""
    while True:
        msg = await backend.client.get_shell_msg(timeout=None)
        if _parent_id(msg) == msg_id:
            content: dict[str, Any] = msg.get("content", {})
            return content


def _parent_id(msg: Mapping[str, Any]) -> str | None:
    parent = msg.get("parent_header") or {}
    value = parent.get("msg_id")
    return value if isinstance(value, str) else None


def _is_idle(msg: Mapping[str, Any]) -> bool:
    return bool(
        msg.get("msg_type") == "status" and msg.get("content", {}).get("execution_state") == "idle"
    )


def _asked_exit(reply: Mapping[str, Any] | None) -> bool:
    payloads = (reply or {}).get("payload") or []
    return any(p.get("source") == "ask_exit" and not p.get("keepkernel") for p in payloads)


def _base_result(block: PreparedBlock, collected: Collected, run: _Run) -> ExecutionResult:
    reply = run.reply or {}
    failed = reply.get("status") not in (None, "ok") or (
        reply.get("status") is None and collected.error is not None
    )
    error = collected.error
    if failed and error is None:
        error = ErrorInfo(
            ename=str(reply.get("ename", "Error")), evalue=str(reply.get("evalue", ""))
        )
    count = reply.get("execution_count")
    return ExecutionResult(
        exit_code=EXIT_ERROR if failed else EXIT_OK,
        output=collected.output,
        stdout=collected.stdout,
        stderr=collected.stderr,
        error=error if failed else None,
        outputs=collected.outputs,
        files=collected.files,
        code_file=None if block.target is None else str(block.target),
        truncated=collected.truncated,
        language=block.language,
        full_output_file=collected.full_output_file,
        execution_count=count if isinstance(count, int) else collected.execution_count,
    )


def _aborted(run: _Run) -> bool:
    return run.ending is _Ending.DONE and (run.reply or {}).get("status") == "aborted"


def _not_run(block: PreparedBlock, why: str) -> ExecutionResult:
    """The result of a block of which nothing ran; ``why`` in words (empty: said later)."""
    note = f"Not run: {why}; nothing of the block ran, sending it again is safe." if why else ""
    error = ErrorInfo(ename="NotRun", evalue=note)
    return ExecutionResult(
        exit_code=EXIT_ERROR,
        output=note,
        error=error,
        outputs=[_error_output(error)] if note else [],
        code_file=None if block.target is None else str(block.target),
        language=block.language,
        not_run=True,
    )


def _timed_out(
    result: ExecutionResult, interrupted: ErrorInfo | None, timeout: float, state_lost: bool
) -> ExecutionResult:
    """The result of a block stopped for its timeout; the interrupt's traceback says where."""
    if state_lost:
        what = (
            f"the block ran longer than {timeout:g} s and did not stop when interrupted; "
            "the kernel was restarted and all state was lost."
        )
    else:
        what = (
            f"the block ran longer than {timeout:g} s and was interrupted; "
            "the kernel and its state were kept."
        )
    trace = interrupted.traceback if interrupted is not None else []
    # The ename says "Timeout"; the value does not repeat it ("Timeout: Timeout: ...").
    error = ErrorInfo(ename="Timeout", evalue=what, traceback=trace)
    return result.with_changes(
        exit_code=EXIT_TIMEOUT,
        timed_out=True,
        state_lost=state_lost,
        error=error,
        outputs=[*result.outputs, _error_output(error)],
        output=_append(result.output, str(error)),
    )


def _shell_failed(result: ExecutionResult, failure: ErrorInfo) -> ExecutionResult:
    match = re.search(r"exit status (-?\d+)", failure.evalue)
    status = match[1] if match else "unknown"
    error = ErrorInfo(ename="NonZeroExit", evalue=f"exit status {status}")
    return result.with_changes(
        exit_code=EXIT_ERROR,
        error=error,
        outputs=[*result.outputs, _error_output(error)],
        output=_append(result.output, f"The shell block failed with exit status {status}."),
    )


def _error_output(error: ErrorInfo) -> NbOutput:
    return {
        "output_type": "error",
        "ename": error.ename,
        "evalue": error.evalue,
        "traceback": list(error.traceback),
    }


def _append(text: str, note: str) -> str:
    return f"{text.rstrip()}\n{note}" if text.strip() else note


class KernelExecutor(SyncExecutor[AsyncKernelExecutor], core=AsyncKernelExecutor):
    """Synchronous stateful executor: blocks share one IPython kernel.

    >>> with KernelExecutor(timeout=30) as ex:
    ...     _ = ex.execute("x = 20 + 1")
    ...     ex.execute("x * 2").output
    '42'
    """

    #: a resumed executor: the durable snapshot's manifest (what came back, name by name)
    restored: SnapshotManifest | None = None
    #: a fork: ``"process"`` or ``"snapshot"`` (see ``AsyncKernelExecutor.forked_via``)
    forked_via: str | None = None

    @property
    def backend(self) -> KernelBackend:
        return self.aio.backend

    def interrupt(self) -> None:
        """Interrupt the block running (from another thread); the kernel keeps its state."""
        self._call(self._core.interrupt)

    def fork(self, n: int | None = None, *, via: str | None = None) -> Any:
        """A new ``KernelExecutor`` with this one's state and a copy of its work dir (``n``: a
        list of that many); see ``AsyncKernelExecutor.fork``. Each fork is closed on its own."""
        # Each fork gets an event-loop thread of its own (its kernel client is made there):
        # it outlives this executor.
        cores = self._call(self._core._forked, 1 if n is None else n, via)
        fronts = [SyncExecutor.wrap(core) for core in cores]
        try:
            for front in fronts:
                front._call(front._core._begin_fork)
                # the sync twin's own copies, as ``resume`` keeps ``restored``
                vars(front).update(restored=front.aio.restored, forked_via=front.aio.forked_via)
        except BaseException:
            for front in fronts:
                front.close()
            raise
        finally:
            _drop_fork_sources(cores)
        return fronts[0] if n is None else fronts

    def snapshot(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        key: bytes | str | os.PathLike[str] | None = None,
    ) -> Any:
        """A live snapshot (a paused forked copy), or with ``path`` a durable one (a signed
        file; its manifest is returned); see ``AsyncKernelExecutor.snapshot``."""
        if path is not None:
            return self._call(self._core.snapshot, path, key=key)
        return LiveSnapshot(self._call(self._core.snapshot), self._call)

    def submit(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
        on_fork: bool = False,
        keep_fork: bool = False,
    ) -> Job:
        """Start a block in the background and return its job at once; ``on_fork=True``: on a
        fork of this session, taken now (see ``AsyncKernelExecutor.submit``). The fork runs on
        this executor's event loop: ``job.fork`` is its ``KernelExecutor`` there."""
        aio = self._call(
            self._core.submit,
            code,
            language,
            timeout=timeout,
            on_fork=on_fork,
            keep_fork=keep_fork,
        )
        fork = None
        if aio.fork is not None:  # a twin on this executor's loop, which drives the fork
            fork = SyncExecutor.wrap(cast(AsyncExecutor, aio.fork), portal=self._portal)
        return Job(aio, self._portal, fork=fork)

    def restore(
        self,
        snapshot: LiveSnapshot | AsyncLiveSnapshot | str | os.PathLike[str],
        *,
        key: bytes | str | os.PathLike[str] | None = None,
    ) -> Any:
        """Make a live snapshot current again, or load a durable one (a path) into a fresh
        kernel, returning its manifest; see ``AsyncKernelExecutor.restore``."""
        return self._call(self._core.restore, snapshot, key=key)

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike[str],
        *,
        key: bytes | str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> KernelExecutor:
        """A new executor (built with ``options``) holding a durable snapshot's state; its
        ``restored`` attribute is the snapshot's manifest, name by name."""
        executor = cls(**options)
        try:
            executor.restored = executor.restore(path, key=key)
        except BaseException:
            executor.close()
            raise
        return executor

    def complete(self, code: str, cursor_pos: int | None = None) -> list[str]:
        """What the kernel would complete at ``cursor_pos`` (default: the end of ``code``)."""
        return self._call(self._core.complete, code, cursor_pos)

    def completion_start(self, code: str, cursor_pos: int | None = None) -> int:
        """Where the text the completions replace begins."""
        return self._call(self._core.completion_start, code, cursor_pos)

    def inspect(self, code: str, cursor_pos: int | None = None, detail_level: int = 0) -> str:
        """The kernel's help for the name at ``cursor_pos`` (``obj?``; 1: ``obj??``)."""
        return self._call(self._core.inspect, code, cursor_pos, detail_level)


class _LanguageKernel(AsyncKernelExecutor):
    """Another language's kernel in a session: blocks are sent as written (no IPython set-up
    code, no ``%%bash`` cell), in the session's work dir. The session holds its lock, numbers its
    blocks and records them; this runs them (``_run_here``) with everything a Python block gets:
    outputs saved, the output budget, timeouts that interrupt, death noticed."""

    _python = False
    #: the language whose code puts the kernel back in a recreated work dir
    chdir_language = ""

    async def _setup(self) -> None:
        code = setup_code(self.chdir_language)
        if code is not None:
            await self._run_quietly(code)
        # A kernel a gateway started works where the gateway runs it: into the session's folder
        await self._chdir()

    async def _ensure_workspace(self) -> None:
        if self.work_dir.is_dir():
            return
        make_work_dir(self.work_dir)
        await self._chdir()

    async def _chdir(self) -> None:
        code = chdir_code(self.chdir_language, self.backend.workspace or str(self.work_dir))
        if code is not None:
            await self._run_quietly(code)

    def _code_for(self, block: PreparedBlock) -> str:
        if block.target is not None:
            self._save_code(block.target, block.code)
        return block.code


def _cannot_start(
    block: PreparedBlock, kernel: str, why: str, hint: str | None = None
) -> ExecutionResult:
    """A block whose language's kernel did not start: not run, saying what to install (``hint``:
    the back end's own word, e.g. an image to build)."""
    missing = f"no kernelspec named {kernel!r}" in why
    what = f"Not run: the {block.language} kernel ({kernel!r}) "
    if missing:
        where = "" if why == f"no kernelspec named {kernel!r}" else f" ({why})"  # a gateway's
        what += f"is not installed{where}; install {hint or install_hint(kernel)}."
    else:
        what += f"did not start: {why}."
    return error_result(
        what + " Nothing of the block ran.",
        language=block.language,
        ename="KernelNotInstalled" if missing else "KernelStartFailed",
        not_run=True,
    )
