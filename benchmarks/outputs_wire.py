"""Collecting outputs: kernelexec beside a raw jupyter_client client, in one run (issue 17 part 2).

    python benchmarks/outputs_wire.py [--displays 10000] [--rounds 3] [--stdout-mb 100]

Per round, interleaved so that load from elsewhere hits both alike:
- the floor: a ``BlockingKernelClient`` on a default ipykernel (``KernelManager``) runs the block
  and receives every ``display_data`` message until ``idle``;
- the kernel alone: the same block timed inside that default kernel (what the kernel spends
  publishing, whoever reads);
- kernelexec: ``KernelExecutor.execute`` of the block, every display kept or counted in the
  ``[... N display outputs omitted ...]`` marker (checked).
Then 100 MB of stdout through ``KernelExecutor`` (and through the raw client, for the floor), with
the host's peak RSS growth (``VmHWM`` reset through ``/proc/self/clear_refs``).
Prints the medians and the verdicts against the targets: 10,000 displays <= 1.5 s; 100 MB of
stdout <= 4 s with host growth <= 100 MB. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

from kernelexec import KernelExecutor
from kernelexec.bench.workloads import display_code, stdout_code

DISPLAY_TARGET = 1.5  # seconds for 10,000 displays
STDOUT_TARGET = 4.0  # seconds for 100 MB of stdout
MEMORY_TARGET = 100.0  # MB of host peak RSS growth


def timed_inside(code: str) -> str:
    body = "".join(f"    {line}\n" for line in code.splitlines())
    start = "import time as _t\n_t0 = _t.perf_counter()\nif True:\n"
    return f"{start}{body}_kx_el = _t.perf_counter() - _t0\n"


def _status(key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(match[1]) if match else 0


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS


class Raw:
    """The floor: jupyter_client's blocking client on a default ipykernel."""

    def __init__(self, work: Path) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(work))
        self.kc: Any = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, kind: str) -> tuple[float, int]:
        count = [0]

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == kind:
                count[0] += 1

        t = time.perf_counter()
        self.kc.execute_interactive(code, timeout=600, output_hook=hook)
        return time.perf_counter() - t, count[0]

    def inside(self, code: str) -> float:
        reply = self.kc.execute_interactive(
            timed_inside(code),
            timeout=600,
            output_hook=lambda msg: None,
            user_expressions={"e": "_kx_el"},
        )
        return float(reply["content"]["user_expressions"]["e"]["data"]["text/plain"])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def kx_displays(ex: KernelExecutor, n: int) -> float:
    t = time.perf_counter()
    r = ex.execute(display_code(n))
    elapsed = time.perf_counter() - t
    kept = sum(
        1 for o in r.outputs if o.get("output_type") == "display_data" and "text/html" in o["data"]
    )
    match = re.search(r"\[\.\.\. (\d+) display outputs omitted", r.output)
    omitted = int(match[1]) if match else 0
    if not r.ok or kept + omitted != n:
        raise SystemExit(f"kernelexec lost displays: {kept} kept + {omitted} counted != {n}")
    return elapsed


# IPython's display formatter and ipykernel's display publisher, each called N times on its own
# in the kernelexec kernel (objects built beforehand): the kernel's share of a display that no
# host-side work can remove. The publishes reach the host as outputs, as display()'s do.
PARTS_CODE = """\
import time as _t
from IPython.display import HTML as _H
_ip = get_ipython()
_objs = [_H(f'<b>{{i}}</b>') for i in range({n})]
_t0 = _t.perf_counter()
for _o in _objs:
    _ip.display_formatter.format(_o)
_f = _t.perf_counter() - _t0
_bundle = _ip.display_formatter.format(_objs[0])
_t0 = _t.perf_counter()
for _o in _objs:
    _ip.display_pub.publish(*_bundle)
_p = _t.perf_counter() - _t0
print(f'kx-parts {{_f}} {{_p}}')
"""


def kx_parts(ex: KernelExecutor, n: int) -> tuple[float, float]:
    """Seconds for n formats and for n publishes, timed inside the kernelexec kernel."""
    r = ex.execute(PARTS_CODE.format(n=n))
    match = re.search(r"kx-parts (\S+) (\S+)", r.stdout)
    if not r.ok or match is None:
        raise SystemExit(f"the parts block failed: {r.output[-500:]}")
    return float(match[1]), float(match[2])


def kx_stdout(ex: KernelExecutor, mb: int) -> tuple[float, float]:
    _reset_peak()
    base = _status("VmRSS")
    t = time.perf_counter()
    r = ex.execute(stdout_code(mb), timeout=600)
    elapsed = time.perf_counter() - t
    grew = (_status("VmHWM") - base) / 1024
    match = re.search(r"\[\.\.\. (\d+) characters omitted", r.stdout)
    total = int(match[1]) + len(r.stdout) - len(match[0]) if match else len(r.stdout)
    if not r.ok or abs(total - mb * 1_000_000) > 200:  # the marker's own text aside
        raise SystemExit(f"kernelexec stdout count off: {total} for {mb * 1_000_000}")
    return elapsed, grew


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--displays", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stdout-mb", type=int, default=100)
    args = parser.parse_args()
    n = args.displays
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        raw = Raw(work)
        ex = KernelExecutor(work_dir=work / "kx", timeout=600)
        try:
            ex.execute("1")
            floor, inside, ours, fmt, pub = [], [], [], [], []
            for i in range(args.rounds):
                seconds, got = raw.run(display_code(n), "display_data")
                if got != n:
                    raise SystemExit(f"the raw client got {got} of {n} displays")
                floor.append(seconds)
                inside.append(raw.inside(display_code(n)))
                ours.append(kx_displays(ex, n))
                f_s, p_s = kx_parts(ex, n)
                fmt.append(f_s)
                pub.append(p_s)
                print(
                    f"round {i + 1}: raw client {floor[-1]:.2f} s, default kernel alone "
                    f"{inside[-1]:.2f} s, kernelexec {ours[-1]:.2f} s, format + publish alone "
                    f"{fmt[-1]:.2f} + {pub[-1]:.2f} s "
                    f"(load {os.getloadavg()[0]:.2f})"
                )
            raw_out, _ = raw.run(stdout_code(args.stdout_mb), "stream")
            out_s, grew = kx_stdout(ex, args.stdout_mb)
        finally:
            ex.close()
            raw.close()
    f, k, o, fm, pb = (statistics.median(x) for x in (floor, inside, ours, fmt, pub))
    print(f"\n{n} displays (median of {args.rounds}):")
    print(f"  raw jupyter_client + default ipykernel  {f:7.2f} s")
    print(f"  default kernel alone (timed inside)     {k:7.2f} s")
    print(f"  kernelexec KernelExecutor.execute       {o:7.2f} s  ({o / f:.2f}x the floor)")
    print(f"  in the kernelexec kernel, IPython's formatter alone   {fm:7.2f} s")
    print(f"  in the kernelexec kernel, ipykernel's publisher alone {pb:7.2f} s")
    scaled = DISPLAY_TARGET * n / 10_000
    if fm + pb > scaled:
        print(f"  (those two alone, {fm + pb:.2f} s, pass the target before any display() or read)")
    print(f"  target <= {scaled:g} s: {verdict(o <= scaled)}")
    print(f"\n{args.stdout_mb} MB of stdout:")
    print(f"  raw jupyter_client + default ipykernel  {raw_out:7.2f} s")
    print(f"  kernelexec KernelExecutor.execute       {out_s:7.2f} s, host peak RSS +{grew:.0f} MB")
    print(
        f"  target <= {STDOUT_TARGET:g} s: {verdict(out_s <= STDOUT_TARGET)}; "
        f"memory <= {MEMORY_TARGET:g} MB: {verdict(grew <= MEMORY_TARGET)}"
    )
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
