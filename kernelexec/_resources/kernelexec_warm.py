"""The warm spawner: imports a warm-up list once, then forks a fresh process per Python block.

Run as a script by the block's interpreter (``python -u kernelexec_warm.py FD [module ...]``); it
imports nothing of kernelexec, which that interpreter may not have. It must stay free of threads
it started itself so a fork is safe.

Protocol. Requests arrive on the Unix socket ``FD``: one JSON document per message
(``{"code", "cwd", "env"}``) carrying the block's stdout and stderr pipes as
``SCM_RIGHTS``. Answers leave on stdout, one JSON line each: ``{"ready": pid}`` once warm,
``{"pid": n}`` per request (or ``{"error": text}``), and ``{"exit": n, "code": c}`` when a block's
process ends (``c`` as ``subprocess`` gives it: negative for a signal; with ``"early": true`` when
the block said its status itself as it ended: the spawner, its parent, has sent it SIGKILL, and
the kernel is still freeing its memory, which for a fork of a large interpreter takes
milliseconds no block need wait for). A request without pipes,
``{"signal": n, "number": s}``, signals block ``n``'s process group (no answer). End of the socket
ends the spawner; the blocks' processes are in the spawner's cgroup or their own session, which
the host empties after each block.

In a sandbox (``KX_WARM_SANDBOX=1``: the spawner is bubblewrap's, in a pid namespace of its own)
the host cannot see the blocks' pids: the spawner empties the sandbox itself when a block ends,
before it says so (every process but its own ancestors, itself and the spare; the private
``/tmp`` and ``/dev/shm``; System V IPC objects), and signals a block when the host asks.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import sys
import traceback
import types
from typing import Any


def _warm_up(modules: list[str]) -> list[str]:
    """Import each module that is installed; return the names that failed (told to the host)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # an optional module that is broken is as good as absent
            failed.append(name)
    return failed


def _answer(out: int, **document: Any) -> None:
    data = (json.dumps(document) + "\n").encode()
    while data:
        data = data[os.write(out, data) :]


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One request: a 4-byte length carrying the pipes, then the JSON document."""
    head, fds, _flags, _addr = socket.recv_fds(sock, 4, 4)
    if len(head) < 4:
        for fd in fds:
            os.close(fd)
        return None
    size = struct.unpack("!I", head)[0]
    data = b""
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            break
        data += chunk
    return json.loads(data), fds


def _own_streams(stdout: int, stderr: int) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for fd in {null, stdout, stderr} - {0, 1, 2}:
        os.close(fd)


def _own_environment(request: dict[str, Any]) -> None:
    """The block's folder, environment, argv and path, as ``python FILE`` would set them.

    Variables the interpreter reads only while it starts (``PYTHONHASHSEED``, ``PYTHONPATH``'s
    effect on ``sys.path``) were read by the spawner: ``PYTHONPATH``'s folders are added here;
    the hash seed stays the spawner's."""
    os.chdir(request["cwd"])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    code = request["code"]
    sys.argv = [code]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = [os.path.dirname(os.path.abspath(code)), *extra]


def _reseed() -> None:
    """numpy's legacy global generator was seeded once, when the spawner imported it: every
    block would draw the same numbers. (``random`` reseeds itself in a forked child.)"""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        with contextlib.suppress(Exception):
            numpy_random.seed()


def _figure_backend() -> None:
    """Ready kernelexec's figure backend (``plt.show()`` saves), the one blocks name unless
    rich outputs are off: a block that had to switch to it would pay milliseconds each time."""
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is None:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        matplotlib.use(_FIGURES, force=True)
        sys.modules["kernelexec_show"].preload()  # the chart extractor, for the blocks to fork
    except Exception:  # an old or broken matplotlib: each block switches as it needs
        pass
    finally:
        sys.path.remove(here)


_FIGURES = "module://kernelexec_show"


def _own_figures(env: dict[str, str]) -> None:
    """The matplotlib backend the block's environment names, if not the one already set."""
    backend = env.get("MPLBACKEND")
    matplotlib = sys.modules.get("matplotlib")
    if backend and matplotlib is not None:
        with contextlib.suppress(Exception):
            if matplotlib.get_backend().lower() != backend.lower():
                matplotlib.use(backend, force=True)
    show = sys.modules.get("kernelexec_show")  # imported by the spawner: charts per block
    if show is not None:
        with contextlib.suppress(Exception):
            show.ready()


def _run_main(path: str) -> int:
    """Run the file as ``__main__``; the exit status ``python FILE`` would give."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=__builtins__, __cached__=None)
    sys.modules["__main__"] = main
    try:
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as exc:
        return _system_exit(exc)
    except BaseException as exc:
        # from the block's first frame on, as the interpreter prints it (not this function's)
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def _system_exit(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _become_block(keep: tuple[int, ...]) -> None:
    """In a freshly forked child: drop the spawner's signals and descriptors."""
    os.setsid()
    signal.set_wakeup_fd(-1)  # before its pipe is closed: its number may be reused
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for fd in keep:
        os.close(fd)


def _block(request: dict[str, Any], fds: list[int], status: int) -> None:
    """In the child: run the block, say its exit status on ``status``, and never return."""
    code = 1
    try:
        _traceable(True)  # its own code may debug itself and its children, as ``python`` may
        _own_streams(*fds)
        _own_environment(request)
        _reseed()
        _own_figures(request["env"])
        code = _run_main(request["code"])
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        with contextlib.suppress(BaseException):
            for fd in (0, 1, 2):  # the host's pipes end here, not once the memory is freed
                os.close(fd)
            os.write(status, bytes([code & 0xFF]))
        os._exit(code)


_PR_SET_DUMPABLE = 4


def _traceable(yes: bool) -> None:
    """Whether processes of the same user may trace this one (or read its memory). The spawner
    and the spare are not: a block (same user) could otherwise write into them, and so into
    every later block."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, int(yes), 0, 0, 0)


def _ancestors() -> set[int]:
    """This process and those above it, as far as this pid namespace shows them."""
    found, pid = set(), os.getpid()
    while pid > 0 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def _live_pids() -> list[int]:
    """The processes of this pid namespace that are not zombies (those are being reaped)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in "ZX":
                found.append(int(name))
    return found


def _kill_all_but(keep: set[int]) -> None:
    """Kill every other process of the sandbox; again while one forked before it died."""
    for _ in range(1000):
        others = [pid for pid in _live_pids() if pid not in keep]
        if not others:
            return
        for pid in others:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _mount_points() -> set[str]:
    """Where something is mounted in the sandbox (the work dir, an interpreter under /tmp)."""
    found = set()
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            # the kernel writes a space, tab, newline or backslash as an octal escape
            found.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]))
    return found


def _empty(folder: str, mounts: set[str]) -> None:
    """What the blocks left in one of the sandbox's private folders goes; what is bound into
    it (the work dir under /tmp, say) is not theirs to lose, nor the folders above it."""
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.path in mounts:
                continue
            with contextlib.suppress(OSError):
                if any(m.startswith(entry.path + "/") for m in mounts):
                    _empty(entry.path, mounts)  # a folder bubblewrap made above a bound one
                elif entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)


_IPC_RMID = 0


def _drop_ipc() -> None:
    """System V shared memory, semaphores and queues live as long as the IPC namespace (the
    sandbox's): a block could leave data for the next."""
    libc = ctypes.CDLL(None)
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            ident = int(row.split()[1])
            if kind == "sem":
                libc.semctl(ident, 0, _IPC_RMID)
            else:
                getattr(libc, f"{kind}ctl")(ident, _IPC_RMID, None)


class _Spawner:
    """Forks the next block's process ahead of time (a spare waiting for its request), so a
    block does not wait for the fork of a large warm process (page tables: milliseconds)."""

    def __init__(
        self, sock: socket.socket, out: int, wake: tuple[int, int], sandboxed: bool
    ) -> None:
        self.sock = sock
        self.out = out
        self.wake = wake
        self.spare: tuple[int, socket.socket] | None = None
        self.blocks: set[int] = set()
        # each running block's end of its request channel (it says its status on it)
        self.channels: dict[int, tuple[int, socket.socket]] = {}
        self.said: set[int] = set()  # blocks whose end was told early, not reaped yet
        self.sandboxed = sandboxed
        self.keep = _ancestors()  # bubblewrap's processes above the spawner, and itself

    def refill(self) -> None:
        if self.spare is not None:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # not traceable (the spawner is not) until it runs a block
            ours.close()
            _become_block((self.sock.fileno(), self.out, *self.wake))
            with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
                comm.write("kx-warm-spare")  # what it is, while it waits
            received = _receive(theirs)  # the spawner's end closed: nothing to run
            if received is None:
                os._exit(0)
            _block(*received, status=theirs.fileno())
        theirs.close()
        self.spare = (pid, ours)
        _answer(self.out, spare=pid)

    def handle(self) -> bool:
        received = _receive(self.sock)
        if received is None:
            return False
        request, fds = received
        if not fds and "signal" in request:
            self._signal(request)
        elif len(fds) != 2:
            _answer(self.out, error="a request carries the block's stdout and stderr")
        else:
            self._give(request, fds)
        for fd in fds:
            os.close(fd)
        return True

    def _give(self, request: dict[str, Any], fds: list[int]) -> None:
        data = json.dumps(request).encode()
        for _ in range(2):  # a spare killed while it waited (not reaped yet): a new one
            self.refill()
            assert self.spare is not None
            pid, channel = self.spare
            self.spare = None
            try:
                socket.send_fds(channel, [struct.pack("!I", len(data))], fds)
                channel.sendall(data)
            except OSError:
                channel.close()
                continue
            self.blocks.add(pid)
            self.channels[channel.fileno()] = (pid, channel)
            _answer(self.out, pid=pid)
            return
        _answer(self.out, error="no process could be forked for the block")

    def _signal(self, request: dict[str, Any]) -> None:
        pid = request["signal"]
        if pid in self.blocks:  # a block's process (group), never another
            with contextlib.suppress(OSError):
                os.killpg(pid, int(request.get("number", signal.SIGKILL)))

    def told(self, fd: int) -> None:
        """A block's channel is readable: its status as it ends (or nothing: it ended without
        saying, and its reaping will tell)."""
        pid, channel = self.channels.pop(fd)
        with contextlib.suppress(OSError):
            said = channel.recv(1)
        channel.close()
        if not said or pid not in self.blocks:
            return
        # Whatever the block's code does, it runs no further: its parent, which has not reaped
        # it, sends SIGKILL (its pid cannot be another process's yet).
        os.kill(pid, signal.SIGKILL)
        self.blocks.discard(pid)
        self.said.add(pid)
        if self.sandboxed:
            self.empty_sandbox(dying=pid)
        _answer(self.out, exit=pid, code=said[0], early=True)

    def reaped(self, pid: int) -> bool:
        """A child was reaped; whether its end is still to be told."""
        if self.spare is not None and self.spare[0] == pid:  # killed while it waited
            self.spare[1].close()
            self.spare = None
        if pid in self.said:
            self.said.discard(pid)
            return False
        for fd, (block, channel) in list(self.channels.items()):
            if block == pid:
                del self.channels[fd]
                channel.close()
        if pid in self.blocks:
            self.blocks.discard(pid)
            if self.sandboxed:
                self.empty_sandbox()
        return True

    def empty_sandbox(self, dying: int | None = None) -> None:
        """Nothing of the block that ended survives it in the sandbox (``--new-session`` and a
        pid namespace shared by all blocks: the host cannot do it from outside). ``dying``: the
        block, killed, whose memory the kernel is still freeing."""
        spare = {self.spare[0]} if self.spare is not None else set()
        _kill_all_but(self.keep | spare | ({dying} if dying else set()))
        mounts = _mount_points()
        for folder in ("/tmp", "/dev/shm"):
            _empty(folder, mounts)
        with contextlib.suppress(Exception):
            _drop_ipc()


def _reap(out: int, spawner: _Spawner) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if spawner.reaped(pid):
            _answer(out, exit=pid, code=_exit_code(status))


def serve(sock_fd: int, modules: list[str]) -> int:
    # The answers go through a copy of stdout: nothing a warm-up import prints can reach them.
    out = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    sock = socket.socket(fileno=sock_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _traceable(False)
    failed = _warm_up(modules)
    _figure_backend()
    # What the warm-up made is never collected again: a collection in a block would walk (and
    # so copy, page by page) the spawner's whole heap the fork shares copy-on-write.
    gc.freeze()
    sandboxed = os.environ.pop("KX_WARM_SANDBOX", "") == "1"
    spawner = _Spawner(sock, out, (wake_r, wake_w), sandboxed)
    _answer(out, ready=os.getpid(), failed=failed)
    while True:
        # Fork the next block's process while none runs: off the next block's path, and not
        # beside a running block, whose end this process must report (a fork of a warm
        # interpreter takes milliseconds of CPU: on a busy machine, the block's own).
        if not spawner.blocks:
            spawner.refill()
        readable, _, _ = select.select([sock.fileno(), wake_r, *spawner.channels], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(out, spawner)
        for fd in readable:
            if fd in spawner.channels:
                spawner.told(fd)
        if sock.fileno() in readable and not spawner.handle():
            return 0


if __name__ == "__main__":
    # ``python FILE`` put this file's folder first on sys.path: a block must not import from it.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.exit(serve(int(sys.argv[1]), sys.argv[2:]))
