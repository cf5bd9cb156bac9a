"""``kernelexec bench``: stateless vs stateful executors, each beside its floor, in one run.

>>> from kernelexec.bench import BenchConfig, run_benchmarks, write_outputs
>>> results = run_benchmarks(BenchConfig(quick=True, workloads=("trivial",)))  # doctest: +SKIP
>>> write_outputs(results, "bench-results")                                     # doctest: +SKIP

Rows are kernelexec's executors, the floors they are built on (raw ``subprocess.run``, raw
jupyter_client, raw ``docker exec`` / ``docker run``) and, when installed, AG2's and autogen-ext's
executors. A row that cannot run here is reported as unavailable, with the reason.
"""

from __future__ import annotations

from .executors import EXECUTOR_NAMES, SPECS, ExecutorSpec, select_specs
from .output import write_outputs
from .runner import BenchConfig, BenchResults, RowResult, SessionRecord, run_benchmarks
from .stats import Summary, TargetCheck, percentile
from .workloads import WORKLOAD_NAMES, Workload, build_workloads

__all__ = [
    "EXECUTOR_NAMES",
    "SPECS",
    "WORKLOAD_NAMES",
    "BenchConfig",
    "BenchResults",
    "ExecutorSpec",
    "RowResult",
    "SessionRecord",
    "Summary",
    "TargetCheck",
    "Workload",
    "build_workloads",
    "percentile",
    "run_benchmarks",
    "select_specs",
    "write_outputs",
]
