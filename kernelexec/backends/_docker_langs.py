"""Other languages' kernels in a Docker kernel's container: the launcher run in it, and the host's
watch on that launcher.

An R, Deno or bash kernel of a docker-kernel session runs in the SAME container as its Python
kernel (same work dir, limits, user, no network), started by one ``docker exec`` of
``LAUNCHER_SCRIPT`` with stdin attached:

* it looks the kernelspec up in the image (``MISSING_LINE`` and exit 4 when there is none: the
  image was built without that language), reads the connection info as one JSON line from stdin
  (the key never sits in an argv or an environment), writes it 0600 under the runtime folder,
  and starts the kernel in a process group of its own, its stdout discarded and the last 2,000
  bytes of its stderr kept (why it failed to start);
* it prints ``PID_LINE``, then waits; ``int`` on stdin sends SIGINT to the kernel's group (an
  interrupt without a ``docker exec`` per block); stdin closing (the host let go, or died)
  kills the group; the kernel ending prints ``EXIT_LINE`` with its status and stderr's tail.

IRkernel and Deno cannot bind IPC sockets: every language kernel listens on the container's own
loopback and is reached through a relay (``_docker_relay``), under runc as under gVisor.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
from typing import Any

MISSING_LINE = "KX-MISSING"
PID_LINE = "KX-PID"
EXIT_LINE = "KX-EXIT"
#: the launcher's exit status when the image has no such kernelspec
EXIT_MISSING = 4
_TAIL = 2000

LAUNCHER_SCRIPT = r"""
import json, os, signal, subprocess, sys, threading
name, path = sys.argv[1], sys.argv[2]
try:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    spec = KernelSpecManager().get_kernel_spec(name)
except NoSuchKernel:
    sys.stdout.write("@MISSING@\n")
    sys.stdout.flush()
    sys.exit(@EXIT_MISSING@)
info = sys.stdin.readline()
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
with os.fdopen(fd, "w") as f:
    f.write(info)
argv = [a.format(connection_file=path) for a in spec.argv]
if argv[0] in ("python", "python3"):
    argv[0] = sys.executable
env = dict(os.environ)
env.update(spec.env or {})
proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE, start_new_session=True)
tail = [b""]

def drain():
    while True:
        data = proc.stderr.read1(65536)
        if not data:
            return
        tail[0] = (tail[0] + data)[-@TAIL@:]

def signal_group(sig):
    try:
        os.killpg(proc.pid, sig)
    except OSError:
        pass

def control():
    for line in sys.stdin:
        if line.strip() == "int":
            signal_group(signal.SIGINT)
    signal_group(signal.SIGKILL)
    os._exit(0)

drainer = threading.Thread(target=drain, daemon=True)
drainer.start()
threading.Thread(target=control, daemon=True).start()
sys.stdout.write("@PID@ %d\n" % proc.pid)
sys.stdout.flush()
code = proc.wait()
signal_group(signal.SIGKILL)
drainer.join(2)
sys.stdout.write("@EXIT@ %d %s\n" % (code, json.dumps(tail[0].decode("utf-8", "replace"))))
sys.stdout.flush()
"""
for _key, _value in {
    "@MISSING@": MISSING_LINE,
    "@EXIT_MISSING@": str(EXIT_MISSING),
    "@TAIL@": str(_TAIL),
    "@PID@": PID_LINE,
    "@EXIT@": EXIT_LINE,
}.items():
    LAUNCHER_SCRIPT = LAUNCHER_SCRIPT.replace(_key, _value)


class LauncherWatch:
    """The host's side of one launcher exec: reads what it prints (in a thread, bounded) and
    tells whether, and why, the kernel ended. ``frames`` is the Docker SDK's ``frames_iter``."""

    def __init__(self, stream: Any, frames: Any) -> None:
        self._stream = stream
        self._raw: socket.socket = getattr(stream, "_sock", stream)
        self._frames = frames
        self.pid: int | None = None
        self.missing = False
        #: why the kernel ended (None: it runs, or the launcher has not said yet)
        self.reason: str | None = None
        self.stderr_tail = ""
        self._ended = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True, name="kernelexec-lang")
        self._thread.start()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def send(self, line: str) -> bool:
        """A line to the launcher's stdin; False when it is gone."""
        try:
            self._raw.sendall(line.encode() + b"\n")
        except OSError:
            return False
        return True

    def wait_started(self, timeout: float) -> bool:
        """Until the kernel's pid was told, or the launcher ended: whether it was told."""
        self._started.wait(timeout)
        return self.pid is not None

    def close(self) -> None:
        """End the launcher's stdin (it kills the kernel's group) and drop the stream."""
        for how in (lambda: self._raw.shutdown(socket.SHUT_RDWR), self._stream.close):
            with contextlib.suppress(OSError):
                how()
        with contextlib.suppress(OSError):
            self._raw.close()
        self._thread.join(timeout=5)

    def _read(self) -> None:
        pending = b""
        try:
            for stream_id, data in self._frames(self._stream, False):
                if stream_id != 1:  # the launcher's own stderr: kept only as a last word
                    self.stderr_tail = (self.stderr_tail + _text(data))[-_TAIL:]
                    continue
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    self._line(_text(line))
                pending = pending[-_TAIL:]  # no line of ours is that long
        except (OSError, ValueError):
            pass
        finally:
            if self.reason is None:
                self.reason = "its launcher ended (the container stopped?)"
            self._ended.set()
            self._started.set()

    def _line(self, line: str) -> None:
        if line == MISSING_LINE:
            self.missing, self.reason = True, "no such kernelspec in the image"
        elif line.startswith(PID_LINE + " "):
            with contextlib.suppress(ValueError):
                self.pid = int(line.split()[1])
            self._started.set()
        elif line.startswith(EXIT_LINE + " "):
            _, code, *rest = line.split(" ", 2)
            with contextlib.suppress(ValueError):
                self.stderr_tail = str(json.loads(rest[0])) if rest else ""
            self.reason = exit_words(code)


def exit_words(code: str) -> str:
    """A kernel's exit status (a negative one is a signal, as ``subprocess`` tells it)."""
    with contextlib.suppress(ValueError):
        number = int(code)
        if number < 0:
            with contextlib.suppress(ValueError):
                return f"killed by signal {signal.Signals(-number).name}"
        return f"exit status {number}"
    return "it ended"


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")
