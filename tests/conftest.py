"""Shared test set-up: every test gets its tier marker from the folder it lives in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Folder name -> marker (each declared in pyproject.toml; --strict-markers is on).
_TIERS = {"unit", "command", "kernel", "docker", "gateway", "integrations", "adversarial"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))


InterruptOnMarker = Callable[[Any, str], threading.Thread]


@pytest.fixture
def interrupt_on_marker() -> Iterator[InterruptOnMarker]:
    """``start(executor, marker)``: a thread that interrupts the sync kernel ``executor`` once
    its running block prints ``marker``; an event, not a guessed sleep. Join it after the block."""
    started: list[tuple[Any, threading.Thread, threading.Event]] = []

    def start(executor: Any, marker: str) -> threading.Thread:
        seen = threading.Event()

        def watch(output: dict[str, Any]) -> None:
            if output.get("output_type") == "stream" and marker in str(output.get("text", "")):
                seen.set()

        executor.aio.on_output = watch

        def interrupt() -> None:
            if seen.wait(60):
                executor.interrupt()

        thread = threading.Thread(target=interrupt, daemon=True)
        thread.start()
        started.append((executor, thread, seen))
        return thread

    yield start
    for executor, thread, seen in started:
        seen.set()  # a block that never printed the marker must not leave the thread waiting
        thread.join(60)
        executor.aio.on_output = None
