"""``kernelexec bench``: stateless vs stateful executors, each beside its floor, in one run.

>>> from kernelexec.bench import BenchConfig, run_benchmarks, write_outputs
>>> results = run_benchmarks(BenchConfig(quick=True, workloads=("trivial",)))  # doctest: +SKIP
>>> write_outputs(results, "bench-results")                                     # doctest: +SKIP

Rows are kernelexec's executors, the floors they are built on (raw ``subprocess.run``, raw
jupyter_client, raw ``docker exec`` / ``docker run``) and, when installed, AG2's and autogen-ext's
executors. A row that cannot run here is reported as unavailable, with the reason.

The tables and charts need the ``bench`` extra (``pip install "kernelexec[bench]"``: rich and
matplotlib). Names are imported on first use (PEP 562), so building the ``kernelexec bench``
parser (``kernelexec --help``) loads none of the modules that run the benchmark.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .executors import SPECS, ExecutorSpec, select_specs
    from .names import EXECUTOR_NAMES, WORKLOAD_NAMES
    from .output import write_outputs
    from .runner import BenchConfig, BenchResults, RowResult, SessionRecord, run_benchmarks
    from .stats import Summary, TargetCheck, percentile
    from .workloads import Workload, build_workloads

# public name -> the submodule that defines it
_LAZY: dict[str, str] = {
    "EXECUTOR_NAMES": ".names",
    "SPECS": ".executors",
    "WORKLOAD_NAMES": ".names",
    "BenchConfig": ".runner",
    "BenchResults": ".runner",
    "ExecutorSpec": ".executors",
    "RowResult": ".runner",
    "SessionRecord": ".runner",
    "Summary": ".stats",
    "TargetCheck": ".stats",
    "Workload": ".workloads",
    "build_workloads": ".workloads",
    "percentile": ".stats",
    "run_benchmarks": ".runner",
    "select_specs": ".executors",
    "write_outputs": ".output",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelexec.bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
