# shellcheck shell=bash
# Sourced by .ci/run: the benchmark smoke run, cut to what no test proves already (the tests run
# the command, kernel, fork-kernel and Docker rows: tests/kernel/test_bench.py,
# tests/docker/test_bench_docker.py).
#
#   bench_prepare the fresh virtualenv with `pip install ".[bench]"` and nothing else (.ci/run
#                 makes it in the background during the set-up).
#   bench_extra   the bench extra alone: that virtualenv runs `kernelexec bench --quick` on the
#                 kernel row over every workload (its floor: tests/kernel/test_bench.py), and
#                 every row must be "ok" (a workload import the extra lacks reads
#                 "unavailable", which exits 0: the results file is checked);
#   bench_rows    every other row once, on the trivial workload, in the CI environment (all
#                 back ends and peers installed), without the floors (the tests run those):
#                 each must be "ok".

BENCH_OUT="${TMPDIR:-/tmp}/kernelexec-bench"

# Every row of a results file is "ok", or "skipped" (a workload the row does not run).
_kx_bench_all_ok() {
    python3 - "$1" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
bad = [(r["workload"], r["executor"], r["status"], r["reason"]) for r in rows
       if r["status"] not in ("ok", "skipped")]
for row in bad:
    print("bench.sh: row not ok:", *row, file=sys.stderr)
sys.exit(1 if bad or not rows else 0)
PY
}

BENCH_VENV="${TMPDIR:-/tmp}/kernelexec-bench-venv"

# The fresh virtualenv with the bench extra alone.
bench_prepare() {
    local started=$SECONDS
    rm -rf "$BENCH_VENV"
    kx_venv "$BENCH_VENV" || return 1
    kx_install "$BENCH_VENV/bin/python" ".[bench]" || return 1
    echo "bench_prepare: fresh virtualenv with the bench extra: $((SECONDS - started)) s"
}

# The bench extra alone: its virtualenv runs the kernel row over every workload (.ci/run runs
# this in the background, during the set-up).
bench_extra() {
    local started=$SECONDS venv="$BENCH_VENV"
    [ -x "$venv/bin/kernelexec" ] || bench_prepare || return 1
    # Its kernels may cache their bytecode in this throwaway virtualenv (uv compiled none): the
    # first kernel compiles numpy, pandas and matplotlib, the next ones read it.
    env -u PYTHONDONTWRITEBYTECODE \
        "$venv/bin/kernelexec" bench --quick --no-progress --no-floors --executors kernel \
        --out "$BENCH_OUT/extra" || return 1
    _kx_bench_all_ok "$BENCH_OUT/extra/results.json" || return 1
    rm -rf "$venv"
    echo "bench_extra: $((SECONDS - started)) s"
}

# Every other row once, on the trivial workload, in the CI environment (all back ends and peers
# installed), without the floors (.ci/run runs this in the background, beside the tests: its
# own containers and cgroups carry its own pid, as every test file's do).
bench_rows() {
    local started=$SECONDS
    python3 -m kernelexec bench --quick --no-progress --workloads trivial --no-charts --no-floors \
        --executors sandboxed-command sandboxed-kernel gvisor-command gvisor-kernel pool \
        docker-run ag2-command ag2-jupyter autogen-command autogen-jupyter warm-command \
        --out "$BENCH_OUT/rows" || return 1
    _kx_bench_all_ok "$BENCH_OUT/rows/results.json" || return 1
    echo "bench_rows: $((SECONDS - started)) s"
}
