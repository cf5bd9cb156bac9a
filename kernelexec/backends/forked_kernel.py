"""A kernel forked from another running kernel: same state, own process, sockets and cgroup.

``AsyncKernelExecutor.fork()`` prepares a ``ForkedKernel`` (its private folder, connection file
and cgroup), asks the running kernel to fork itself into it (``fork_request``: the source of
``_fork_child.py`` loaded by a silent request, run by its user expression), then starts the
child's executor, whose back end adopts the forked process: from then on it is a kernel like a
fork-server kernel (not the host's child; its own process group and cgroup, killed with them on
``close()``).

A restart (asked for, or after the forked kernel died) cannot fork again from a state that is
gone: it gives a fresh kernel from a fork server, as a restart of any kernel loses its state.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .._errors import BackendUnavailable
from . import _containment
from .fork_kernel import ForkKernel

_CHILD_SOURCE = Path(__file__).with_name("_fork_child.py")
#: the module the fork code is loaded into in the kernel (never the user's namespace)
MODULE = "_kx_fork"


def fork_request(request: dict[str, Any]) -> tuple[str, str]:
    """The silent cell that loads the fork code into a module object of its own (no name is
    left in the user's namespace), and the user expression that forks and is the child's pid.
    The fork runs as an expression, after the cell: the child starts outside any cell (IPython's
    display and builtin traps are not held), as a kernel between two requests is."""
    source = _CHILD_SOURCE.read_text(encoding="utf-8")
    cell = (
        "(lambda m: (m.__dict__.update(__builtins__=__import__('builtins')),"
        f" exec(compile({source!r}, '<kernelexec fork>', 'exec'), m.__dict__),"
        f" __import__('sys').modules.__setitem__({MODULE!r}, m)))"
        f"(__import__('types').ModuleType({MODULE!r}))\n"
    )
    expression = (
        f"__import__('sys').modules[{MODULE!r}].fork("
        f"__import__('json').loads({json.dumps(request)!r}))"
    )
    return cell, expression


class ForkedKernel(ForkKernel):
    """The back end of a fork: adopts the forked process, then behaves as a fork-server kernel."""

    kind = "forked-kernel"

    def __init__(self, *, origin_kind: str, python: str | None = None) -> None:
        super().__init__(python=python)
        #: the kind of the kernel this one was forked from (``local-kernel``, ``fork-kernel``)
        self.origin_kind = origin_kind
        self._adopt: dict[str, Any] | None = None

    def prepare(self, *, work_dir: Path, cwd: str | None = None) -> dict[str, Any]:
        """The request the running kernel forks into (a private folder, connection file, log,
        cgroup); ``cwd``: the child's working folder (default: ``work_dir``)."""
        if _containment.mechanism() == "subreaper":
            raise BackendUnavailable(
                "fork() needs cgroup or process-group containment (KERNELEXEC_CONTAINMENT): "
                "under the subreaper helper a forked kernel would die with its parent"
            )
        self._work_dir = work_dir
        request = self._request()
        # The child keeps the parent kernel's environment (the same executor options).
        os.unlink(request.pop("env_file"))
        request["cwd"] = cwd or str(work_dir)
        self._adopt = request
        return request

    def adopted(self, pid: int) -> None:
        """The running kernel forked: ``pid`` is the child the next ``start()`` connects to."""
        self._pid = pid

    def release_request(self) -> None:
        """The fork failed: the prepared folder and cgroup go (nothing was forked into them)."""
        self._adopt = None

    async def _fork(self, deadline: float) -> dict[str, Any]:
        request, self._adopt = self._adopt, None
        if request is not None and self._pid is not None:
            return request
        # A restart: the forked state is gone; a fresh kernel (as any restart gives).
        self.python = self.python or sys.executable
        return await super()._fork(deadline)
