"""What the framework adapters share: a clear ImportError when a framework is missing, the
peers' Docker arguments, and ``pip install`` lines quietened as the peers quieten them.

Executors are built by name through the registry (``kernelexec._registry``): an adapter's
``kind=`` takes every registered name (``kernel``, ``command``, ``docker-kernel``, ...).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .._errors import ForkUnsupported
from .._registry import EXECUTOR_NAMES, EXECUTORS, make_async_executor, make_executor

#: executor names the adapters accept for ``kind=``
KINDS = EXECUTOR_NAMES

__all__ = [
    "KINDS",
    "docker_peer_options",
    "make_async_executor",
    "make_executor",
    "missing_framework",
    "quiet_pip",
]


def as_peers_do(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for executor ``kind`` with the peers' file layout: a stateless executor
    writes unnamed blocks' code files into the work dir itself (kernelexec's native default is
    its own ``.kernelexec/code``), as AG2's and autogen-ext's command-line executors do."""
    entry = EXECUTORS.get(kind)
    if entry is not None and not entry.stateful:
        return {"code_dir": ".", **options}
    return dict(options)


def missing_framework(module: str, extra: str, exc: ImportError) -> ImportError:
    """The ImportError raised when an adapter's framework is not installed."""
    error = ImportError(
        f"{module} needs an optional framework that is not installed ({exc}); "
        f"install it with: pip install 'kernelexec[{extra}]'"
    )
    error.__cause__ = exc
    return error


def docker_peer_options(
    *,
    image: str | None,
    container_name: str | None,
    bind_dir: str | Path | None,
    auto_remove: bool,
    stop_container: bool,
    run_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``DockerOptions`` fields for the peers' ``DockerCommandLineCodeExecutor`` arguments.

    Only what differs from kernelexec's defaults is passed on, by the option's own name
    (``bind_dir``, ``auto_remove``, ``container_name``). As in both peers, stopping the executor
    (``stop()``, the context manager's exit) always stops the container, kept (exited) when
    ``auto_remove=False``: the peers' ``stop_container=False`` only leaves a container that was
    never stopped out of their exit hook, so it is accepted and changes nothing at ``close()``.
    """
    del stop_container  # see above: close() stops the container whatever it says
    options: dict[str, Any] = {}
    if image is not None:
        options["image"] = image
    if container_name is not None:
        options["container_name"] = container_name
    if bind_dir is not None:
        # The host's path: made absolute as the peers do, links left alone (they may exist
        # only on the host).
        options["bind_dir"] = os.path.abspath(bind_dir)
    if not auto_remove:
        options["auto_remove"] = False
    if run_kwargs:
        options["run_kwargs"] = dict(run_kwargs)
    return options


# pip lines AG2 and autogen-ext quieten with -qqq: "!pip install" / "! pip install" in Python
# (IPython) code, "pip install" at the start of a shell line; kernelexec also quietens %pip and
# python -m pip.
_PIP_IN_PYTHON = re.compile(r"^\s*(?:!\s?|%)pip3? install\b")
_PIP_IN_SHELL = re.compile(r"^\s*(?:python3? -m )?pip3? install\b")


def quiet_pip(code: str, python: bool) -> str:
    """``code`` with ``-qqq`` added to each ``pip install`` line that lacks it, as AG2 and
    autogen-ext do."""
    pattern = _PIP_IN_PYTHON if python else _PIP_IN_SHELL
    lines = code.split("\n")
    for i, line in enumerate(lines):
        match = pattern.match(line)
        if match and "-qqq" not in line:
            lines[i] = f"{match.group(0)} -qqq{line[match.end() :]}"
    return "\n".join(lines)


def branching(executor: Any, what: str) -> Any:
    """The executor's ``fork`` / ``snapshot`` / ``restore`` method: a command executor, which
    keeps no state between blocks, has none (``ForkUnsupported``)."""
    method = getattr(executor, what, None)
    if method is None:
        raise ForkUnsupported(
            f"{what}() needs a kernel executor (its state is what is forked or saved): a"
            " command executor keeps no state between blocks"
        )
    return method
