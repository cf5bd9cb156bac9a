"""Another language's kernel inside a bubblewrap sandbox: the bridge that starts it there.

IRkernel and Deno cannot bind IPC sockets, and the sandbox's loopback is its own (no network).
So ``BRIDGE_SCRIPT``, run in the sandbox by the host's interpreter, reads the host's connection
file (``ipc`` sockets in the runtime folder the host shares), writes a TCP copy for the kernel
(its own loopback, free ports), starts the kernel, and carries each channel between the unix
socket the host connects to (``IP-N``) and the kernel's port. A connection on ``IP-interrupt``
sends SIGINT to the kernel's process group (a signal to bwrap would not reach it). The bridge
exits with the kernel (and the kernel with it: bwrap's pid namespace ends).
"""

from __future__ import annotations

from pathlib import Path

#: the unix socket (``ip`` + this suffix) whose connection interrupts the kernel
INTERRUPT_SUFFIX = "-interrupt"
#: stands for the kernel's own connection file in its argv (the bridge writes that file)
KERNEL_FILE = "@KERNELEXEC_KERNEL_FILE@"

# The helpers the script uses (copy, connect_when_listening, answer_dns), as source.
_INSIDE = Path(__file__).with_name("_relay_inside.py").read_text()

BRIDGE_SCRIPT = (
    _INSIDE
    + r"""
import json, os, signal, socket, subprocess, sys, threading
host_file, argv = sys.argv[1], sys.argv[2:]
with open(host_file) as f:
    info = json.load(f)
names = ["shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"]
ports = {}
for name in names:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    ports[name] = probe.getsockname()[1]
    probe.close()
inner = dict(info, transport="tcp", ip="127.0.0.1", **ports)
inner_file = os.path.join(os.path.dirname(info["ip"]), "kernel-tcp.json")
fd = os.open(inner_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as f:
    json.dump(inner, f)
argv = [a.replace("@KERNEL_FILE@", inner_file) for a in argv]
proc = subprocess.Popen(argv, start_new_session=True)

def pump(src, dst):
    copy(src, dst)
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

def carry(conn, port):
    out = connect_when_listening(port, lambda: proc.poll() is None)
    if out is None:
        conn.close()
        return
    threading.Thread(target=pump, args=(conn, out), daemon=True).start()
    pump(out, conn)

def serve(path, port):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    while True:
        conn, _ = listener.accept()
        if port is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except OSError:
                pass
            conn.close()
            continue
        threading.Thread(target=carry, args=(conn, port), daemon=True).start()

for name in names:
    path = "%s-%d" % (info["ip"], info[name])
    threading.Thread(target=serve, args=(path, ports[name]), daemon=True).start()
threading.Thread(target=serve, args=(info["ip"] + "@INTERRUPT@", None), daemon=True).start()
code = proc.wait()
sys.exit(code if code >= 0 else 128 - code)
""".replace("@INTERRUPT@", INTERRUPT_SUFFIX).replace("@KERNEL_FILE@", KERNEL_FILE)
)
