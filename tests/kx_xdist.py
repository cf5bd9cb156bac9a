"""The parallel run's groups (``pytest -n N``; the scheduler is in tests/conftest.py), in a module
of their own so a test can import them: ``conftest`` names a different module in each tier.

A group runs in one worker, one test after the other. Most files are a group of their own. Three
groups hold files that must not run beside each other:

- ``sweeps``: every file that runs ``kernelexec gc`` (a sweep is host-wide: two at once race for
  the same dead host's leftovers, and one finds "removed 0");
- ``cluster``: the rest of the Swarm tier (one Swarm fixture per worker, made once);
- ``docker-1`` and ``docker-2``: the Docker tier and other tiers' Docker files, in two halves of
  about equal time, so the engine serves two of these files at once, not more (containers' ends
  are awaited with deadlines). Every file finds its own containers by its owner's pid label.
"""

from __future__ import annotations

_SWEEPS = {
    "test_gc_leftovers.py",
    "test_host_killed.py",
    "test_containment.py",
    "test_fork_kernel.py",
    "test_docker_lifecycle.py",
    "test_docker_kept_and_bind_dir.py",
    "test_swarm_gc.py",
}
_DOCKER_FILES = {
    "test_docker_hardening.py",
    "test_docker_dropins.py",
    "test_mcp_docker.py",
}
# One half of the Docker files (the other half: the rest of tests/docker and _DOCKER_FILES).
_DOCKER_1 = {
    "test_gvisor.py",
    "test_docker_kernel.py",
    "test_bench_docker.py",
    "test_docker_out_of_docker.py",
    "test_fork_docker.py",
    "test_fork_docker_live.py",
}


def xdist_group(nodeid: str) -> str:
    """The group of a test, from its node id (``tests/<tier>/<file>::<name>``)."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    tier, name = (parts[-2] if len(parts) > 1 else ""), parts[-1]
    if name in _SWEEPS:
        return "sweeps"
    if tier == "cluster":
        return "cluster"
    if name in _DOCKER_1:
        return "docker-1"
    if tier == "docker" or name in _DOCKER_FILES:
        return "docker-2"
    return path


#: Seconds the longest groups took in one parallel run (``pytest -n 3`` on 2 cores, load about
#: 12, 2026-11-27). The scheduler starts the longest group waiting first, so that none is left
#: for the end while the other workers idle; only the order depends on these figures.
_MEASURED = {
    "docker-2": 970,
    "sweeps": 740,
    "docker-1": 570,
    "cluster": 560,
    "tests/adversarial/test_leaks_and_threads.py": 320,
    "tests/kernel/test_readme.py": 270,
    "tests/mcp/test_mcp_stdio.py": 260,
    "tests/kernel/test_bench.py": 220,
    "tests/kernel/test_repl_terminal.py": 190,
    "tests/integrations/test_autogen_peer.py": 160,
    "tests/gateway/test_gateway_executor.py": 160,
    "tests/fidelity/test_every_block_runs.py": 150,
    "tests/fidelity/test_sequences.py": 130,
    "tests/adversarial/test_floods.py": 130,
    "tests/gateway/test_gateway_files.py": 110,
    "tests/kernel/test_cli_kernel.py": 110,
    "tests/integrations/test_smolagents.py": 100,
    "tests/gateway/test_doc_snippets.py": 100,
    "tests/kernel/test_containment_kernel.py": 90,
    "tests/command/test_charts_command.py": 90,
}
#: seconds a test, for a group not measured above (the median group's rate in that run)
_PER_TEST = 1.5


def group_weight(group: str, tests: int) -> float:
    """How long ``group`` (of ``tests`` tests) is expected to take, for ordering only."""
    return _MEASURED.get(group, _PER_TEST * tests)
