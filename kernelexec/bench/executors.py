"""The executor rows: floors, kernelexec's executors and the optional peers.

Each row says whether it is stateful, which floor it is measured against, how to tell whether it
can run here (a reason when not: module missing, no Docker engine, image not built) and how to
open a session. Rows that cannot run are reported as unavailable with that reason; the rest run.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .._errors import BackendUnavailable
from .memory import pss_bytes, uss_bytes
from .names import DEFAULT_IMAGE as DEFAULT_IMAGE
from .names import EXECUTOR_NAMES as EXECUTOR_NAMES
from .names import GROUPS as GROUPS
from .sessions import (
    Ag2Session,
    AutogenSession,
    DockerCliSession,
    JupyterClientSession,
    KernelexecSession,
    PoolSession,
    Session,
    SubprocessSession,
    block_env,
    wait_for_idle,
)


@dataclass(frozen=True, kw_only=True)
class BenchContext:
    """Run-wide settings every row reads when it opens a session."""

    python: str = sys.executable
    image: str = DEFAULT_IMAGE
    timeout: float = 300.0


Opener = Callable[[BenchContext, Path, Any], Session]
"""(context, work dir, the row's shared resource or None) -> an open session."""
Shared = Callable[[BenchContext], AbstractContextManager[Any]]


@dataclass(frozen=True, kw_only=True)
class ExecutorSpec:
    name: str
    label: str
    group: str  # "floor" | "kernelexec" | "peer"
    stateful: bool
    check: Callable[[BenchContext], str | None]
    open: Opener
    floor: str | None = None  # the floor row this one is divided by
    workloads: tuple[str, ...] | None = None  # None: every workload
    max_blocks: int | None = None  # cap for slow rows (a container per block)
    docker: bool = False  # runs in the kernelexec image (it has numpy, pandas, matplotlib)
    shared: Shared | None = None  # made once per run before the row's first session (a pool)
    # the interpreter the row's code runs in, when not the bench's own (for the modules check)
    interpreter: Callable[[BenchContext], str | None] | None = None


def _import(module: str, attr: str) -> tuple[Any, str | None]:
    """(object, None) or (None, reason) for an optional import."""
    try:
        mod = importlib.import_module(module)
        return getattr(mod, attr), None
    except Exception as exc:  # optional peers fail in many ways (RuntimeError for extras)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, f"{module}.{attr} cannot be imported ({type(exc).__name__}: {first})"


def _needs(module: str, attr: str) -> Callable[[BenchContext], str | None]:
    return lambda ctx: _import(module, attr)[1]


@functools.lru_cache(maxsize=8)
def docker_problem(image: str) -> str | None:
    """Why Docker rows cannot run (no CLI, engine down, image missing), or None."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine answers ({exc})"
    if info.returncode != 0:
        return "no Docker engine answers (start dockerd, or see `docker info`)"
    image_ok = subprocess.run(
        ["docker", "image", "inspect", image],
        capture_output=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
    )
    if image_ok.returncode != 0:
        return f"image {image} is not built (run `kernelexec image build --offline`)"
    return None


def _all(*checks: Callable[[BenchContext], str | None]) -> Callable[[BenchContext], str | None]:
    def check(ctx: BenchContext) -> str | None:
        for c in checks:
            reason = c(ctx)
            if reason is not None:
                return reason
        return None

    return check


def _docker_check(ctx: BenchContext) -> str | None:
    return docker_problem(ctx.image)


@functools.lru_cache(maxsize=1)
def gvisor_problem() -> str | None:
    """Why the gVisor rows cannot run (the engine has no ``runsc`` runtime), or None."""
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{json .Runtimes}}"],
            capture_output=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker engine answers ({exc})"
    if b'"runsc"' not in info.stdout:
        return (
            "the Docker engine has no runtime 'runsc' (gVisor): install it (`apt install runsc`) "
            "and register it in /etc/docker/daemon.json (see the README's security section)"
        )
    return None


def _gvisor_check(ctx: BenchContext) -> str | None:
    return docker_problem(ctx.image) or gvisor_problem()


def _kernelspec_check(ctx: BenchContext) -> str | None:
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        return "no python3 kernelspec is installed"
    return None


def _never(ctx: BenchContext) -> str | None:
    return None


# -- openers ----------------------------------------------------------------------------------


def _registry_row(
    name: str, options: Callable[[BenchContext], dict[str, Any]] | None = None
) -> Opener:
    """Open kernelexec's executor ``name`` from the registry, as ``--executor name`` builds it."""

    def open_session(ctx: BenchContext, work: Path, shared: Any) -> Session:
        from .. import make_executor

        extra = options(ctx) if options is not None else {}
        return KernelexecSession(make_executor(name, work_dir=work, timeout=ctx.timeout, **extra))

    return open_session


def _python(ctx: BenchContext) -> dict[str, Any]:
    return {"python": ctx.python}


def _sandbox_check(ctx: BenchContext) -> str | None:
    """Why the bubblewrap rows cannot run here (None: they can)."""
    from ..backends._sandbox import check_sandbox

    try:
        check_sandbox()
    except BackendUnavailable as exc:
        return str(exc)
    return None


#: What the workloads import: the fork server imports it once, every forked kernel shares it.
WARM_UP = ("numpy", "pandas", "matplotlib.pyplot")


def _warm_up(ctx: BenchContext) -> dict[str, Any]:
    return {"warm_up": list(WARM_UP)}


def _warm_command(ctx: BenchContext) -> dict[str, Any]:
    return {**_python(ctx), **_warm_up(ctx)}


def _image(ctx: BenchContext) -> dict[str, Any]:
    return {"image": ctx.image}


def _gvisor(ctx: BenchContext) -> dict[str, Any]:
    return {"image": ctx.image, "runtime": "runsc"}


@contextmanager
def _pool(ctx: BenchContext) -> Iterator[Any]:
    from .. import KernelPool, PoolOptions

    pool = KernelPool(options=PoolOptions(min_size=1, max_size=2), timeout=ctx.timeout)
    try:
        wait_for_idle(pool, 120)
        yield pool
    finally:
        pool.close()


@contextmanager
def _fork_server(ctx: BenchContext) -> Iterator[None]:
    """The fork server, started before the row's first session: a session's start is a fork,
    as it is for every executor after the first in a process; the server's own start (imports
    of the warm-up list) is a one-off per process."""
    from .. import make_executor, stop_fork_servers

    with make_executor("fork-kernel", timeout=ctx.timeout, **_warm_up(ctx)) as ex:
        ex.execute("1")
    try:
        yield None
    finally:
        stop_fork_servers()


def hold_fork_kernels(ctx: BenchContext, count: int, root: Path) -> dict[str, Any]:
    """``count`` fork kernels held open at once, each answering a block that uses its own
    state, then asked again once all are up; their summed memory read while all are idle."""
    from .. import make_executor

    held: list[Any] = []
    figures: dict[str, Any] = {"sessions": count, "answered": 0}
    started = time.perf_counter()
    try:
        for i in range(count):
            ex = make_executor(
                "fork-kernel", work_dir=root / f"held{i}", timeout=ctx.timeout, **_warm_up(ctx)
            )
            held.append(ex)
            ex.execute(f"n = {i}")
        figures["answered"] = sum(
            ex.execute("n + 1").output == str(i + 1) for i, ex in enumerate(held)
        )
        figures["seconds_to_hold_all"] = time.perf_counter() - started
        figures.update(_held_memory([ex.backend.pid for ex in held]))
    except Exception as exc:  # reported in the targets table: how far it got, and why
        figures["error"] = f"after {len(held)} kernels: {type(exc).__name__}: {exc}"[:500]
    finally:
        for ex in held:
            ex.close()
    return figures


def _held_memory(pids: list[int]) -> dict[str, float]:
    uss = [uss_bytes(p) or 0 for p in pids]
    pss = [pss_bytes(p) or 0 for p in pids]
    return {
        "total_uss_mib": sum(uss) / 2**20,
        "total_pss_mib": sum(pss) / 2**20,
        "uss_per_session_mib": sum(uss) / 2**20 / max(1, len(pids)),
    }


def _open_pool(ctx: BenchContext, work: Path, shared: Any) -> Session:
    return PoolSession(shared)


def _open_ag2_command(ctx: BenchContext, work: Path, shared: Any) -> Session:
    from autogen.coding import LocalCommandLineCodeExecutor

    # AG2 runs ``python`` from PATH: its virtualenv option puts the bench's interpreter's folder
    # first, so the row runs the interpreter every other row runs (see ``_ag2_python_check``).
    venv = SimpleNamespace(bin_path=str(Path(ctx.python).parent), env_exe=ctx.python)
    return Ag2Session(
        LocalCommandLineCodeExecutor(
            work_dir=work, timeout=int(ctx.timeout), virtual_env_context=venv
        )
    )


def _same_interpreter(a: str, b: str) -> bool:
    """The same program in the same folder (a virtualenv's ``python`` and ``python3`` are two
    links to one interpreter; the folder is what makes it the virtualenv's)."""
    a, b = os.path.abspath(a), os.path.abspath(b)
    same_folder = os.path.dirname(a) == os.path.dirname(b)
    return a == b or (same_folder and os.path.realpath(a) == os.path.realpath(b))


def _ag2_python_check(ctx: BenchContext) -> str | None:
    """Not comparable when AG2's ``python`` would be another interpreter than the bench's."""
    path = os.pathsep.join((str(Path(ctx.python).parent), os.environ.get("PATH", "")))
    found = shutil.which("python", path=path)
    if found is None or not _same_interpreter(found, ctx.python):
        return (
            f"not comparable: AG2 runs `python` from PATH ({found or 'none found'}), "
            f"not this run's interpreter {ctx.python}"
        )
    return None


def kernel_gateway() -> str | None:
    """A ``jupyter-kernelgateway`` to serve AG2's Jupyter executor.

    ``KERNELEXEC_KERNEL_GATEWAY`` names one; else one on PATH; else the virtualenv that CI's
    gateway step makes at the checkout's root (``.venv-kg``: its jupyter_server pins must not
    touch kernelexec's environment).
    """
    named = os.environ.get("KERNELEXEC_KERNEL_GATEWAY")
    if named:
        return named if Path(named).exists() else None
    found = shutil.which("jupyter-kernelgateway")
    if found:
        return found
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidate = root / ".venv-kg" / "bin" / "jupyter-kernelgateway"
        if candidate.exists():
            return str(candidate)
    return None


@contextmanager
def _gateway_server(ctx: BenchContext) -> Iterator[Any]:
    """A Kernel Gateway on 127.0.0.1 with a token, stopped when the run ends."""
    from autogen.coding.jupyter import JupyterConnectionInfo

    gateway = kernel_gateway()
    assert gateway is not None
    token = secrets.token_hex(16)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [
        gateway, "--KernelGatewayApp.ip=127.0.0.1", f"--KernelGatewayApp.port={port}",
        "--KernelGatewayApp.port_retries=0", f"--KernelGatewayApp.auth_token={token}",
        "--JupyterWebsocketPersonality.list_kernels=True",
    ]  # fmt: skip
    # Its kernels run in the gateway's working directory: a folder of its own, not the
    # caller's (a plots block once left by_category.png in the checkout).
    home = tempfile.TemporaryDirectory(prefix="kernelexec-bench-kg-")
    server = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=home.name,
    )
    try:
        _wait_for_http(f"http://127.0.0.1:{port}/api", token, server, timeout=60)
        yield JupyterConnectionInfo(host="127.0.0.1", use_https=False, port=port, token=token)
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        home.cleanup()


def _wait_for_http(url: str, token: str, server: subprocess.Popen[bytes], timeout: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the kernel gateway exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(request, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise TimeoutError(f"the kernel gateway did not answer at {url}")


def _open_ag2_jupyter(ctx: BenchContext, work: Path, shared: Any) -> Session:
    from autogen.coding.jupyter import JupyterCodeExecutor

    executor = JupyterCodeExecutor(shared, output_dir=work, timeout=int(ctx.timeout))
    # The gateway's kernels start in its own directory, not the work dir.
    return Ag2Session(executor, closer=executor.stop, absolute_data=True)


def _open_autogen_command(ctx: BenchContext, work: Path, shared: Any) -> Session:
    from autogen_ext.code_executors.local import LocalCommandLineCodeExecutor

    return AutogenSession(LocalCommandLineCodeExecutor(work_dir=work, timeout=int(ctx.timeout)))


def _open_autogen_jupyter(ctx: BenchContext, work: Path, shared: Any) -> Session:
    from autogen_ext.code_executors.jupyter import JupyterCodeExecutor

    return AutogenSession(
        JupyterCodeExecutor(output_dir=work, timeout=int(ctx.timeout)),
        absolute_data=True,
        start_in=work,
    )


def _kernel_gateway_check(ctx: BenchContext) -> str | None:
    if kernel_gateway() is None:
        return (
            "AG2's Jupyter executor needs a jupyter-kernelgateway (on PATH, in .venv-kg, "
            "or named by KERNELEXEC_KERNEL_GATEWAY)"
        )
    if importlib.util.find_spec("websocket") is None:
        return "AG2's Jupyter executor needs websocket-client (pip install 'ag2[jupyter-executor]')"
    return None


def _kernel_gateway_python(ctx: BenchContext) -> str | None:
    gateway = kernel_gateway()
    return None if gateway is None else str(Path(gateway).with_name("python"))


SPECS: tuple[ExecutorSpec, ...] = (
    ExecutorSpec(
        name="subprocess",
        label="raw subprocess.run",
        group="floor",
        stateful=False,
        check=_never,
        open=lambda ctx, work, _: SubprocessSession(work, ctx.python),
    ),
    ExecutorSpec(
        name="jupyter-client",
        label="raw jupyter_client",
        group="floor",
        stateful=True,
        check=_kernelspec_check,
        open=lambda ctx, work, _: JupyterClientSession(work, ctx.timeout),
    ),
    ExecutorSpec(
        name="docker-exec",
        label="raw docker exec",
        group="floor",
        stateful=False,
        check=_docker_check,
        docker=True,
        open=lambda ctx, work, _: DockerCliSession(work, ctx.image, per_block=False),
    ),
    ExecutorSpec(
        name="docker-run",
        label="raw docker run --rm",
        group="floor",
        stateful=False,
        check=_docker_check,
        docker=True,
        workloads=("trivial",),
        max_blocks=5,
        open=lambda ctx, work, _: DockerCliSession(work, ctx.image, per_block=True),
    ),
    ExecutorSpec(
        name="command",
        label="kernelexec command",
        group="kernelexec",
        stateful=False,
        check=_never,
        open=_registry_row("command", _python),
        floor="subprocess",
    ),
    ExecutorSpec(
        name="warm-command",
        label="kernelexec warm command",
        group="kernelexec",
        stateful=False,
        check=_never,
        open=_registry_row("warm-command", _warm_command),
        floor="subprocess",
    ),
    ExecutorSpec(
        name="kernel",
        label="kernelexec kernel",
        group="kernelexec",
        stateful=True,
        check=_needs("kernelexec", "KernelExecutor"),
        open=_registry_row("kernel"),
        floor="jupyter-client",
    ),
    ExecutorSpec(
        name="fork-kernel",
        label="kernelexec fork kernel",
        group="kernelexec",
        stateful=True,
        check=_needs("kernelexec", "ForkKernel"),
        open=_registry_row("fork-kernel", _warm_up),
        shared=_fork_server,
        floor="jupyter-client",
    ),
    ExecutorSpec(
        name="sandboxed-command",
        label="kernelexec sandboxed command (bubblewrap)",
        group="kernelexec",
        stateful=False,
        check=_sandbox_check,
        open=_registry_row("sandboxed-command"),
        floor="command",
    ),
    ExecutorSpec(
        name="sandboxed-kernel",
        label="kernelexec sandboxed kernel (bubblewrap)",
        group="kernelexec",
        stateful=True,
        check=_sandbox_check,
        open=_registry_row("sandboxed-kernel"),
        floor="kernel",
    ),
    ExecutorSpec(
        name="docker-command",
        label="kernelexec docker command",
        group="kernelexec",
        stateful=False,
        docker=True,
        floor="docker-exec",
        open=_registry_row("docker-command", _image),
        check=_all(_needs("kernelexec", "DockerCommand"), _docker_check),
    ),
    ExecutorSpec(
        name="docker-kernel",
        label="kernelexec docker kernel",
        group="kernelexec",
        stateful=True,
        docker=True,
        floor="kernel",
        open=_registry_row("docker-kernel", _image),
        check=_all(
            _needs("kernelexec", "KernelExecutor"),
            _needs("kernelexec", "DockerKernel"),
            _docker_check,
        ),
    ),
    ExecutorSpec(
        name="gvisor-command",
        label="kernelexec docker command under gVisor (runsc)",
        group="kernelexec",
        stateful=False,
        docker=True,
        floor="docker-command",
        open=_registry_row("docker-command", _gvisor),
        check=_all(_needs("kernelexec", "DockerCommand"), _gvisor_check),
    ),
    ExecutorSpec(
        name="gvisor-kernel",
        label="kernelexec docker kernel under gVisor (runsc)",
        group="kernelexec",
        stateful=True,
        docker=True,
        floor="docker-kernel",
        open=_registry_row("docker-kernel", _gvisor),
        check=_all(
            _needs("kernelexec", "KernelExecutor"),
            _needs("kernelexec", "DockerKernel"),
            _gvisor_check,
        ),
    ),
    ExecutorSpec(
        name="pool",
        label="kernelexec pooled kernel",
        group="kernelexec",
        stateful=True,
        check=_needs("kernelexec", "KernelPool"),
        open=_open_pool,
        shared=_pool,
        floor="kernel",
    ),
    ExecutorSpec(
        name="ag2-command",
        label="AG2 LocalCommandLineCodeExecutor",
        group="peer",
        stateful=False,
        floor="subprocess",
        open=_open_ag2_command,
        check=_all(_needs("autogen.coding", "LocalCommandLineCodeExecutor"), _ag2_python_check),
    ),
    ExecutorSpec(
        name="ag2-jupyter",
        label="AG2 JupyterCodeExecutor",
        group="peer",
        stateful=True,
        floor="jupyter-client",
        open=_open_ag2_jupyter,
        shared=_gateway_server,
        interpreter=_kernel_gateway_python,
        check=_all(_needs("autogen.coding.jupyter", "JupyterCodeExecutor"), _kernel_gateway_check),
    ),
    ExecutorSpec(
        name="autogen-command",
        label="autogen-ext LocalCommandLineCodeExecutor",
        group="peer",
        stateful=False,
        floor="subprocess",
        open=_open_autogen_command,
        check=_needs("autogen_ext.code_executors.local", "LocalCommandLineCodeExecutor"),
    ),
    ExecutorSpec(
        name="autogen-jupyter",
        label="autogen-ext JupyterCodeExecutor",
        group="peer",
        stateful=True,
        floor="jupyter-client",
        open=_open_autogen_jupyter,
        check=_needs("autogen_ext.code_executors.jupyter", "JupyterCodeExecutor"),
    ),
)


def spec_named(name: str) -> ExecutorSpec:
    for spec in SPECS:
        if spec.name == name:
            return spec
    raise ValueError(f"unknown executor: {name} (valid: {', '.join(EXECUTOR_NAMES)})")


def select_specs(names: Sequence[str] | None, *, with_floors: bool = True) -> list[ExecutorSpec]:
    """The rows to run, in table order; ``names`` may use the group names too.

    Unknown names raise ``ValueError`` listing the valid ones. The floors the chosen rows are
    measured against are added, so every ratio has its denominator from the same run.
    """
    if not names or "all" in names:
        return list(SPECS)
    valid = (*EXECUTOR_NAMES, *GROUPS, "all")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"unknown executor(s): {', '.join(unknown)} (valid: {', '.join(valid)})")
    chosen = {
        s.name for s in SPECS if s.name in names or any(GROUPS.get(n) == s.group for n in names)
    }
    if with_floors:
        pending = list(chosen)
        while pending:
            floor = spec_named(pending.pop()).floor
            if floor is not None and floor not in chosen:
                chosen.add(floor)
                pending.append(floor)
    return [s for s in SPECS if s.name in chosen]


def missing_modules(python: str, modules: Sequence[str]) -> list[str]:
    """Which of ``modules`` the interpreter ``python`` cannot import (one quick process)."""
    if not modules:
        return []
    probe = (
        "import importlib.util, sys\n"
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    proc = subprocess.run(
        [python, "-c", probe, *modules],
        capture_output=True,
        timeout=60,
        env=block_env(),
        stdin=subprocess.DEVNULL,
    )
    return proc.stdout.decode().split()
