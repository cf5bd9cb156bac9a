"""Kernels started by a jupyter_client kernel provisioner: Docker Swarm, Kubernetes, YARN, ...

The kernelspec names the provisioner (``metadata.kernel_provisioner``); gateway_provisioners
(the ``cluster`` extra) ships ones for Docker, Docker Swarm, Kubernetes, YARN and SSH hosts.
kernelexec does not schedule anything itself: the provisioner's launcher creates the service or
pod, the launcher inside it starts the kernel and reports its ports back, and interrupts go
through the provisioner's signal path (for gateway_provisioners, the launcher's listener).

Two loops are involved. Every provisioner in this process runs on one shared loop thread: the
provisioners keep one response socket per process (a singleton read by a callback on the loop
that made it, as in the servers they were written for), and some make blocking engine calls,
which must not stall an executor's loop. Each kernel's client lives on its executor's loop, as
for every other back end.

The kernel works on another machine: ``shares_work_dir`` is False, so the files API moves files
through the kernel, and rich outputs come back as outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from queue import Empty
from typing import Any, TypeVar

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager

from .._errors import BackendUnavailable, KernelStartFailed
from .._sync import Portal
from ._iopub import BatchingClient
from ._owner import LAUNCHER_LOG_PREFIX, OWNER_ENV, OWNER_LINE, owner_line, this_process
from ._ready import start_channels
from ._remote import refuse_shared_fork, setup_code
from .base import KernelBackend, KernelClientLike

log = logging.getLogger("kernelexec.provisioned")

_T = TypeVar("_T")

#: where jupyter_client looks provisioners up
PROVISIONER_GROUP = "jupyter_client.kernel_provisioners"
#: the provisioners gateway_provisioners registers, and what each needs
GP_PROVISIONERS = {
    "docker-swarm-provisioner": "a Docker engine in Swarm mode",
    "docker-provisioner": "a Docker engine",
    "kubernetes-provisioner": "a Kubernetes cluster (the k8s extra of gateway_provisioners)",
    "spark-operator-provisioner": "a Kubernetes cluster with the Spark operator",
    "yarn-provisioner": "a YARN resource manager (the yarn extra of gateway_provisioners)",
    "distributed-provisioner": "SSH access to the remote hosts",
}
CLUSTER_EXTRA_HINT = "pip install 'kernelexec[cluster]'"
SWARM_INIT_HINT = (
    "make this engine a Swarm manager: `docker swarm init --advertise-addr 127.0.0.1` "
    "(a single-node Swarm; no registry needed), or point DOCKER_HOST at a manager"
)
LAUNCHERS_HINT = "`kernelexec image build --offline --with-launchers`"

#: host variables the provisioner's launcher (a local process) needs to reach the engine; the
#: executor's own variables go too. Nothing else of the host's environment is passed on: the
#: Docker launcher copies its whole environment into the kernel's container.
LAUNCHER_HOST_VARS = (
    "PATH",
    "DOCKER_HOST",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "KUBECONFIG",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
)


@dataclass(frozen=True, kw_only=True)
class ProvisionedOptions:
    """How a ``ProvisionedKernel`` drives its provisioner (read once, when it is built)."""

    #: seconds the provisioner gets to stop the kernel politely before it is killed
    shutdown_wait: float = 5.0
    #: seconds one liveness or interrupt call to the provisioner may take
    call_timeout: float = 30.0
    #: host variables given to the provisioner's launcher (see ``LAUNCHER_HOST_VARS``)
    launcher_vars: tuple[str, ...] = LAUNCHER_HOST_VARS


# -- the provisioners' loop ----------------------------------------------------------------------
_portal: Portal | None = None
_portal_lock = threading.Lock()


def _provisioner_portal() -> Portal:
    global _portal
    with _portal_lock:
        if _portal is None or not _portal.running:
            _portal = Portal(name="kernelexec-provisioners")
        return _portal


async def _on_provisioner_loop(func: Callable[..., Awaitable[_T]], /, *args: Any) -> _T:
    """Run ``func(*args)`` on the provisioners' loop and await it from this one."""
    return await asyncio.wrap_future(_provisioner_portal().submit(func, *args))


# -- kernelspecs ---------------------------------------------------------------------------------
def provisioner_of(spec: KernelSpec) -> str:
    """The provisioner a kernelspec names (jupyter_client's default when it names none)."""
    config = (spec.metadata or {}).get("kernel_provisioner") or {}
    name = config.get("provisioner_name")
    return name if isinstance(name, str) and name else "local-provisioner"


def available_kernels(manager: KernelSpecManager | None = None) -> dict[str, str]:
    """Installed kernelspecs that name a provisioner other than the local one: name -> its
    provisioner."""
    manager = manager or KernelSpecManager()
    found: dict[str, str] = {}
    for name, entry in sorted(manager.get_all_specs().items()):
        config = (entry.get("spec", {}).get("metadata") or {}).get("kernel_provisioner") or {}
        provisioner = config.get("provisioner_name")
        if isinstance(provisioner, str) and provisioner and provisioner != "local-provisioner":
            found[name] = provisioner
    return found


def check_provisioner(kernel_name: str, provisioner: str) -> None:
    """``BackendUnavailable`` naming what to install when ``provisioner`` cannot be loaded."""
    entries = metadata.entry_points(group=PROVISIONER_GROUP, name=provisioner)
    where = f"kernelspec {kernel_name!r} uses the kernel provisioner {provisioner!r}"
    if not entries:
        what = "gateway_provisioners' " if provisioner in GP_PROVISIONERS else ""
        hint = CLUSTER_EXTRA_HINT if provisioner in GP_PROVISIONERS else "install its package"
        raise BackendUnavailable(f"{where}, which is not installed: {hint} ({what}provisioners)")
    try:
        with _random_state_kept():  # its modules reseed the global generator when imported
            next(iter(entries)).load()
    except ImportError as exc:
        raise BackendUnavailable(
            f"{where}, which cannot be loaded ({exc}): {CLUSTER_EXTRA_HINT}"
        ) from exc


def _check_hidden_spec(manager: KernelSpecManager, kernel_name: str) -> None:
    """``BackendUnavailable`` naming the package when ``kernel_name`` is installed but names a
    provisioner that is not (jupyter_client then reports no such kernel at all)."""
    folder = manager.find_kernel_specs().get(kernel_name.lower())
    if folder is None:
        return
    try:
        body = json.loads((Path(folder) / "kernel.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    config = (body.get("metadata") or {}).get("kernel_provisioner") or {}
    provisioner = config.get("provisioner_name")
    if isinstance(provisioner, str) and provisioner:
        check_provisioner(kernel_name, provisioner)


class _Specs(KernelSpecManager):
    """Serves the kernelspecs of ``base`` with the provisioner's launch timeout set to ours."""

    def __init__(self, base: KernelSpecManager, launch_timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._base, self._launch_timeout = base, launch_timeout

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        spec = self._base.get_kernel_spec(kernel_name)
        fields = spec.to_dict()
        meta = dict(fields.get("metadata") or {})
        config = dict(meta.get("kernel_provisioner") or {})
        settings = dict(config.get("config") or {})
        if _has_trait(provisioner_of(spec), "launch_timeout"):
            # The provisioner gives up (and removes what it created) on the executor's clock.
            settings["launch_timeout"] = max(1, int(self._launch_timeout))
            config["config"] = settings
            meta["kernel_provisioner"] = config
            fields["metadata"] = meta
        argv = list(fields.get("argv") or [])
        if argv and argv[0] in {"python", "python3"}:
            # The launcher runs here. jupyter_client maps a bare "python" to this interpreter,
            # but the remote provisioners build the command themselves: do it for them.
            argv[0] = sys.executable
            fields["argv"] = argv
        return KernelSpec(resource_dir=spec.resource_dir, **fields)


def _has_trait(provisioner: str, trait: str) -> bool:
    for entry in metadata.entry_points(group=PROVISIONER_GROUP, name=provisioner):
        with contextlib.suppress(Exception):
            return trait in entry.load().class_trait_names()
    return False


# -- the client ------------------------------------------------------------------------------
class _Client(BatchingClient):
    """The kernel's client, with IOPub read in batches (see ``_iopub``)."""


# -- the back end --------------------------------------------------------------------------------
class ProvisionedKernel(KernelBackend):
    """A kernel from the installed kernelspec ``kernel_name``, started by its provisioner.

    ``username`` is sent as ``KERNEL_USERNAME``; gateway_provisioners refuses ``root`` by
    default (``GP_UNAUTHORIZED_USERS``) and names the kernel's container after it.
    ``working_dir`` is the kernel's work dir on its machine (None: the executor's work dir
    path, made there if missing).
    """

    kind = "provisioned-kernel"
    inherits_host_env = False
    shares_work_dir = False

    def __init__(
        self,
        kernel_name: str,
        *,
        username: str | None = None,
        working_dir: str | None = None,
        options: ProvisionedOptions | None = None,
        kernel_spec_manager: KernelSpecManager | None = None,
    ) -> None:
        self.kernel_name = kernel_name
        self.username = username
        self.working_dir = working_dir
        self.options = options or ProvisionedOptions()
        self._specs = kernel_spec_manager
        self._km: AsyncKernelManager | None = None
        self._client: _Client | None = None
        self._cwd: str | None = None
        self._env: dict[str, str] = {}
        self._death: str | None = None
        self._log_path: str | None = None
        #: kernels whose service or pod could not be removed yet (see ``_stop``)
        self._orphans: list[AsyncKernelManager] = []

    @staticmethod
    def available_kernels() -> dict[str, str]:
        """Installed kernelspecs with a provisioner of their own: name -> provisioner name."""
        return available_kernels()

    @property
    def kernel_id(self) -> str | None:
        return None if self._km is None else self._km.kernel_id

    @property
    def provisioner(self) -> Any:
        """The provisioner instance of the current kernel (None when none runs)."""
        return None if self._km is None else self._km.provisioner

    # -- KernelBackend -------------------------------------------------------------------------
    @property
    def workspace(self) -> str | None:
        return self._cwd or self.working_dir

    def fresh_copy(self) -> ProvisionedKernel:
        """Another kernel from the same kernelspec (a fork made through a durable snapshot)."""
        refuse_shared_fork(self.kind, self.working_dir)
        return ProvisionedKernel(
            self.kernel_name,
            username=self.username,
            options=self.options,
            kernel_spec_manager=self._specs,
        )

    @property
    def client(self) -> KernelClientLike:
        if self._client is None:
            raise KernelStartFailed("the provisioned kernel is not running")
        return self._client

    async def start(self, *, work_dir: Path, env: Mapping[str, str], timeout: float) -> None:
        self._cwd = self.working_dir or str(work_dir)
        self._env = dict(env)
        await self._checks()
        await self._launch(timeout)

    async def interrupt(self) -> None:
        km = self._km
        if km is None:
            return
        with contextlib.suppress(Exception):  # a gone kernel is found by is_alive, not here
            await asyncio.wait_for(
                _on_provisioner_loop(km.interrupt_kernel), self.options.call_timeout
            )

    async def restart(self, *, timeout: float) -> None:
        # A new kernel (a new service or pod), not the provisioner's in-place restart: no
        # stale messages, and what the old one left is removed with it. The checks run again:
        # an engine that went away is reported as such, not as a launcher failure.
        await self._stop(now=True)
        await self._remove_orphans()
        await self._checks()
        await self._launch(timeout)

    async def _checks(self) -> None:
        spec = await asyncio.to_thread(self._spec)
        provisioner = provisioner_of(spec)
        await asyncio.to_thread(check_provisioner, self.kernel_name, provisioner)
        await asyncio.to_thread(preflight, provisioner, spec)

    async def _remove_orphans(self) -> None:
        orphans, self._orphans = self._orphans, []
        for km in orphans:
            if not await _on_provisioner_loop(_shutdown, km, True):
                self._orphans.append(km)

    async def is_alive(self) -> bool:
        km = self._km
        if km is None or self._death is not None:
            return False
        try:
            alive = await asyncio.wait_for(
                _on_provisioner_loop(km.is_alive), self.options.call_timeout
            )
        except Exception as exc:  # the engine itself is gone or failing: say so, do not hang
            self._death = f"its provisioner could not reach the cluster engine ({exc!r})"
            return False
        if not alive:
            self._death = "its container or pod is gone"
        return bool(alive)

    def death_reason(self) -> str | None:
        return self._death

    async def shutdown(self) -> None:
        await self._stop(now=False)
        await self._remove_orphans()
        if self._orphans:
            names = ", ".join(str(km.kernel_id) for km in self._orphans)
            log.warning("could not remove the service or pod of kernel(s) %s", names)

    # -- internals -------------------------------------------------------------------------------
    def _spec(self) -> KernelSpec:
        manager = self._specs or KernelSpecManager()
        try:
            return manager.get_kernel_spec(self.kernel_name)
        except NoSuchKernel:
            # jupyter_client hides a kernelspec whose provisioner is not installed: say which.
            _check_hidden_spec(manager, self.kernel_name)
            known = ", ".join(available_kernels(manager)) or "none installed"
            raise KernelStartFailed(
                f"no kernelspec named {self.kernel_name!r} (provisioned kernelspecs: {known})"
            ) from None

    def _launch_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in self.options.launcher_vars if k in os.environ}
        env.update(self._env)
        if self.username:
            env["KERNEL_USERNAME"] = self.username
        # The launcher copies its environment into the service it creates (labels cannot be
        # passed through it): `kernelexec gc` finds the service there once this process is gone.
        env[OWNER_ENV] = this_process().to_text()
        return env

    async def _launch(self, timeout: float) -> None:
        self._death = None
        specs = _Specs(self._specs or KernelSpecManager(), timeout)
        km = AsyncKernelManager(kernel_name=self.kernel_name, kernel_spec_manager=specs, log=log)
        km.shutdown_wait_time = self.options.shutdown_wait
        self._km = km
        fd, self._log_path = tempfile.mkstemp(prefix=LAUNCHER_LOG_PREFIX, suffix=".log")
        with contextlib.suppress(OSError):  # without it, gc cannot tell whose the log is
            os.write(fd, owner_line())  # `kernelexec gc` removes it once this process is gone
        try:
            # The launcher is a local process: its output goes to a log, never to our stdout.
            launch = asyncio.ensure_future(
                _on_provisioner_loop(_start_kernel, km, self._launch_env(), subprocess.DEVNULL, fd)
            )
            try:
                # The provisioner has its own launch timeout; this one is the backstop.
                done, _ = await asyncio.wait({launch}, timeout=timeout + 15)
                if not done:
                    launch.cancel()
                    with contextlib.suppress(BaseException):
                        await launch
                    raise KernelStartFailed(
                        f"the provisioner did not start kernel {self.kernel_name!r} "
                        f"within {timeout:g} s"
                    )
                launch.result()
            except PermissionError as exc:
                raise KernelStartFailed(
                    f"the provisioner refused to start the kernel: {exc} "
                    "(pass username= to ProvisionedKernel)"
                ) from exc
            except KernelStartFailed:
                raise
            except Exception as exc:
                raise KernelStartFailed(self._launch_failure(exc, timeout)) from exc
            finally:
                os.close(fd)
            await self._connect(km, timeout)
        except BaseException:
            await self._stop(now=True)
            raise

    def _launch_failure(self, exc: BaseException, timeout: float) -> str:
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, TimeoutError) or "launch timeout" in str(exc):
            text = f"the kernel did not report back within {timeout:g} s ({exc})"
        tail = _tail(self._log_path)
        detail = f"; the launcher said: {tail}" if tail else ""
        return f"the provisioned kernel {self.kernel_name!r} did not start: {text}{detail}"

    async def _connect(self, km: AsyncKernelManager, timeout: float) -> None:
        # A client of our own on this loop (the manager's lives on the provisioners' loop); the
        # key and signature scheme reach its session through load_connection_info only.
        kc = AsyncKernelClient()
        kc.load_connection_info(km.get_connection_info(session=False))
        self._client = _Client(kc)
        start_channels(kc)
        try:
            await asyncio.wait_for(kc.wait_for_ready(timeout=timeout), timeout + 5)
            await self._run_quietly(kc, setup_code(self._cwd, self._env), timeout)
        except (RuntimeError, asyncio.TimeoutError, Empty) as exc:
            raise KernelStartFailed(
                f"the provisioned kernel started but did not answer: {exc!r}"
            ) from exc

    @staticmethod
    async def _run_quietly(kc: AsyncKernelClient, code: str, timeout: float) -> None:
        msg_id = kc.execute(code, silent=True, store_history=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msg = await kc.get_shell_msg(timeout=max(0.0, deadline - loop.time()))
            if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
                continue
            content = msg.get("content", {})
            if content.get("status") != "ok":
                raise KernelStartFailed(f"kernel set-up failed: {content.get('evalue')}")
            return

    async def _stop(self, *, now: bool) -> None:
        client, self._client = self._client, None
        km, self._km = self._km, None
        log_path, self._log_path = self._log_path, None
        try:
            if client is not None:
                client.kc.stop_channels()
                with contextlib.suppress(Exception):
                    client.kc.context.destroy(linger=0)
            if km is not None and not await _on_provisioner_loop(_shutdown, km, now):
                # The engine did not answer (restarting, say): what the provisioner made is
                # removed on a later restart or close instead of being forgotten.
                self._orphans.append(km)
        finally:
            if log_path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(log_path)


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


def _steady_response_manager() -> None:
    """gateway_provisioners' response manager (a process-wide singleton) polls its socket with
    a tornado ``PeriodicCallback`` whose jitter draws from the global ``random`` generator on
    every tick, for the life of the process: a caller's seeded ``random`` sequence would change
    under it (seen: hypothesis refused to run beside it). Its period stays, without jitter."""
    module = sys.modules.get("gateway_provisioners.response_manager")
    manager_class = getattr(module, "ResponseManager", None)
    if manager_class is None or not manager_class.initialized():
        return
    processor = getattr(manager_class.instance(), "_connection_processor", None)
    if processor is not None and hasattr(processor, "jitter"):
        processor.jitter = 0


# -- on the provisioners' loop ------------------------------------------------------------------
async def _start_kernel(km: AsyncKernelManager, env: dict[str, str], stdout: Any, err: int) -> None:
    try:
        await km.start_kernel(env=env, stdout=stdout, stderr=err)
    finally:
        _steady_response_manager()


async def _shutdown(km: AsyncKernelManager, now: bool) -> bool:
    """Stop the kernel and have the provisioner remove what it created (service, pod); False
    when that could not be confirmed (the engine did not answer)."""
    provisioner = km.provisioner
    try:
        if km.has_kernel:
            await km.shutdown_kernel(now=now)
        elif provisioner is not None:
            # A launch that failed half-way: the provisioner may still hold a service or pod.
            await provisioner.kill()
            await provisioner.cleanup(restart=False)
        return True
    except Exception as exc:
        log.warning("stopping provisioned kernel %s: %r", km.kernel_id, exc)
        if provisioner is None:
            return False
        with contextlib.suppress(Exception):
            await provisioner.cleanup(restart=False)
        try:
            await provisioner.kill()
        except Exception:
            return False
        return True
    finally:
        _reap_launcher(provisioner)
        context = getattr(km, "context", None)
        if context is not None and not context.closed:
            context.destroy(linger=0)


def _reap_launcher(provisioner: Any) -> None:
    """Collect the provisioner's local launcher process (a failed launch leaves it unwaited)."""
    proc = getattr(provisioner, "local_proc", None)
    if not isinstance(proc, subprocess.Popen):
        return
    if proc.poll() is None:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _tail(path: str | None, lines: int = 3) -> str:
    if path is None:
        return ""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    said = [line.strip() for line in text.strip().splitlines() if not line.startswith(OWNER_LINE)]
    return " | ".join(said[-lines:])


# -- checks before a launch ------------------------------------------------------------------
def preflight(provisioner: str, spec: KernelSpec) -> None:
    """Fail early, saying what to do, where the provisioner itself would fail late or vaguely."""
    if provisioner not in {"docker-swarm-provisioner", "docker-provisioner"}:
        return
    from ._docker import call, find_image, make_client
    from ._docker_options import LABEL_LAUNCHERS, LABEL_RECIPE, DockerOptions

    config = ((spec.metadata or {}).get("kernel_provisioner") or {}).get("config") or {}
    image = config.get("image_name") or os.environ.get("GP_IMAGE_NAME")
    client = make_client(DockerOptions())
    try:
        if provisioner == "docker-swarm-provisioner":
            swarm = (call("docker info", client.info) or {}).get("Swarm") or {}
            if swarm.get("LocalNodeState") != "active":
                raise BackendUnavailable(
                    f"the Docker engine is not in Swarm mode: {SWARM_INIT_HINT}"
                )
            if not swarm.get("ControlAvailable"):
                raise BackendUnavailable(
                    "this Docker engine is a Swarm worker, not a manager: services can only be "
                    "created on a manager (point DOCKER_HOST at one)"
                )
        if not isinstance(image, str) or not image:
            return
        found = call("inspect", find_image, client, image)
        if found is None:
            # A multi-node Swarm pulls from a registry on each node; only a missing local
            # kernelexec image is certain to be a mistake here.
            if image.startswith("kernelexec/"):
                raise BackendUnavailable(
                    f"the kernel image {image!r} is not built: {LAUNCHERS_HINT}"
                )
            return
        labels = found.labels or {}
        if LABEL_RECIPE in labels and LABEL_LAUNCHERS not in labels:
            raise BackendUnavailable(
                f"the kernel image {image!r} has no kernel launchers, so its kernel could never "
                f"report back: build one with {LAUNCHERS_HINT} and name it in the kernelspec"
            )
    finally:
        client.close()
