"""Forking a live session and restoring a live snapshot, beside a cold start and a re-run.

    python benchmarks/fork_session.py [-n 5] [--mib 1024] [--executor KIND ...] [--json]
        [--out FILE]

A session (``--executor``: ``fork-kernel``, the default, or ``sandboxed-kernel``; repeat it for a
row each) holds a numpy array of ``--mib`` MiB. Measured, round by round:

* fork to the child's first block: ``ex.fork()`` + a block reading the array. Target 50 ms.
* restore: ``ex.restore(snapshot)`` + the same block.
* cold start + re-running the blocks: a new fork-server kernel that builds the array again, then
  the same block (what an agent without fork does to get a second copy of its state).
* the child's unique memory (USS) once forked, and after it wrote 64 MiB of its own: a fork's
  memory grows only with what it writes (the array's pages stay shared).
* the floor, in the same run: a bare Python process holding the same array, asked over ZMQ to
  ``os.fork()``, whose child makes a fresh ZMQ context and answers one request from here (the
  least a fork to a first answer costs on this machine, without a kernel); printed with the
  target, the load average and the ratio of the fork to it.
* the ipykernel floor, in the same run: an ipykernel kernel (an ``IPKernelApp`` started from a
  connection file) holding the same array in its shell, forked on an execute request, whose
  child does what ipykernel needs to answer on fresh sockets and nothing of kernelexec's (a new
  zmq context, session key, sockets, iopub and control threads, IO streams and kernel object
  around the same shell); from the request to fork to the child's answers to a
  ``kernel_info_request`` and a block reading the array. What any library forking an ipykernel
  pays: the fork's ratio to it is the part that is kernelexec's. The fork is split into ``fork()``
  (the kernel forked, the child's kernel built and answering) and its first block.

With ``--gateway URL`` (token from ``$KERNELEXEC_GATEWAY_TOKEN``), a gateway session holding
``--gateway-mib`` MiB too: its kernel process cannot be forked, so ``fork()`` goes through a
durable snapshot (every byte through the kernel, base64 in 4 MiB messages; the fresh kernel
starts while the snapshot is taken), measured beside a cold start + re-run on the same gateway.

With ``--docker RUNTIME`` (``runc`` or ``runsc``, repeatable), a Docker kernel session holding
``--docker-mib`` MiB: a live snapshot (a paused fork of the kernel in its container), restore +
a block, ``fork()`` (through a durable snapshot into a new container) to the child's first
block, beside a cold start (a new container) + re-run.

Verdicts are printed lines, not assertions; the machine's load is printed with them. ``--out``
writes the rows as a results file (the machine, the load at start and end, the options): the
published ones are in ``benchmarks/results/fork-session/`` (a folder of their own: the files
directly in ``benchmarks/results/`` are ``kernelexec bench``'s, read by ``doc_tables.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from tempfile import TemporaryDirectory
from typing import Any

import zmq

from kernelexec import KernelExecutor, make_executor, stop_fork_servers
from kernelexec.bench.memory import uss_bytes
from kernelexec.bench.runner import machine_info

FORK_TARGET_S = 0.050
READ = "print(float(big[:4].sum()))"


def build(mib: int) -> str:
    return f"import numpy as np\nbig = np.ones({mib} * 2**20 // 8)\n"


def _pid(ex: KernelExecutor) -> int:
    """The kernel's host pid (a sandboxed kernel's own pid is its sandbox's)."""
    pid = ex.aio.backend.pid
    assert pid is not None
    return int(pid)


def fork_round(ex: KernelExecutor) -> tuple[float, float, float, float]:
    """(seconds to the child's first block, child USS MiB, USS MiB after writing 64 MiB,
    seconds of that in ``fork()`` itself)."""
    started = time.perf_counter()
    child = ex.fork()
    try:
        forked = time.perf_counter() - started
        result = child.execute(READ)
        elapsed = time.perf_counter() - started
        assert result.exit_code == 0, result.output
        pid = _pid(child)
        uss = (uss_bytes(pid) or 0) / 2**20
        child.execute("own = np.ones(8 * 2**20)")  # 64 MiB the child writes
        grown = (uss_bytes(pid) or 0) / 2**20
    finally:
        child.close()
    return elapsed, uss, grown, forked


# The floor: a bare process holding the array forks on request; its child, in a fresh ZMQ
# context, connects here and answers one request (the block's stand-in: it reads the array).
_FLOOR_PROCESS = """
import os, sys, zmq, numpy as np
big = np.ones(int(sys.argv[1]) * 2**20 // 8)
ctx = zmq.Context()
rep = ctx.socket(zmq.REP)
rep.connect(sys.argv[2])
while (address := rep.recv().decode()):
    pid = os.fork()
    if pid == 0:
        child = zmq.Context()  # the parent's context is never used in the child
        s = child.socket(zmq.DEALER)
        s.connect(address)
        s.send(b"here")
        s.recv()
        s.send(str(float(big[:4].sum())).encode())
        child.destroy(linger=5000)  # the answer sent before the process goes
        os._exit(0)
    rep.send(str(pid).encode())
    os.waitpid(pid, 0)
rep.send(b"")
"""


class Floor:
    """The bare process holding ``mib`` MiB, ready to fork (``round()``, then ``close()``)."""

    def __init__(self, mib: int, root: str) -> None:
        self._ctx = zmq.Context()
        self._req = self._ctx.socket(zmq.REQ)
        self._req.bind(f"ipc://{root}/floor-parent")
        self._answers = self._ctx.socket(zmq.ROUTER)
        self._address = f"ipc://{root}/floor-child"
        self._answers.bind(self._address)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _FLOOR_PROCESS, str(mib), f"ipc://{root}/floor-parent"]
        )

    def round(self) -> float:
        """Seconds from asking for the fork to the child's answer to one request."""
        started = time.perf_counter()
        self._req.send(self._address.encode())
        peer, _ = self._answers.recv_multipart()  # the child connected (in its fresh context)
        self._answers.send_multipart([peer, b"read"])
        _, answer = self._answers.recv_multipart()
        elapsed = time.perf_counter() - started
        assert float(answer) == 4.0, answer
        self._req.recv()  # the parent's own answer (the child's pid)
        return elapsed

    def close(self) -> None:
        self._req.send(b"")
        self._req.recv()
        self._proc.wait(30)
        self._ctx.destroy(linger=0)


def floor_rounds(mib: int, rounds: int) -> list[float]:
    with TemporaryDirectory() as root:
        floor = Floor(mib, root)
        try:
            floor.round()  # the first round waits for the process to build its array
            return [floor.round() for _ in range(rounds)]
        finally:
            floor.close()


# The library's floor: the same array in the shell of an ipykernel kernel started the way a
# kernel is (an IPKernelApp from a connection file), forked on an execute request; the child
# does what ipykernel itself needs to answer on fresh sockets, and nothing of kernelexec's: a
# fresh event loop, a new zmq context and session key, ipykernel's own sockets, iopub and
# control threads, IO streams and kernel object around the same shell (no heartbeat, no
# cgroup, no new session, no descriptors closed, no log, no set-up code). The parent's sockets
# and threads are left alone (kept, never used). What any library forking an ipykernel pays.
_IPYKERNEL_FLOOR = """
import asyncio, os, sys, threading
import numpy as np
from ipykernel.kernelapp import IPKernelApp
from jupyter_client.session import Session

_kept = []

def fork_floor(connection_file):
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid:
        threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True).start()
        return pid
    try:
        app = IPKernelApp.instance()
        _kept.extend([app.kernel, app.context, app.heartbeat, app.iopub_thread, app.session,
                      app.control_thread, app.shell_channel_thread, app.shell_socket,
                      app.stdin_socket, sys.stdout, sys.stderr, sys.displayhook,
                      asyncio.events._get_running_loop()])
        for stream in (sys.stdout, sys.stderr):
            stream._should_watch = False
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        asyncio.events._set_running_loop(None)
        asyncio.set_event_loop(asyncio.new_event_loop())
        app.context = app.heartbeat = app.iopub_thread = None
        app.control_thread = app.shell_channel_thread = None
        app.connection_file = connection_file
        app.session = Session(parent=app)
        app.init_connection_file()
        app.init_sockets()
        app.init_io()
        shell = app.shell
        type(app.kernel).clear_instance()
        app.init_kernel()
        shell.parent = shell.kernel = app.kernel
        app.shell = shell
        app.start()
    finally:
        os._exit(0)

app = IPKernelApp.instance()
# History in memory: a child writing the parent's sqlite file through a shared connection
# would garble it (and print a warning into the first block's output)
app.initialize(["-f", sys.argv[2], "--HistoryManager.hist_file=:memory:"])
app.shell.user_ns["big"] = np.ones(int(sys.argv[1]) * 2**20 // 8)
app.shell.user_ns["_fork_floor"] = fork_floor
app.start()
"""


class _Channels:
    """One kernel's shell and iopub, on plain zmq sockets signed with its key."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], info: dict[str, Any]) -> None:
        from jupyter_client.session import Session

        self.session = Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"])
        base = f"ipc://{info['ip']}"
        self.shell = ctx.socket(zmq.DEALER)
        self.shell.connect(f"{base}-{info['shell_port']}")
        self.iopub = ctx.socket(zmq.SUB)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(f"{base}-{info['iopub_port']}")
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)

    def ask(
        self, msg_type: str, content: dict[str, Any], until: float
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Send a shell request; its reply and its iopub messages, up to its idle status (an
        empty reply if ``until`` (a perf_counter time) passes first)."""
        sent = self.session.send(self.shell, msg_type, content)
        assert sent is not None
        msg_id = sent["header"]["msg_id"]
        reply: dict[str, Any] = {}
        published: list[dict[str, Any]] = []
        idle = False
        while not (reply and idle):
            left = until - time.perf_counter()
            if left <= 0:
                return {}, published
            for sock, _ in self.poller.poll(int(left * 1000) + 1):
                _, frames = self.session.feed_identities(sock.recv_multipart())
                msg = self.session.deserialize(frames)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if sock is self.shell:
                    reply = msg
                elif msg["msg_type"] == "status":
                    idle = idle or msg["content"]["execution_state"] == "idle"
                else:
                    published.append(msg)
        return reply, published

    def welcomed(self, until: float) -> None:
        """Wait for ipykernel's welcome on IOPub (the subscription is live: no status of the
        first request is missed), at most until ``until``."""
        while (left := until - time.perf_counter()) > 0:
            if not self.iopub.poll(int(left * 1000) + 1):
                return
            _, frames = self.session.feed_identities(self.iopub.recv_multipart())
            if self.session.deserialize(frames)["msg_type"] == "iopub_welcome":
                return

    def close(self) -> None:
        self.shell.close(linger=0)
        self.iopub.close(linger=0)


class IpykernelFloor:
    """An ipykernel kernel holding ``mib`` MiB, forked on request (``round()``, ``close()``)."""

    def __init__(self, mib: int, root: str) -> None:
        from jupyter_client.connect import write_connection_file

        self._root, self._count = root, 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        parent_file = os.path.join(root, "parent.json")
        write_connection_file(parent_file, transport="ipc", ip=os.path.join(root, "p"))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _IPYKERNEL_FLOOR, str(mib), parent_file],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._parent = _Channels(self._ctx, _read_json(parent_file))
        until = time.perf_counter() + 120  # the array is built before the kernel answers
        while not self._parent.ask("kernel_info_request", {}, time.perf_counter() + 0.5)[0]:
            if time.perf_counter() > until or self._proc.poll() is not None:
                raise RuntimeError("the ipykernel floor's kernel did not start")

    def round(self) -> float:
        """Seconds from asking the kernel to fork to the child's answer to one block (its
        kernel_info answered first, as a client checks that a kernel is up)."""
        from jupyter_client.connect import write_connection_file

        self._count += 1
        started = time.perf_counter()
        child_file = os.path.join(self._root, f"child-{self._count}.json")
        write_connection_file(
            child_file, transport="ipc", ip=os.path.join(self._root, f"c{self._count}")
        )
        forked = {"silent": True, "store_history": False, "code": ""}
        forked["user_expressions"] = {"pid": f"_fork_floor({child_file!r})"}
        forked.update(allow_stdin=False, stop_on_error=False)
        reply, _ = self._parent.ask("execute_request", forked, started + 30)
        pid = int(reply["content"]["user_expressions"]["pid"]["data"]["text/plain"])
        info = _read_json(child_file)
        until = started + 30
        # Connected once bound (an IPC connect before the bind waits zmq's reconnect interval)
        for port in ("shell_port", "iopub_port"):
            while not os.path.exists(f"{info['ip']}-{info[port]}"):
                if time.perf_counter() > until:
                    raise RuntimeError("the ipykernel floor's fork did not bind its sockets")
                time.sleep(0.001)
        child = _Channels(self._ctx, info)
        try:
            child.welcomed(time.perf_counter() + 0.5)
            while not child.ask("kernel_info_request", {}, min(until, time.perf_counter() + 0.5))[
                0
            ]:
                if time.perf_counter() > until:
                    raise RuntimeError("the ipykernel floor's fork did not answer")
            block = {"code": READ, "silent": False, "store_history": True}
            block.update(user_expressions={}, allow_stdin=False, stop_on_error=True)
            reply, published = child.ask("execute_request", block, until)
            elapsed = time.perf_counter() - started
            text = "".join(m["content"].get("text", "") for m in published)
            assert reply["content"]["status"] == "ok" and text == "4.0\n", published
        finally:
            child.close()
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return elapsed

    def close(self) -> None:
        self._parent.close()
        self._proc.kill()
        self._proc.wait(30)
        self._ctx.destroy(linger=0)


def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return dict(json.load(f))


def ipykernel_floor_rounds(mib: int, rounds: int) -> list[float]:
    with TemporaryDirectory() as root:
        floor = IpykernelFloor(mib, root)
        try:
            floor.round()  # the first fork pays for what later ones find ready
            return [floor.round() for _ in range(rounds)]
        finally:
            floor.close()


def restore_round(ex: KernelExecutor, snapshot: Any) -> float:
    started = time.perf_counter()
    ex.restore(snapshot)
    result = ex.execute(READ)
    assert result.exit_code == 0, result.output
    return time.perf_counter() - started


def cold_round(root: str, mib: int, kind: str) -> float:
    started = time.perf_counter()
    with make_executor(kind, work_dir=root, timeout=120) as cold:
        cold.execute(build(mib))
        result = cold.execute(READ)
        assert result.exit_code == 0, result.output
        return time.perf_counter() - started


def measure(rounds: int, mib: int, kind: str = "fork-kernel") -> dict[str, Any]:
    with TemporaryDirectory() as root:
        ex = make_executor(kind, work_dir=root, timeout=120)
        assert isinstance(ex, KernelExecutor)
        try:
            ex.execute(build(mib))
            snapshot = ex.snapshot()
            forks, restores, colds, uss, grown, calls = [], [], [], [], [], []
            for _ in range(rounds):
                seconds, before, after, call = fork_round(ex)
                forks.append(seconds)
                uss.append(before)
                grown.append(after)
                calls.append(call)
                restores.append(restore_round(ex, snapshot))
                colds.append(cold_round(root, mib, kind))
            snapshot.release()
        finally:
            ex.close()
            stop_fork_servers()
    # Interleaved with the forks' rounds would put a second 1 GiB process beside each fork;
    # measured right after them, in the same run, at (about) the same load.
    floor = statistics.median(floor_rounds(mib, rounds))
    library_floor = statistics.median(ipykernel_floor_rounds(mib, rounds))
    return {
        "executor": kind,
        "load": os.getloadavg(),
        "array_mib": mib,
        "rounds": rounds,
        "fork_first_block_p50_s": statistics.median(forks),
        "fork_call_p50_s": statistics.median(calls),
        "floor_fork_first_answer_p50_s": floor,
        "ipykernel_floor_first_block_p50_s": library_floor,
        "restore_first_block_p50_s": statistics.median(restores),
        "cold_start_rerun_p50_s": statistics.median(colds),
        "child_uss_mib": statistics.median(uss),
        "child_uss_after_64mib_write_mib": statistics.median(grown),
    }


def gateway_measure(url: str, rounds: int, mib: int) -> dict[str, Any]:
    """Fork through a snapshot to the child's first block, beside a cold start + re-run."""
    from kernelexec.backends.gateway_kernel import GatewayKernel

    via, colds = [], []
    with TemporaryDirectory() as root, KernelExecutor(GatewayKernel(url), work_dir=root) as ex:
        ex.execute(build(mib), timeout=300)
        for _ in range(rounds):
            started = time.perf_counter()
            child = ex.fork()
            try:
                result = child.execute(READ)
                via.append(time.perf_counter() - started)
                assert result.exit_code == 0 and child.forked_via == "snapshot", result.output
            finally:
                child.close()
            started = time.perf_counter()
            with KernelExecutor(GatewayKernel(url)) as cold:
                cold.execute(build(mib), timeout=300)
                assert cold.execute(READ).exit_code == 0
            colds.append(time.perf_counter() - started)
    return {
        "gateway_array_mib": mib,
        "gateway_fork_via_snapshot_p50_s": statistics.median(via),
        "gateway_cold_start_rerun_p50_s": statistics.median(colds),
    }


def docker_measure(runtime: str, rounds: int, mib: int) -> dict[str, Any]:
    """A Docker kernel's live snapshot, restore + block, fork to first block, cold start."""
    from kernelexec.backends.docker_kernel import DockerKernel

    def backend() -> DockerKernel:  # under gVisor every thread counts against pids_limit
        return DockerKernel(runtime=runtime, pids_limit=1024 if runtime == "runsc" else None)

    snaps, restores, forks, colds = [], [], [], []
    with TemporaryDirectory() as root, KernelExecutor(backend(), work_dir=root) as ex:
        ex.execute(build(mib), timeout=300)
        for _ in range(rounds):
            started = time.perf_counter()
            snapshot = ex.snapshot()
            snaps.append(time.perf_counter() - started)
            restores.append(restore_round(ex, snapshot))
            snapshot.release()
            started = time.perf_counter()
            # the route its key names (a live fork's figures: benchmarks/fork_docker.py)
            child = ex.fork(via="snapshot")
            try:
                assert child.execute(READ).exit_code == 0
                forks.append(time.perf_counter() - started)
            finally:
                child.close()
            started = time.perf_counter()
            with KernelExecutor(backend()) as cold:
                cold.execute(build(mib), timeout=300)
                assert cold.execute(READ).exit_code == 0
            colds.append(time.perf_counter() - started)
    return {
        "executor": f"docker-kernel ({runtime})",
        "load": os.getloadavg(),
        "array_mib": mib,
        "rounds": rounds,
        "live_snapshot_p50_s": statistics.median(snaps),
        "restore_first_block_p50_s": statistics.median(restores),
        "fork_via_snapshot_first_block_p50_s": statistics.median(forks),
        "cold_start_rerun_p50_s": statistics.median(colds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--mib", type=int, default=1024, help="the array's size (default 1024)")
    parser.add_argument(
        "--executor",
        action="append",
        choices=("fork-kernel", "sandboxed-kernel"),
        help="the session's back end, repeatable (default fork-kernel)",
    )
    parser.add_argument(
        "--docker", action="append", choices=("runc", "runsc"), help="a Docker kernel row"
    )
    parser.add_argument("--docker-mib", type=int, default=64, help="its array (default 64)")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument("--out", help="also write the rows to this results file (JSON)")
    parser.add_argument("--gateway", help="a gateway's URL: add the fork-via-snapshot row")
    parser.add_argument("--gateway-mib", type=int, default=64, help="its array (default 64)")
    args = parser.parse_args(argv)
    kinds = args.executor or ([] if args.docker else ["fork-kernel"])
    started, machine = datetime.now(timezone.utc), machine_info()
    reports = [measure(args.n, args.mib, kind) for kind in kinds]
    reports += [docker_measure(rt, args.n, args.docker_mib) for rt in args.docker or []]
    if args.gateway:
        reports[0].update(gateway_measure(args.gateway, args.n, args.gateway_mib))
    if args.out:
        _write_results(args.out, vars(args), started, machine, reports)
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        for report in reports:
            _print(report)
    return 0


def _write_results(
    path: str,
    options: dict[str, Any],
    started: datetime,
    machine: dict[str, Any],
    rows: list[dict[str, Any]],
) -> None:
    """The run as a results file, in the shape ``kernelexec bench`` writes its own."""
    results = {
        "schema": 1,
        "benchmark": "fork_session",
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine, "load_average_end": list(os.getloadavg())},
        "config": {k: v for k, v in options.items() if k not in ("json", "out")},
        "rows": rows,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
        f.write("\n")


def _print(r: dict[str, Any]) -> None:
    if "live_snapshot_p50_s" in r:
        _print_docker(r)
        return
    fork = r["fork_first_block_p50_s"]
    verdict = "PASS" if fork <= FORK_TARGET_S else "FAIL"
    print(f"load average {r['load'][0]:.2f}, python {sys.version.split()[0]}")
    print(
        f"{r['executor']} session holding a {r['array_mib']} MiB array, {r['rounds']} rounds (p50):"
    )
    print(
        f"  fork to the child's first block {fork * 1000:.0f} ms  target "
        f"{FORK_TARGET_S * 1000:.0f} ms: {verdict}"
    )
    call = r["fork_call_p50_s"]
    block = (fork - call) * 1000
    print(f"    of which fork() {call * 1000:.0f} ms, the first block {block:.0f} ms")
    floor = r["floor_fork_first_answer_p50_s"]
    print(
        f"  floor: os.fork() of a bare process holding the array to its child's first ZMQ "
        f"answer {floor * 1000:.1f} ms; the fork is {fork / floor:.1f}x the floor"
    )
    library = r["ipykernel_floor_first_block_p50_s"]
    print(
        f"  ipykernel floor: an ipykernel kernel holding the array, forked, its child rebuilt by "
        f"ipykernel alone to its first block {library * 1000:.1f} ms; the fork is "
        f"{fork / library:.1f}x it (it is {library / floor:.1f}x the bare floor)"
    )
    print(f"  restore a live snapshot + block {r['restore_first_block_p50_s'] * 1000:.0f} ms")
    print(f"  cold start + re-run the blocks {r['cold_start_rerun_p50_s'] * 1000:.0f} ms")
    print(
        f"  child USS {r['child_uss_mib']:.1f} MiB; after writing 64 MiB "
        f"{r['child_uss_after_64mib_write_mib']:.1f} MiB"
    )
    if "gateway_array_mib" in r:
        print(f"gateway session holding a {r['gateway_array_mib']} MiB array (p50):")
        via = r["gateway_fork_via_snapshot_p50_s"]
        print(f"  fork via snapshot to the child's first block {via * 1000:.0f} ms")
        cold = r["gateway_cold_start_rerun_p50_s"]
        print(f"  cold start + re-run the blocks {cold * 1000:.0f} ms")


def _print_docker(r: dict[str, Any]) -> None:
    print(f"load average {r['load'][0]:.2f}, python {sys.version.split()[0]}")
    print(
        f"{r['executor']} session holding a {r['array_mib']} MiB array, {r['rounds']} rounds (p50):"
    )
    print(f"  live snapshot {r['live_snapshot_p50_s'] * 1000:.0f} ms")
    print(f"  restore a live snapshot + block {r['restore_first_block_p50_s'] * 1000:.0f} ms")
    via = r["fork_via_snapshot_first_block_p50_s"]
    print(f"  fork (via snapshot) to the child's first block {via * 1000:.0f} ms")
    print(f"  cold start + re-run the blocks {r['cold_start_rerun_p50_s'] * 1000:.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
