"""The exceptions kernelexec raises.

User code failing is never an exception: it is an ``ExecutionResult`` with a non-zero exit code.
These are raised when kernelexec itself cannot do its job. Each also subclasses a built-in, so
callers can catch broadly::

    KernelExecError
    ├── BackendUnavailable          + RuntimeError
    │   ├── DockerUnavailable           no engine answers
    │   ├── DockerConfigError           Docker options the engine cannot honour (+ ValueError):
    │   │                               a bind_dir missing on the host, a container_name in use,
    │   │                               a runtime the engine does not know
    │   ├── ImageNotFound               the kernel image is not built
    │   ├── ForkUnsupported             a back end that cannot fork its kernel process
    │   └── GatewayUnavailable          a remote gateway is down or failing
    │       └── GatewayAuthError            wrong or missing token
    ├── KernelStartFailed           + RuntimeError
    ├── KernelDied                  + RuntimeError   (only when auto-restart is off)
    ├── RequestAborted              + RuntimeError   (the kernel refused kernelexec's own request
    │                                                twice: a file transfer, say)
    ├── ExecutorClosed              + RuntimeError
    ├── SessionBusy                 + RuntimeError   (fork / snapshot / restore while a block
    │                                                runs: refused, never queued)
    ├── SnapshotError               + ValueError     (restore of a released snapshot, or of one
    │                                                taken from another session)
    ├── ExecutorNotStarted          + RuntimeError, ValueError  (an adapter used before start(),
    │                                                where its peer refuses: autogen-ext)
    ├── ReentrantCall               + RuntimeError   (a sync front called from its own loop thread)
    ├── UnknownExecutor             + ValueError     (a name the executor registry does not know)
    ├── InvalidBlock                + ValueError     (bad filename, unsupported language on request)
    ├── InvalidPath                 + ValueError     (a files-API path outside the work dir)
    │   └── UnsafePath                  a path through a link the code planted, or naming a
    │                                   FIFO, socket or device: never followed, never read
    ├── FileTooLarge                + ValueError     (a file past the files API's size limit)
    ├── InvalidTimeout              + ValueError     (a timeout that is not a positive number)
    ├── InvalidNetworkPolicy        + ValueError     (an allowlist entry that is not a host)
    │   └── InvalidSecret               a secret with no value, a bad name, or a host the
    │                                   allowlist does not allow
    ├── InvalidWorkDir              + ValueError     (a work dir that is a file, or cannot be made)
    │   └── WorkDirNotFound             + FileNotFoundError: an adapter's work dir whose parent
    │                                   is missing (AG2 makes one folder, never a chain)
    ├── DangerousCommand            + ValueError     (a shell command refused by the AG2
    │                                                adapter, as AG2's sanitize_command does)
    ├── NotebookError               + ValueError     (corrupt notebook, missing kernelspec)
    ├── SessionError                + RuntimeError
    │   ├── SessionLimitReached
    │   ├── SessionExists               a session of that name is already open (+ ValueError)
    │   ├── SessionNotFound             unknown or culled session
    │   └── PoolExhausted               more kernels asked for than the pool's maximum
    ├── ExecutionTimeout            + TimeoutError   (a block ran out of time where the caller
    │   │                                            asked for an exception: the AutoGen adapter)
    │   └── JobNotFinished              a job's ``wait(timeout)`` gave up; the job runs on
    └── JobNotFound                 + KeyError       (a job id the MCP server does not know)

Errors from foreign libraries are translated in one place each, with ``raise ... from`` so the
original stays attached: the Docker SDK in ``backends/_docker.py`` (``translate_errors``), the
gateway's HTTP and WebSocket clients in ``backends/_gateway_errors.py``. jupyter_client's start
errors become ``KernelStartFailed`` in the back end that starts the kernel (``local_kernel.py``,
``docker_kernel.py``); zmq errors never leave a back end.
"""

from __future__ import annotations


class KernelExecError(Exception):
    """Base of every exception kernelexec raises."""


class BackendUnavailable(KernelExecError, RuntimeError):
    """A back end (Docker engine, gateway, interpreter) cannot be reached or used."""


class DockerUnavailable(BackendUnavailable):
    """No Docker engine answers."""


class DockerConfigError(BackendUnavailable, ValueError):
    """The Docker options cannot work with this engine: a ``bind_dir`` (or work dir) the engine's
    host does not have, a ``container_name`` already in use, a ``runtime`` the engine does not
    know. The message names the option."""


class ImageNotFound(BackendUnavailable):
    """The container image is not present locally."""


class ForkUnsupported(BackendUnavailable):
    """This back end cannot fork its kernel process (a sandboxed, container, gateway or
    provisioned kernel): ``fork()`` and live snapshots are for local and fork-server kernels."""


class GatewayUnavailable(BackendUnavailable):
    """A Kernel Gateway / Enterprise Gateway / Jupyter Server is down or answers with errors."""


class GatewayAuthError(GatewayUnavailable):
    """The gateway refused the token."""


class KernelStartFailed(KernelExecError, RuntimeError):
    """A kernel (or its container) did not start or never answered."""


class KernelDied(KernelExecError, RuntimeError):
    """The kernel died and the executor was told not to restart it."""


class RequestAborted(KernelExecError, RuntimeError):
    """The kernel refused (answered ``aborted``, ran nothing) a request of kernelexec's own (a
    remote file transfer, putting the kernel back in its work dir) twice, 0.2 s apart: ipykernel
    does so for a while after a request that failed with ``stop_on_error``. Nothing of it ran;
    trying again later is safe."""


class ExecutorClosed(KernelExecError, RuntimeError):
    """The executor was used after ``close()``."""


class SessionBusy(KernelExecError, RuntimeError):
    """``fork()``, ``snapshot()`` or ``restore()`` while a block runs in the session: refused at
    once (a block's half-done state is no state to branch from); call it after the block ends."""


class SnapshotError(KernelExecError, ValueError):
    """A snapshot that cannot be restored here: released, or taken from another session."""


class ExecutorNotStarted(KernelExecError, RuntimeError, ValueError):
    """An adapter was asked to run code before ``start()``, where its peer refuses to.

    autogen-ext's Jupyter executor raises ``RuntimeError`` and its Docker executor ``ValueError``
    in that case; this is both. The native executors start on first use instead.
    """


class ReentrantCall(KernelExecError, RuntimeError):
    """A synchronous front was called from its own event-loop thread (e.g. from a callback)."""


class UnknownExecutor(KernelExecError, ValueError):
    """An executor name the registry does not know; the message lists the valid names."""


class InvalidBlock(KernelExecError, ValueError):
    """A code block cannot be run as given (bad ``# filename:``, unsupported language)."""


class InvalidPath(KernelExecError, ValueError):
    """A path given to the files API is not a path inside the work dir."""


class UnsafePath(InvalidPath):
    """A work-dir path the host will not follow or read: a symbolic link on the way (the code
    in the work dir may have planted it to point out of it), or a FIFO, socket or device where a
    regular file was expected. Raised at once, with nothing written or read."""


class FileTooLarge(KernelExecError, ValueError):
    """A file is bigger than the files API's limit (for a remote kernel, the transfer limit)."""


class InvalidTimeout(KernelExecError, ValueError):
    """A timeout (to the constructor or to one call) that is not a positive finite number."""


class InvalidNetworkPolicy(KernelExecError, ValueError):
    """A ``network=`` setting kernelexec cannot enforce: an allowlist entry that is not a host
    name, address or ``*.`` wildcard (with an optional port), or a mode other than ``"none"``,
    ``"all"`` or a ``NetworkPolicy``. Raised at construction, before anything starts."""


class InvalidSecret(InvalidNetworkPolicy):
    """A ``Secret`` or ``secrets=`` entry kernelexec refuses: an empty or non-printable value,
    no hosts, a name that is not an environment variable's (or one kernelexec sets itself), or
    a host the policy's allowlist does not allow. Raised at construction; never shows the value."""


class InvalidWorkDir(KernelExecError, ValueError):
    """The work dir cannot be used: it is an existing file, or it cannot be created."""


class WorkDirNotFound(InvalidWorkDir, FileNotFoundError):
    """An adapter's work dir whose parent does not exist: the AG2 drop-ins make the folder
    itself, as AG2 does, never the folders above it."""


class DangerousCommand(KernelExecError, ValueError):
    """A shell command the AG2 adapter refuses before running anything of it, as AG2's
    ``LocalCommandLineCodeExecutor.sanitize_command`` does (``rm -rf``, ``dd``, ...)."""


class NotebookError(KernelExecError, ValueError):
    """A notebook cannot be read or run (corrupt file, kernelspec not installed)."""


class SessionError(KernelExecError, RuntimeError):
    """Base for pool and session-manager errors."""


class SessionLimitReached(SessionError):
    """The session manager already holds its maximum number of sessions."""


class SessionExists(SessionError, ValueError):
    """A session of that name is already open."""


class SessionNotFound(SessionError, KeyError):
    """No such session (never created, closed, or culled for being idle)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "session not found"


class PoolExhausted(SessionError):
    """The kernel pool is at its maximum size and has no kernel to give."""


class ExecutionTimeout(KernelExecError, TimeoutError):
    """A block ran past its timeout where the caller asked for an exception, not a result.

    The native API reports a timeout as a result (``timed_out``, exit 124); adapters whose peer
    raises ``TimeoutError`` (AutoGen's executors) raise this instead.
    """


class JobNotFinished(ExecutionTimeout):
    """``job.wait(timeout)`` returned before the job ended. The job is not touched: it keeps
    running (``peek()`` it, ``wait()`` again or ``cancel()`` it)."""


class JobNotFound(KernelExecError, KeyError):
    """No job with that id (never submitted here, or its session was closed)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "job not found"
