"""The small async bases every back end implements.

Two families, one per executor:

* ``CommandBackend`` runs one command per block (stateless): a local process, or an exec in a
  container. The executor writes the block to a file in the work dir first; the back end only
  runs an argv and pumps its bytes to the sinks it is given.
* ``KernelBackend`` owns a kernel's life (start, interrupt, restart, shutdown, liveness) and hands
  out a client that speaks the Jupyter messaging protocol. Like jupyter_client's provisioners it
  is the seam between "where the kernel runs" and "how we talk to it".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .._types import NetworkEvent

ByteSink = Callable[[bytes], None]


@dataclass(frozen=True, kw_only=True)
class CommandOutcome:
    """How a command ended. ``exit_code`` is None when it was killed for the timeout."""

    exit_code: int | None
    timed_out: bool = False
    killed_reason: str | None = None


class CommandBackend(ABC):
    """Runs one command per block and reports how it ended."""

    #: short name used in results, notebooks and benchmarks, e.g. ``"local-command"``
    kind: str = "command"
    #: whether commands see this process's environment; a container or remote back end gets
    #: only the executor's own variables (no host PATH, HOME or secrets)
    inherits_host_env: bool = True

    @property
    def workspace(self) -> str | None:
        """The work dir as the command sees it (None: the host path itself)."""
        return None

    @abstractmethod
    def argv_for(self, language: str, code_path: str) -> list[str] | None:
        """The argv that runs ``code_path`` (relative to the work dir), or None if unsupported."""

    @abstractmethod
    def supported_languages(self) -> Sequence[str]:
        """Canonical language names this back end can run."""

    async def start(self, work_dir: Path) -> None:  # noqa: B027 - optional hook
        """Prepare to run commands in ``work_dir`` (start a container, check an interpreter)."""

    @abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        work_dir: Path,
        env: Mapping[str, str],
        timeout: float,
        on_stdout: ByteSink,
        on_stderr: ByteSink,
    ) -> CommandOutcome:
        """Run ``argv`` in ``work_dir`` and return when it ended or was killed for the timeout.

        Implementations must kill every process the command started when the timeout expires
        (not only the direct child) and must never wait for a killed child's descendants. The
        local back end also kills, when the command ends, every process it left behind, even
        one that left its process group or session (see ``_containment``).
        """

    async def restart(self) -> None:  # noqa: B027 - optional hook
        """Drop any state kept between commands (e.g. recreate a container)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``start`` created."""

    async def take_network_log(self) -> list[NetworkEvent]:
        """The connections the code asked the egress proxy for since the last call (a back end
        under ``network=NetworkPolicy(...)``); called after each block. The default: none."""
        return []


class KernelClientLike(Protocol):
    """The part of jupyter_client's ``AsyncKernelClient`` the kernel executor uses.

    A remote back end (WebSocket to a gateway) implements the same calls.
    """

    def execute(
        self,
        code: str,
        silent: bool = ...,
        store_history: bool = ...,
        user_expressions: dict[str, Any] | None = ...,
        allow_stdin: bool | None = ...,
        stop_on_error: bool = ...,
    ) -> str: ...

    async def get_iopub_msg(self, timeout: float | None = ...) -> dict[str, Any]: ...

    async def get_shell_msg(self, timeout: float | None = ...) -> dict[str, Any]: ...

    async def get_stdin_msg(self, timeout: float | None = ...) -> dict[str, Any]: ...

    def input(self, string: str) -> None: ...


class KernelBackend(ABC):
    """Owns one kernel at a time and hands out a client connected to it."""

    kind: str = "kernel"
    #: as for ``CommandBackend``: False for kernels that do not run in this host's environment
    inherits_host_env: bool = True
    #: False for a kernel on another machine: its work dir is not the host's, so files move
    #: through the kernel itself
    shares_work_dir: bool = True

    @property
    def workspace(self) -> str | None:
        """The work dir as the kernel sees it (None: the host path itself)."""
        return None

    def run_at_start(self, code: str) -> bool:
        """Offer Python code the executor would otherwise run as the kernel's first (silent)
        request. A back end that runs it inside every kernel it starts, before the kernel
        answers (no round trip), keeps it and returns True; the default declines."""
        return False

    @property
    def runs_other_kernels(self) -> bool:
        """Whether ``other_kernel`` gives back ends for other kernelspecs."""
        return False

    def other_kernel(self, kernel_name: str) -> KernelBackend | None:
        """A back end of the same kind for another kernelspec (an R or Deno kernel beside this
        one, sharing its work dir and confinement); None: this back end runs only its own
        kernel, so a session on it runs Python (and shell) blocks only."""
        return None

    def install_hint(self, kernel_name: str) -> str | None:
        """What to install so that ``other_kernel(kernel_name)`` finds its kernelspec, when it is
        not what would be installed on this host (an image to build); None: the host's."""
        return None

    @abstractmethod
    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        """Start a kernel whose working directory is ``work_dir``; wait until it answers."""

    @property
    @abstractmethod
    def client(self) -> KernelClientLike:
        """A client connected to the current kernel (changes after ``restart``)."""

    @abstractmethod
    async def interrupt(self) -> None:
        """Send the kernel an interrupt (SIGINT or an interrupt_request)."""

    @abstractmethod
    async def restart(self, *, timeout: float) -> None:
        """Replace the kernel with a fresh one; all state is lost."""

    @abstractmethod
    async def is_alive(self) -> bool:
        """Whether the kernel process (or container) is still running."""

    async def seems_gone(self) -> bool:
        """Checked just before each block is sent: True when the kernel looks gone by a check
        cheap enough for every block (no engine or network round trip; the executor confirms
        with ``is_alive``). A kernel that died while idle is then reported as such, not as
        dying in the block sent next. The default cannot tell cheaply: False."""
        return False

    def death_reason(self) -> str | None:
        """Why the kernel died, when the back end can tell (e.g. ``"out of memory"``)."""
        return None

    async def died_before(self, when: float) -> bool:
        """After a death seen while a block ran: True when the back end knows the kernel had
        already ended before ``when`` (``time.time()`` just before the block was sent), so the
        block never ran. A death the cheap check had not seen yet (the engine knew, the relay
        not) is then told as an idle one. The default cannot tell: False."""
        return False

    async def take_network_log(self) -> list[NetworkEvent]:
        """As ``CommandBackend.take_network_log``."""
        return []

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the kernel and release everything ``start`` created. Safe to call twice."""

    # -- forks and live snapshots: what a back end offers (``AsyncKernelExecutor.fork``) ------
    #: what the kernel runs in (a sandbox, a container) holds its forks: a restore keeps it
    holds_forks: bool = False
    #: a fork's back end: where its executor works (None: a fresh temp folder of its own)
    work_home: Path | None = None
    #: ``retire()`` keeps what holds the forks up once the kernel is replaced (Docker)
    retires: bool = False

    @property
    def owner(self) -> tuple[int, int] | None:
        """(uid, gid) the files copied into the work dir are given to (a container's or a
        sandbox's user, on a root host); None: left as the host made them."""
        return None

    async def retire(self) -> None:  # noqa: B027 - optional hook
        """The kernel was replaced by a fork of it (a restore): end it, keeping what holds the
        forks (``retires``). By default nothing: such a kernel is shut down instead."""

    @property
    def forks_live(self) -> bool:
        """Whether ``fork()`` may fork the kernel process (for a kind that forks, ``FORKABLE``);
        False: it goes through a durable snapshot (``fresh_copy``) instead."""
        return True

    def fresh_copy(self) -> KernelBackend | None:
        """A new, unstarted back end like this one (same server, kernelspec, options), for a
        fork made through a durable snapshot when the kernel process cannot be forked (see
        ``AsyncKernelExecutor.fork``). None: this back end offers no such copy."""
        return None
