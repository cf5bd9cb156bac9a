"""Write the benchmark tables of README.md and docs/benchmarks.md from one results file.

Every number the README and the docs quote about speed comes from one ``results.json`` that
``kernelexec bench`` wrote, so the pages cannot drift from a run: the tables sit between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` markers and are rewritten whole.

    python benchmarks/doc_tables.py                     # the newest file in benchmarks/results/
    python benchmarks/doc_tables.py bench-results/results.json   # after a run of your own
    python benchmarks/doc_tables.py --check             # exit 1 if a page differs (CI, tests)

To publish a new run: copy its ``results.json`` into ``benchmarks/results/`` under a dated name
and run this script.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
PAGES = (
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    ROOT / "docs" / "benchmarks.md",
    ROOT / "docs" / "branching.md",
)
#: ``benchmarks/fork_session.py --out`` runs: the fork table's own results
FORK_RESULTS_DIR = RESULTS_DIR / "fork-session"

# What each executor row isolates: facts of the back ends, not measurements (docs/security.md).
_EXECUTORS: tuple[tuple[str, str, str, str], ...] = (
    ("command", "`command`", "stateless", "nothing: the caller's rights; a cgroup per executor"),
    (
        "warm-command",
        "`warm-command`",
        "stateless",
        "as `command`; each block forked from a warm interpreter",
    ),
    ("kernel", "`kernel`", "stateful", "nothing: the caller's rights; a cgroup per kernel"),
    ("fork-kernel", "`fork-kernel`", "stateful", "as `kernel`; forked from a warm server"),
    ("pool", "`KernelPool`", "stateful", "as `kernel`; started ahead, acquired warm"),
    (
        "sandboxed-command",
        "`sandboxed-command`",
        "stateless",
        "bubblewrap: host read-only, no network, own pid namespace",
    ),
    ("sandboxed-kernel", "`sandboxed-kernel`", "stateful", "bubblewrap, as above"),
    (
        "docker-command",
        "`docker-command`",
        "stateless",
        "a container: no network, not root, no capabilities, limits",
    ),
    ("docker-kernel", "`docker-kernel`", "stateful", "a container, as above"),
    (
        "gvisor-command",
        '`docker-command`, `runtime="runsc"`',
        "stateless",
        "a container under gVisor: syscalls served by a user-space kernel",
    ),
    ("gvisor-kernel", '`docker-kernel`, `runtime="runsc"`', "stateful", "gVisor, as above"),
)
_WORKLOAD_NAMES = {
    "trivial": "`print(1)`",
    "imports": "numpy + pandas imported",
    "analysis": "a pandas analysis step",
    "plots": "a matplotlib figure",
    "outputs": "10,000 displays, then 100 MB of stdout",
}


def newest_results(folder: Path = RESULTS_DIR) -> Path:
    files = sorted(folder.glob("*.json"))
    if not files:
        raise SystemExit(f"no results file in {folder}: run the benchmark first")
    return files[-1]


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def _row(results: dict[str, Any], workload: str, executor: str) -> dict[str, Any] | None:
    for row in results["rows"]:
        if row["workload"] == workload and row["executor"] == executor:
            return dict(row)
    return None


def _p50(row: dict[str, Any] | None, key: str) -> float | None:
    if row is None or row.get("status") != "ok" or not row.get(key):
        return None
    return float(row[key]["p50"])


def _target(results: dict[str, Any], name: str) -> float | None:
    for target in results.get("targets", []):
        if target["name"] == name:
            return float(target["value"])
    return None


def describe_run(results: dict[str, Any], source: str) -> str:
    machine, config = results["machine"], results["config"]
    size = "`--quick` (CI's smoke size)" if config.get("quick") else "full size"
    load = machine.get("load_average", [0.0])[0]
    load_end = machine.get("load_average_end", [load])[0]
    return (
        f"From `{source}`: `kernelexec bench`, {size}, {results['started_at'][:10]}, "
        f"{machine['cpus']} CPUs, Python {machine['python']}, "
        f"load average {load:.1f} at the start and {load_end:.1f} at the end. "
        "p50 = median."
    )


def executors_table(results: dict[str, Any], source: str) -> str:
    lines = [
        "| executor | state | what isolates the code | start to first result | "
        "`print(1)` round trip |",
        "|---|---|---|---|---|",
    ]
    for key, name, state, isolation in _EXECUTORS:
        row = _row(results, "trivial", key)
        start, block = _ms(_p50(row, "startup")), _ms(_p50(row, "block"))
        if key == "pool":  # its trivial session also fills the pool: the acquire is its start
            start = f"{_ms(_target(results, 'pool acquire'))} (acquire)"
        lines.append(f"| {name} | {state} | {isolation} | {start} | {block} |")
    lines += ["", describe_run(results, source)]
    return "\n".join(lines)


def workload_tables(results: dict[str, Any], source: str) -> str:
    out = [describe_run(results, source), ""]
    workloads = list(dict.fromkeys(row["workload"] for row in results["rows"]))
    for workload in workloads:
        out += [
            f"### {workload}: {_WORKLOAD_NAMES.get(workload, workload)}",
            "",
            "| row | group | start p50 | block p50 | block p90 | session p50 |",
            "|---|---|---|---|---|---|",
        ]
        for row in results["rows"]:
            if row["workload"] != workload or row["status"] == "skipped":
                continue
            if row["status"] != "ok":
                reason = row.get("reason") or row["status"]
                out.append(f"| {row['label']} | {row['group']} | {reason} | | | |")
                continue
            p90 = row["block"]["p90"] if row.get("block") else None
            out.append(
                f"| {row['label']} | {row['group']} | {_ms(_p50(row, 'startup'))} | "
                f"{_ms(_p50(row, 'block'))} | {_ms(p90)} | {_ms(_p50(row, 'total'))} |"
            )
        out.append("")
    return "\n".join(out).rstrip()


def targets_table(results: dict[str, Any], source: str) -> str:
    lines = ["| target | measured | threshold | verdict |", "|---|---|---|---|"]
    for t in results.get("targets", []):
        unit = t["unit"]
        value = _ms(t["value"]) if unit == "s" else f"{t['value']:.2f} {unit}".replace(" x", "x")
        limit = _ms(t["threshold"]) if unit == "s" else f"{t['threshold']:g} {unit}"
        sign = "≥" if t["higher_is_better"] else "≤"
        verdict = t["verdict"] + (f" ({t['note']})" if t.get("note") else "")
        lines.append(f"| {t['description']} | {value} | {sign} {limit} | {verdict} |")
    lines += ["", describe_run(results, source)]
    return "\n".join(lines)


def speedups_table(results: dict[str, Any], source: str) -> str:
    lines = [
        "| workload | stateless | stateful | whole session | blocks alone |",
        "|---|---|---|---|---|",
    ]
    for s in results.get("speedups", []):
        lines.append(
            f"| {s['workload']} | {s['stateless']} | {s['stateful']} | "
            f"{s['session']:.2f}x | {s['blocks_only']:.2f}x |"
        )
    return "\n".join(lines)


_FORK_SESSIONS = {
    "fork-kernel": "fork server (`fork-kernel`)",
    "sandboxed-kernel": "sandboxed (`sandboxed-kernel`)",
    "local-kernel": "local kernel (`kernel`)",
}


def fork_table(_results: dict[str, Any], _source: str) -> str:
    """The fork's speed beside its two floors, from the newest ``fork_session.py --out`` run
    (a results file of its own: not ``kernelexec bench``'s)."""
    path = newest_results(FORK_RESULTS_DIR)
    run = json.loads(path.read_text(encoding="utf-8"))
    lines = [
        "| session | fork to first block | of which `fork()` | ipykernel floor | bare floor | "
        "ours / ipykernel floor | ours / bare floor | target 50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in run["rows"]:
        ours, ipk = row["fork_first_block_p50_s"], row["ipykernel_floor_first_block_p50_s"]
        bare = row["floor_fork_first_answer_p50_s"]
        name = _FORK_SESSIONS.get(row["executor"], f"`{row['executor']}`")
        lines.append(
            f"| {name}, {row['array_mib'] / 1024:g} GiB | {_ms(ours)} | "
            f"{_ms(row['fork_call_p50_s'])} | {_ms(ipk)} | {_ms(bare)} | {ours / ipk:.2f}x | "
            f"{ours / bare:.1f}x | {'met' if ours <= 0.05 else 'not met'} |"
        )
    machine, config = run["machine"], run["config"]
    load, load_end = machine["load_average"][0], machine["load_average_end"][0]
    lines += [
        "",
        f"From `{path.relative_to(ROOT).as_posix()}`: `benchmarks/fork_session.py`, "
        f"{config['n']} rounds, {run['started_at'][:10]}, {machine['cpus']} CPUs, load average "
        f"{load:.1f} at the start and {load_end:.1f} at the end. p50 = median.",
    ]
    return "\n".join(lines)


_RENDERERS = {
    "executors": executors_table,
    "workloads": workload_tables,
    "targets": targets_table,
    "speedups": speedups_table,
    "fork": fork_table,
}
_BLOCK = re.compile(
    r"(<!-- bench:(?P<name>[a-z]+) -->)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S
)


def render(text: str, results: dict[str, Any], source: str) -> str:
    def fill(match: re.Match[str]) -> str:
        body = _RENDERERS[match["name"]](results, source)
        return f"{match.group(1)}\n{body}\n{match.group(4)}"

    return _BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("results", nargs="?", type=Path, help="a results.json (default: newest)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on a drift")
    args = parser.parse_args(argv)
    path = (args.results or newest_results()).resolve()
    results = json.loads(path.read_text(encoding="utf-8"))
    source = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    stale = []
    for page in PAGES:
        old = page.read_text(encoding="utf-8")
        new = render(old, results, source)
        if new != old:
            stale.append(page.name)
            if not args.check:
                page.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"out of date with {source}: {', '.join(stale)} (run {sys.argv[0]})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
