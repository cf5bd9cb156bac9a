"""`pip install "kernelexec[bench]"` brings everything `kernelexec bench` imports.

The real check, a fresh virtualenv with the extra alone running `kernelexec bench --quick`, is a
step of .ci/run (a fresh install takes minutes); this test reads the same declarations without
installing anything, so a workload that starts needing a module the extra lacks fails here first.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sys
from collections.abc import Mapping
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli there
    import tomli as tomllib

from kernelexec.bench import cli, workloads
from kernelexec.bench.names import WORKLOAD_NAMES

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _name(requirement: str) -> str:
    """The distribution a requirement names, normalised (PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _declared() -> tuple[list[str], list[str]]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    return project["dependencies"], project["optional-dependencies"]["bench"]


def _closure(roots: list[str]) -> set[str]:
    """The distributions ``roots`` install, following the installed ones' own requirements
    (unconditional ones only: an extra of a dependency is not installed by naming it)."""
    seen: set[str] = set()
    pending = [_name(r) for r in roots]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        pending += [_name(r) for r in requires if "extra ==" not in r.partition(";")[2]]
    return seen


@functools.cache
def _providers() -> Mapping[str, list[str]]:
    """Module -> distributions, over the whole environment (a slow scan: once)."""
    return importlib.metadata.packages_distributions()


def _needed_modules() -> set[str]:
    needed = set(cli.EXTRA_MODULES)
    for quick in (True, False):
        for w in workloads.build_workloads(WORKLOAD_NAMES, quick=quick, rows=10):
            needed.update(w.needs)
    return needed


def test_the_bench_extra_brings_every_module_the_workloads_import() -> None:
    core, bench = _declared()
    installed = _closure(core + bench)
    providers = _providers()
    missing = {
        module: providers.get(module)
        for module in _needed_modules()
        if not {_name(d) for d in providers.get(module, [])} & installed
    }
    assert not missing, f"the bench extra does not install {missing} (module: distributions)"


def test_the_bench_checks_for_the_whole_extra_before_it_starts() -> None:
    """A missing workload module stops the bench with the install hint, before any row runs,
    instead of every row reading "unavailable: lacks pandas"."""
    core, _ = _declared()
    by_core = _closure(core)
    providers = _providers()
    for module in _needed_modules():
        dists = {_name(d) for d in providers.get(module, [])}
        if not dists & by_core:  # the extra, not kernelexec itself, brings it
            assert module in cli.EXTRA_MODULES, module
