"""Shared test set-up: every test gets its tier marker from the folder it lives in."""

from __future__ import annotations

from pathlib import Path

import pytest

# Folder name -> marker (each declared in pyproject.toml; --strict-markers is on).
_TIERS = {"unit", "command", "kernel", "docker", "gateway", "integrations"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))
