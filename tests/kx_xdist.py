"""The parallel run's groups (``pytest -n N``; the scheduler is in tests/conftest.py), in a module
of their own so a test can import them: ``conftest`` names a different module in each tier."""

from __future__ import annotations

_SERIAL_TIERS = {"docker", "cluster"}
_SERIAL_FILES = {
    "test_docker_hardening.py",
    "test_docker_dropins.py",
    "test_mcp_docker.py",
    "test_gc_leftovers.py",
    "test_host_killed.py",
    "test_containment.py",
    "test_fork_kernel.py",
}


def xdist_group(nodeid: str) -> str:
    """The group of a test, from its node id (``tests/<tier>/<file>::<name>``)."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    tier, name = (parts[-2] if len(parts) > 1 else ""), parts[-1]
    if tier in _SERIAL_TIERS or name in _SERIAL_FILES:
        return "serial"
    return path
