"""What the harness runs blocks through: one ``Session`` type per executor row.

A session is opened (its start-up is part of the measured cold start), runs blocks one at a
time, and is closed. Floors are the raw tools a kernelexec executor is built on, driven as
plainly as possible; kernelexec rows and peers go through their public APIs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .memory import uss_bytes
from .workloads import DATA_FILE

# The same environment the stateless executor gives its processes, so floors do equal work.
BLOCK_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8", "MPLBACKEND": "Agg"}
BENCH_LABEL = "kernelexec.bench"


@dataclass(frozen=True)
class Outcome:
    """Whether a block succeeded, and the text it printed (checked against the workload)."""

    ok: bool
    text: str


class Session(ABC):
    """One executor session: blocks run in order; ``close`` releases everything it started."""

    def data_path(self, work_dir: Path) -> str:
        """The data file as the code sees it (relative: the code runs in the work dir)."""
        return DATA_FILE

    def container_ids(self) -> list[str]:
        """Containers whose memory counts for this session."""
        return []

    def metrics(self) -> dict[str, float]:
        """Extra figures a row measures itself (e.g. a pool's acquire time)."""
        return {}

    def settle(self) -> None:  # noqa: B027 - optional hook
        """After close, untimed: wait for background work the session caused (a pool refill),
        so it does not steal CPU from the next row's measurement."""

    @abstractmethod
    def run(self, code: str, timeout: float) -> Outcome: ...

    @abstractmethod
    def close(self) -> None: ...


def block_env() -> dict[str, str]:
    return {**os.environ, **BLOCK_ENV}


# -- floors ---------------------------------------------------------------------------------


class SubprocessSession(Session):
    """Raw ``subprocess.run`` of the interpreter on the block saved to a file."""

    def __init__(self, work_dir: Path, python: str = sys.executable) -> None:
        self.work_dir = work_dir
        self.python = python
        self.env = block_env()
        self.count = 0

    def run(self, code: str, timeout: float) -> Outcome:
        self.count += 1
        name = f"floor_{self.count}.py"
        (self.work_dir / name).write_text(code, encoding="utf-8")
        proc = subprocess.run(
            [self.python, name],
            cwd=self.work_dir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            start_new_session=True,
        )
        text = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
        return Outcome(ok=proc.returncode == 0, text=text)

    def close(self) -> None:
        pass


class JupyterClientSession(Session):
    """Raw jupyter_client: ``KernelManager`` + ``BlockingKernelClient.execute_interactive``."""

    def __init__(self, work_dir: Path, timeout: float) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.kc: Any = None
        try:
            self.km.start_kernel(cwd=str(work_dir))
            self.kc = self.km.blocking_client()
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=timeout)
        except BaseException:
            self.close()
            raise

    def run(self, code: str, timeout: float) -> Outcome:
        texts: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                texts.append(content["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                texts.append(content["data"].get("text/plain", ""))
            elif msg["msg_type"] == "error":
                texts.append(f"{content['ename']}: {content['evalue']}")

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        return Outcome(ok=reply["content"]["status"] == "ok", text="".join(texts))

    def close(self) -> None:
        try:
            if self.kc is not None:
                self.kc.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel()
            self.km.cleanup_resources()


def docker_limits() -> list[str]:
    """The resource and security flags kernelexec's containers get by default.

    The floor runs under the same limits (notably the CPU quota), so a ratio measures the
    executor's overhead rather than a difference in limits.
    """
    from .. import DockerOptions

    opts = DockerOptions()
    flags = ["--user", opts.resolved_user()]
    flags += [a for cap in opts.cap_drop for a in ("--cap-drop", cap)]
    flags += [a for opt in opts.security_opt for a in ("--security-opt", opt)]
    if opts.pids_limit is not None:
        flags += ["--pids-limit", str(opts.pids_limit)]
    if opts.memory is not None:
        flags += ["--memory", opts.memory, "--memory-swap", opts.memory]
    if opts.cpus is not None:
        flags += ["--cpus", str(opts.cpus)]
    flags += ["--tmpfs", f"/tmp:rw,nosuid,nodev,size={opts.tmpfs_size},mode=1777"]
    flags += ["-e", "HOME=/tmp", "-e", "LANG=C.UTF-8"]
    return flags


class DockerCliSession(Session):
    """Raw ``docker exec`` in a long-lived container, or ``docker run --rm`` per block."""

    def __init__(self, work_dir: Path, image: str, *, per_block: bool) -> None:
        self.work_dir = work_dir
        self.image = image
        self.per_block = per_block
        self.count = 0
        self.container: str | None = None
        # The image's user may not be root: let it write plots into the work dir.
        work_dir.chmod(0o777)
        if not per_block:
            name = f"kernelexec-bench-{uuid.uuid4().hex[:12]}"
            self.container = name
            try:
                self._docker(
                    "run",
                    "-d",
                    "--rm",
                    "--init",
                    *self._mount(),
                    "--name",
                    name,
                    *self._labels(),
                    image,
                    "sleep",
                    "infinity",
                )
            except BaseException:
                self.close()
                raise

    def _mount(self) -> list[str]:
        return [
            "--network",
            "none",
            "-v",
            f"{self.work_dir}:/workspace",
            "-w",
            "/workspace",
            *docker_limits(),
        ]

    def _labels(self) -> list[str]:
        return ["--label", f"{BENCH_LABEL}.owner={os.getpid()}"]

    def _docker(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["docker", *args],
            capture_output=True,
            timeout=timeout,
            check=True,
            stdin=subprocess.DEVNULL,
        )

    def container_ids(self) -> list[str]:
        if self.container is None:
            return []
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            out = self._docker("inspect", "-f", "{{.Id}}", self.container, timeout=10)
            return [out.stdout.decode().strip()]
        return []

    def run(self, code: str, timeout: float) -> Outcome:
        self.count += 1
        name = f"floor_{self.count}.py"
        (self.work_dir / name).write_text(code, encoding="utf-8")
        env = [a for k, v in BLOCK_ENV.items() for a in ("-e", f"{k}={v}")]
        if self.per_block:
            argv = [
                "docker",
                "run",
                "--rm",
                *self._mount(),
                *self._labels(),
                *env,
                self.image,
                "python3",
                name,
            ]
        else:
            assert self.container is not None
            argv = ["docker", "exec", *env, self.container, "python3", name]
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        text = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
        return Outcome(ok=proc.returncode == 0, text=text)

    def close(self) -> None:
        if self.container is not None:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._docker("rm", "-f", self.container)
            self.container = None


# -- kernelexec executors ---------------------------------------------------------------------


class KernelexecSession(Session):
    """Any kernelexec ``SyncExecutor``: started on open, ``execute`` per block."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.kernel_uss: int | None = None
        try:
            executor.start()
        except BaseException:
            executor.close()
            raise

    def container_ids(self) -> list[str]:
        container = getattr(getattr(self.executor, "backend", None), "container", None)
        cid = getattr(container, "id", None)
        return [cid] if isinstance(cid, str) else []

    def run(self, code: str, timeout: float) -> Outcome:
        result = self.executor.execute(code, timeout=timeout)
        return Outcome(ok=bool(result.ok), text=str(result.output))

    def close(self) -> None:
        # The kernel's own memory, idle after the session's blocks (for the fork kernel's
        # target): read before close ends it.
        pid = getattr(getattr(self.executor, "backend", None), "pid", None)
        if isinstance(pid, int):
            self.kernel_uss = uss_bytes(pid)
        self.executor.close()

    def metrics(self) -> dict[str, float]:
        if self.kernel_uss is None:
            return {}
        return {"kernel_uss_mib": self.kernel_uss / 2**20}


class PoolSession(KernelexecSession):
    """A kernel acquired from a ``KernelPool`` that was filled before the session began."""

    def __init__(self, pool: Any, settle_timeout: float = 120.0) -> None:
        self.pool = pool
        self.settle_timeout = settle_timeout
        started = time.perf_counter()
        executor = pool.acquire()
        self.acquire_s = time.perf_counter() - started
        super().__init__(executor)

    def data_path(self, work_dir: Path) -> str:
        # The pool chose the kernel's working directory; the data stays in the bench's.
        return str(work_dir / DATA_FILE)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "acquire_s": self.acquire_s}

    def settle(self) -> None:
        wait_for_idle(self.pool, self.settle_timeout)


def wait_for_idle(pool: Any, timeout: float) -> None:
    """Wait until the pool has refilled to its minimum (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while pool.idle < pool.options.min_size and time.monotonic() < deadline:
        time.sleep(0.05)


# -- peers ------------------------------------------------------------------------------------


class Ag2Session(Session):
    """An AG2 executor (``autogen.coding``): synchronous ``execute_code_blocks``."""

    def __init__(self, executor: Any, *, closer: Any = None, absolute_data: bool = False) -> None:
        self.executor = executor
        self.closer = closer
        self.absolute_data = absolute_data

    def data_path(self, work_dir: Path) -> str:
        return str(work_dir / DATA_FILE) if self.absolute_data else DATA_FILE

    def run(self, code: str, timeout: float) -> Outcome:
        from autogen.coding import CodeBlock

        result = self.executor.execute_code_blocks([CodeBlock(code=code, language="python")])
        return Outcome(ok=result.exit_code == 0, text=str(result.output))

    def close(self) -> None:
        if self.closer is not None:
            self.closer()


class AutogenSession(Session):
    """An autogen-ext executor: async API, driven on a private event loop."""

    def __init__(
        self, executor: Any, *, absolute_data: bool = False, start_in: Path | None = None
    ) -> None:
        self.executor = executor
        self.absolute_data = absolute_data
        # A loop of our own (asyncio.Runner is 3.11+; the package supports 3.10).
        self.loop = asyncio.new_event_loop()
        # ``start_in``: autogen-ext's Jupyter executor starts its kernel in the process's
        # working directory (its blocks' relative files land there: a plots block once
        # rewrote by_category.png in this checkout), so the bench starts it in the work dir.
        here = os.getcwd()
        try:
            if start_in is not None:
                os.chdir(start_in)  # contextlib.chdir is 3.11+
            try:
                self.loop.run_until_complete(executor.start())
            finally:
                os.chdir(here)
        except BaseException:
            self.loop.close()
            raise

    def data_path(self, work_dir: Path) -> str:
        return str(work_dir / DATA_FILE) if self.absolute_data else DATA_FILE

    def run(self, code: str, timeout: float) -> Outcome:
        from autogen_core import CancellationToken
        from autogen_core.code_executor import CodeBlock

        blocks = [CodeBlock(code=code, language="python")]
        result = self.loop.run_until_complete(
            self.executor.execute_code_blocks(blocks, CancellationToken())
        )
        return Outcome(ok=result.exit_code == 0, text=str(result.output))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.executor.stop())
        finally:
            self.loop.close()
