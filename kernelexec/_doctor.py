"""``kernelexec doctor``: what each back end protects on this machine, measured, not asserted.

For every back end that can run here, the doctor starts it and runs probes as code the back
end runs (an attacker's code: it reports what it can see and do, and plants traps for the host),
then checks from the host whether the host fell for them:

``link``     the code plants links where the host writes (a spill file, ``outputs/``, the code
             folder, the files API's temporary name) to host files the doctor made; the host
             then does what would follow them, and the doctor checks those files are unchanged
``fifo``     the code makes a FIFO; the host's ``read_file`` of it must fail, and at once
``uid``      the code's uid, and the host uid it maps to: not root
``caps``     the code's effective capabilities: none
``socket``   the Docker / containerd sockets: not reachable
``network``  TCP listeners the doctor opens on 127.0.0.1 and on this machine's other
             addresses: not reachable
``env``      a canary variable in the doctor's own environment: not visible to the code
``pids``, ``memory``  the code's cgroup limits: set
``gvisor``   the code runs on gVisor's kernel (``runsc`` only)

Each cell is ``holds``, ``FAILS`` (a protection the back end claims does not hold), ``open``
(not protected, and the back end does not claim it: the local back ends run as this user, by
design) or ``n/a``. The exit status is non-zero when any claimed protection fails.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._errors import KernelExecError
from ._registry import make_executor

PROBES = ("link", "fifo", "uid", "caps", "socket", "network", "env", "pids", "memory", "gvisor")
LOCAL = ("command", "kernel", "fork-kernel")
SANDBOXED = ("sandboxed-command", "sandboxed-kernel")
DOCKER = ("docker-command", "docker-kernel")
#: the back ends the doctor can probe: those that run on this machine
BACKENDS = (*LOCAL, *SANDBOXED, *DOCKER)
_ISOLATING = frozenset({"link", "fifo", "uid", "caps", "socket", "network", "env"})
#: what each kind of back end claims to protect (the local ones only that the host never hangs)
CLAIMS: Mapping[str, frozenset[str]] = {
    **{name: frozenset({"fifo"}) for name in LOCAL},
    **{name: _ISOLATING for name in SANDBOXED},
    **{name: _ISOLATING | {"pids", "memory"} for name in DOCKER},
}
#: the engine and daemon sockets the code must not reach
SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock")
CANARY = "KERNELEXEC_DOCTOR_CANARY"
#: seconds the host's read of a planted FIFO may take before it counts as a hang
FIFO_BOUND = 5.0
_OUTPUT_LIMIT = 2000
_MARK = "KXDOCTOR "
_BY_DESIGN = "no isolation (by design): the code runs as this user, with this user's rights"


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One probe on one back end: ``holds``, ``FAILS``, ``open`` or ``n/a``, and why."""

    status: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One back end (under one OCI runtime, for the Docker ones), probed."""

    name: str
    runtime: str | None = None
    available: bool = True
    note: str = ""
    seconds: float = 0.0
    cells: Mapping[str, Cell] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name if self.runtime is None else f"{self.name} ({self.runtime})"

    @property
    def failed(self) -> list[str]:
        return [probe for probe, cell in self.cells.items() if cell.status == "FAILS"]


@dataclass(frozen=True, kw_only=True)
class Target:
    """A back end to probe: its registered name, the Docker runtime, the executor options."""

    name: str
    runtime: str | None = None
    #: executor options; a test weakens a back end on purpose through them
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def claims(self) -> frozenset[str]:
        extra = {"gvisor"} if self.runtime == "runsc" else set()
        return CLAIMS.get(self.name, frozenset()) | extra


# -- which back ends run here ------------------------------------------------------------------
def targets(names: Sequence[str] | None = None, *, network: Any = None) -> list[Target]:
    """The back ends to probe: ``names`` (all of them by default), each Docker one under runc
    and, when the engine has it, gVisor's ``runsc``. ``network`` (a ``NetworkPolicy``, or
    ``"all"``) is given to the isolating ones: the ``network`` probe then also asks the egress
    proxy for its listeners, which no allowlist names."""
    chosen = list(names or BACKENDS)
    runtimes = _docker_runtimes() if any(n in DOCKER for n in chosen) else []
    found: list[Target] = []
    for name in chosen:
        if name in DOCKER:
            options = {} if network is None else {"network": network}
            found += [Target(name=name, runtime=r, options=options) for r in ("runc", *runtimes)]
        elif name in SANDBOXED and network is not None:
            from .backends._sandbox import SandboxOptions

            found.append(Target(name=name, options={"sandbox": SandboxOptions(network=network)}))
        else:
            found.append(Target(name=name))
    return found


def _docker_runtimes() -> list[str]:
    """The gVisor runtime when the engine has it registered (none without an engine)."""
    from .backends._docker import DockerOptions, make_client

    try:
        client = make_client(DockerOptions())
    except KernelExecError:
        return []
    try:
        return ["runsc"] if "runsc" in (client.info().get("Runtimes") or {}) else []
    except Exception:
        return []
    finally:
        client.close()


# -- the probes, as the back end's code ----------------------------------------------------------
_PROBE_CODE = r"""
import json, os, socket, subprocess
P = json.loads(%(params)r)
r = {"uid": os.getuid()}
def text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None
m = text("/proc/self/uid_map")
r["host_uid"] = None
for line in (m or "").splitlines():
    inside, outside, count = (int(x) for x in line.split())
    if inside <= r["uid"] < inside + count:
        r["host_uid"] = outside + r["uid"] - inside
status = (text("/proc/self/status") or "").splitlines()
caps = [line.split()[1] for line in status if line.startswith("CapEff:")]
r["caps"] = caps[0] if caps else None
r["sockets"] = {}
for path in P["sockets"]:
    if os.path.exists(path):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(1)
        try:
            s.connect(path)
            r["sockets"][path] = "connected"
        except OSError as e:
            r["sockets"][path] = "refused: " + (e.strerror or type(e).__name__)
        finally:
            s.close()
r["network"] = {}
for host, port in P["listeners"]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        r["network"][host] = "connected"
    except OSError as e:
        r["network"][host] = "refused: " + (e.strerror or type(e).__name__)
    if os.environ.get("HTTP_PROXY", "").startswith("http://127.0.0.1:"):
        # an egress policy: the listeners are in no allowlist, so the proxy must refuse them
        proxy = ("127.0.0.1", int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1]))
        target = ("[%%s]" if ":" in host else "%%s") %% host
        try:
            s = socket.create_connection(proxy, timeout=5)
            s.sendall(("CONNECT %%s:%%d HTTP/1.1" %% (target, port)).encode() + b"\r\n\r\n")
            s.settimeout(15)
            answer = s.recv(64)
            s.close()
            if answer.split(b" ")[1:2] == [b"200"]:
                r["network"][host + " via the egress proxy"] = "connected"
        except (OSError, IndexError):
            pass
r["env"] = os.environ.get(P["canary"][0]) == P["canary"][1]
def limit(controller, names):
    base, own = "/sys/fs/cgroup", None
    for line in (text("/proc/self/cgroup") or "").splitlines():
        _, ctl, path = line.split(":", 2)
        if controller in ctl.split(","):
            base, own = "/sys/fs/cgroup/" + controller, path
        elif ctl == "" and own is None:
            own = path
    parts = [x for x in (own or "/").split("/") if x]
    found = []
    for depth in range(len(parts), -1, -1):  # the cgroup's own limit and its ancestors'
        for name in names:
            value = (text(os.path.join(base, *parts[:depth], name)) or "").strip()
            if value.isdigit():
                found.append(int(value))
    return min(found) if found else None
r["pids"] = limit("pids", ["pids.max"])
r["memory"] = limit("memory", ["memory.max", "memory.limit_in_bytes"])
try:
    log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
except Exception:
    log = ""
r["gvisor"] = "gVisor" in log or "gvisor" in (text("/proc/version") or "").lower()
r["planted"] = {}
def plant(name, target):
    try:
        parent = os.path.dirname(name)
        if parent:
            top = parent.split("/")[0]
            if os.path.lexists(top) and not os.path.lexists(top + "/.doctor-own"):
                os.rename(top, top + "-moved-by-doctor")
            os.makedirs(parent, exist_ok=True)
            open(os.path.join(top, ".doctor-own"), "w").close()
        if os.path.lexists(name):
            os.rename(name, name + "-moved-by-doctor")
        os.symlink(target, name)
        r["planted"][name] = "planted"
    except OSError as e:
        r["planted"][name] = "could not: " + str(e)
for name, target in P["plants"].items():
    plant(name, target)
try:
    os.mkfifo("doctor-fifo")
    r["fifo"] = "made"
except OSError as e:
    r["fifo"] = "could not: " + str(e)
print(%(mark)r + json.dumps(r), flush=True)
"""

_TRIGGER_CODE = """
print("D" * %(chars)d)
try:
    from IPython.display import display
    display({"image/png": "iVBORw0KGgo="}, raw=True)
except Exception:
    pass
"""


@dataclass
class _Bait:
    """Host files and folders the planted links point at, and the listeners."""

    folder: Path
    files: dict[str, Path]
    dirs: dict[str, Path]
    listeners: list[tuple[str, int]]
    sockets: list[socket.socket]
    canary: tuple[str, str]

    def plants(self) -> dict[str, str]:
        """Work dir path -> host path: where the host writes, and where a link sends it."""
        spill = {f".kernelexec/output/block-{i}.txt": str(self.files["spill"]) for i in (1, 2, 3)}
        return {
            **spill,
            ".kernelexec/code": str(self.dirs["code"]),
            "outputs": str(self.dirs["outputs"]),
            ".doctor-data.kx-partial": str(self.files["partial"]),
        }

    def untouched(self) -> list[str]:
        """The host files and folders the host wrote through a link."""
        hit = [f"{p}" for p in self.files.values() if p.read_text() != "doctor bait\n"]
        return hit + [f"{d}/{os.listdir(d)[0]}" for d in self.dirs.values() if os.listdir(d)]


@contextlib.contextmanager
def _bait() -> Iterator[_Bait]:
    folder = Path(tempfile.mkdtemp(prefix="kernelexec-doctor-"))
    files = {name: folder / f"host-{name}.txt" for name in ("spill", "partial")}
    for path in files.values():
        path.write_text("doctor bait\n")
    dirs = {name: folder / f"host-{name}" for name in ("code", "outputs")}
    for path in dirs.values():
        path.mkdir()
    sockets, listeners = [], []
    for address in ("127.0.0.1", *_other_addresses()):
        with contextlib.suppress(OSError):
            s = socket.socket()
            s.bind((address, 0))
            s.listen(8)
            sockets.append(s)
            listeners.append((address, s.getsockname()[1]))
    canary = (CANARY, secrets.token_hex(8))
    old = os.environ.get(CANARY)
    os.environ[CANARY] = canary[1]
    try:
        yield _Bait(folder, files, dirs, listeners, sockets, canary)
    finally:
        if old is None:
            os.environ.pop(CANARY, None)
        else:
            os.environ[CANARY] = old
        for s in sockets:
            s.close()
        shutil.rmtree(folder, ignore_errors=True)


def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (from the kernel's routing table)."""
    found: list[str] = []
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return found
    for before, line in itertools.pairwise(lines):
        address = before.strip().removeprefix("|-- ")
        if "/32 host LOCAL" in line and not address.startswith("127.") and address not in found:
            found.append(address)
    return found[:3]


# -- running one back end ------------------------------------------------------------------------
def probe(target: Target) -> Row:
    """Start ``target``, run the probes, and judge each cell."""
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kernelexec-doctor-work-"))
    try:
        with _bait() as bait:
            seen, host = _run(target, work, bait)
    except KernelExecError as exc:
        return Row(name=target.name, runtime=target.runtime, available=False, note=str(exc))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cells = _judge(target, seen, host)
    note = _BY_DESIGN if target.name in LOCAL else ""
    return Row(
        name=target.name,
        runtime=target.runtime,
        note=note,
        seconds=round(time.monotonic() - started, 1),
        cells=cells,
    )


def _run(target: Target, work: Path, bait: _Bait) -> tuple[dict[str, Any], dict[str, Any]]:
    """The probes' report from inside, and what the host did."""
    options: dict[str, Any] = {"work_dir": work, "timeout": 30, "output_limit": _OUTPUT_LIMIT}
    if target.runtime not in (None, "runc"):
        options["runtime"] = target.runtime
    ex = make_executor(target.name, **{**options, **target.options})
    try:
        params = {
            "sockets": list(SOCKETS),
            "listeners": bait.listeners,
            "canary": bait.canary,
            "plants": bait.plants(),
        }
        code = _PROBE_CODE % {"params": json.dumps(params), "mark": _MARK}
        result = ex.execute(code)
        seen = _report(result.stdout or result.output)
        if seen is None:
            raise KernelExecError(f"the probes did not report: {result.output[-500:]}")
        ex.execute(_TRIGGER_CODE % {"chars": _OUTPUT_LIMIT * 5})
        host: dict[str, Any] = {"write_file": _host_write(ex)}
        host["fifo"] = _host_fifo(ex, work / "doctor-fifo")
        host["written_through"] = bait.untouched()
        if target.name in DOCKER:
            host["limits"] = _engine_limits(getattr(ex.aio.backend, "session", ""))
        return seen, host
    finally:
        with contextlib.suppress(KernelExecError):
            ex.close()


def _engine_limits(session: str) -> dict[str, int | None]:
    """The limits the engine set on the back end's container (gVisor hides its cgroups from
    the code inside, so they are read from the host too)."""
    from .backends._docker import LABEL_SESSION, DockerOptions, make_client

    client = make_client(DockerOptions())
    try:
        found = client.containers.list(
            all=True, filters={"label": f"{LABEL_SESSION}={session}"}, ignore_removed=True
        )
        config = (found[0].attrs.get("HostConfig") or {}) if found else {}
        return {"pids": config.get("PidsLimit") or None, "memory": config.get("Memory") or None}
    finally:
        client.close()


def _report(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith(_MARK):
            with contextlib.suppress(ValueError):
                found: dict[str, Any] = json.loads(line[len(_MARK) :])
                return found
    return None


def _host_write(ex: Any) -> str:
    try:
        ex.write_file("doctor-data", b"written by the host\n")
    except Exception as exc:
        return f"refused: {type(exc).__name__}"
    return "written"


def _host_fifo(ex: Any, fifo: Path) -> dict[str, Any]:
    """The host reads the code's FIFO with a time bound; unblocked by the doctor if it hangs."""
    outcome: dict[str, Any] = {}

    def read() -> None:
        try:
            ex.read_file("doctor-fifo")
            outcome["result"] = "read"
        except Exception as exc:
            outcome["result"] = f"{type(exc).__name__}: {exc}"

    started = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(FIFO_BOUND)
    outcome["seconds"] = round(time.monotonic() - started, 2)
    outcome["hung"] = reader.is_alive()
    while reader.is_alive():  # a writer that opens and closes gives the blocked reader EOF
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(0.2)
    return outcome


# -- judging -------------------------------------------------------------------------------------
def _judge(target: Target, seen: Mapping[str, Any], host: Mapping[str, Any]) -> dict[str, Cell]:
    measured = {
        "link": _link(seen, host),
        "fifo": _fifo(seen, host),
        "uid": _uid(seen),
        "caps": _caps(seen),
        "socket": _sockets(seen),
        "network": _network(seen),
        "env": _env(seen),
        "pids": _limit(seen, host, "pids"),
        "memory": _limit(seen, host, "memory"),
        "gvisor": _gvisor(seen),
    }
    cells: dict[str, Cell] = {}
    for probe_name, (holds, detail) in measured.items():
        if holds is None:
            cells[probe_name] = Cell(status="n/a", detail=detail)
        elif holds:
            cells[probe_name] = Cell(status="holds", detail=detail)
        elif probe_name in target.claims:
            cells[probe_name] = Cell(status="FAILS", detail=detail)
        elif probe_name == "gvisor":
            cells[probe_name] = Cell(status="n/a", detail="not gVisor")
        else:
            cells[probe_name] = Cell(status="open", detail=detail)
    return cells


Verdict = tuple[bool | None, str]


def _link(seen: Mapping[str, Any], host: Mapping[str, Any]) -> Verdict:
    planted = [name for name, how in (seen.get("planted") or {}).items() if how == "planted"]
    if not planted:
        return None, "the code could not plant a link"
    hit = host.get("written_through") or []
    if hit:
        return False, "the host wrote through planted links into " + ", ".join(sorted(hit))
    return True, ""


def _fifo(seen: Mapping[str, Any], host: Mapping[str, Any]) -> Verdict:
    if seen.get("fifo") != "made":
        return None, "the code could not make a FIFO"
    outcome = host.get("fifo") or {}
    if outcome.get("hung"):
        return False, f"the host's read_file of a FIFO hung (> {FIFO_BOUND:g} s)"
    if outcome.get("result") == "read":
        return False, "the host read a FIFO as a file"
    return True, f"{outcome.get('result')} in {outcome.get('seconds')} s"


def _uid(seen: Mapping[str, Any]) -> Verdict:
    uid, host_uid = seen.get("uid"), seen.get("host_uid")
    if uid == 0:
        return False, "the code is root"
    if host_uid == 0:
        return False, f"the code is uid {uid}, which is root on the host (user namespace map)"
    return True, ""


def _caps(seen: Mapping[str, Any]) -> Verdict:
    caps = seen.get("caps")
    if caps is None:
        return None, "no capability set readable"
    if int(caps, 16) != 0:
        return False, f"the code holds capabilities (CapEff {caps})"
    return True, ""


def _sockets(seen: Mapping[str, Any]) -> Verdict:
    reached = [path for path, how in (seen.get("sockets") or {}).items() if how == "connected"]
    if reached:
        return False, "the code reaches " + ", ".join(reached)
    return True, ""


def _network(seen: Mapping[str, Any]) -> Verdict:
    reached = [host for host, how in (seen.get("network") or {}).items() if how == "connected"]
    if reached:
        return False, "the code reaches host listeners on " + ", ".join(reached)
    return True, ""


def _env(seen: Mapping[str, Any]) -> Verdict:
    if seen.get("env"):
        return False, "the code sees the host's canary variable"
    return True, ""


def _gvisor(seen: Mapping[str, Any]) -> Verdict:
    if seen.get("gvisor"):
        return True, "dmesg / /proc/version: gVisor"
    return False, "the code runs on the host's kernel"


def _limit(seen: Mapping[str, Any], host: Mapping[str, Any], kind: str) -> Verdict:
    unit = "processes" if kind == "pids" else "bytes"
    value = seen.get(kind)
    if isinstance(value, int) and value < 2**60:
        return True, f"{value} {unit}"
    engine = (host.get("limits") or {}).get(kind)
    if isinstance(engine, int) and 0 < engine < 2**60:
        return True, f"{engine} {unit}, set by the engine (not visible inside)"
    return False, "no limit"


# -- the report ----------------------------------------------------------------------------------
def run_doctor(selected: Sequence[Target] | None = None) -> list[Row]:
    """Probe every back end of ``selected`` (default: each that can run here) in turn."""
    return [probe(target) for target in (selected if selected is not None else targets())]


def as_json(rows: Sequence[Row]) -> dict[str, Any]:
    return {
        "ok": not any(row.failed for row in rows),
        "probes": list(PROBES),
        "backends": [
            {**asdict(row), "label": row.label, "failed": row.failed, "cells": _cells(row)}
            for row in rows
        ],
    }


def _cells(row: Row) -> dict[str, Any]:
    return {name: asdict(cell) for name, cell in row.cells.items()}


def matrix(rows: Sequence[Row]) -> str:
    """The table: back ends by probes, then one line per failure, ``open`` and ``n/a``."""
    width = max([len(row.label) for row in rows] + [9])
    lines = ["back end".ljust(width) + "  " + " ".join(p.ljust(7) for p in PROBES)]
    notes: list[str] = []
    for row in rows:
        if not row.available:
            lines.append(row.label.ljust(width) + "  n/a: " + _short(row.note))
            continue
        cells = " ".join(row.cells[p].status.ljust(7) for p in PROBES)
        lines.append(f"{row.label.ljust(width)}  {cells} {row.seconds:.1f} s")
        if row.note:
            notes.append(f"{row.label}: {row.note}")
        notes += [
            f"{row.label} {p}: {row.cells[p].status}: {row.cells[p].detail}"
            for p in PROBES
            if row.cells[p].status == "FAILS"
        ]
    return "\n".join([*lines, "", *notes])


def _short(text: str, size: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= size else text[: size - 3] + "..."
