"""A bubblewrap sandbox around a local process: no network, a read-only host, a writable work dir.

``bwrap`` (Debian's ``bubblewrap``) runs a command in new namespaces: the host's file system
bound read-only, the work dir (and a kernel's runtime dir) writable, a private size-bounded
``/tmp``, chosen paths hidden, no network unless asked, a pid namespace of its own (when the
sandbox's first process ends, every process in it ends), ``--die-with-parent``, and only the
environment variables the executor was given. This module builds the command line and checks
that the host can run it; the local back ends put it in front of what they start.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import BackendUnavailable

#: Paths hidden by default: where credentials usually live.
DEFAULT_HIDE = (
    "~/.ssh",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.docker",
    "~/.gnupg",
    "~/.kube",
    "~/.netrc",
    "~/.pypirc",
)
#: Host variables a process needs to work at all; none is a secret. Everything else it gets
#: comes from the executor's own ``env``.
BASE_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")


@dataclass(frozen=True, kw_only=True)
class SandboxOptions:
    """How a local back end is sandboxed (``sandbox=True`` means these defaults)."""

    network: bool = False
    hide: Sequence[str] = DEFAULT_HIDE
    writable: Sequence[str] = ()
    tmp_size: int = 256 * 1024 * 1024  # bytes of the private /tmp


def sandbox_options(value: bool | SandboxOptions | None) -> SandboxOptions | None:
    """``sandbox=`` as given to a back end: True for the defaults, False/None for none."""
    if value is None or value is False:
        return None
    if value is True:
        return SandboxOptions()
    if isinstance(value, SandboxOptions):
        return value
    raise TypeError(f"sandbox= takes True, False or SandboxOptions, not {type(value).__name__}")


def bwrap_argv(
    options: SandboxOptions,
    argv: Sequence[str],
    *,
    work_dir: Path,
    env: Mapping[str, str],
    writable: Sequence[str | Path] = (),
) -> list[str]:
    """``argv`` run inside a sandbox whose only writable places are ``work_dir``,
    ``writable`` and the options' own; ``env`` is the whole environment it sees (plus
    ``BASE_ENV`` from the host)."""
    out = [bwrap_path(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    out += ["--size", str(options.tmp_size), "--tmpfs", "/tmp"]
    for path in _under_tmp(_interpreter_roots(argv[0] if argv else sys.executable)):
        out += ["--ro-bind", path, path]  # a virtualenv in /tmp stays visible (read-only)
    for path in _existing(options.hide):
        out += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
    for place in [work_dir, *writable, *options.writable]:
        resolved = str(Path(os.path.expanduser(str(place))).resolve())
        out += ["--bind", resolved, resolved]
    out += ["--unshare-all", "--die-with-parent", "--new-session"]
    if options.network:
        out.append("--share-net")
    out.append("--clearenv")
    for name, value in _environment(env).items():
        out += ["--setenv", name, value]
    out += ["--chdir", str(work_dir.resolve()), "--", *argv]
    return out


def _interpreter_roots(python: str) -> list[str]:
    """Where an interpreter's files live: its environment (a virtualenv's root) and the real
    installation behind it, and this process's own (kernelexec's host interpreter)."""
    exe = Path(shutil.which(python) or python)
    roots = {exe.parent.parent, exe.resolve().parent.parent}
    roots |= {Path(sys.prefix), Path(sys.base_prefix)}
    return sorted(str(r) for r in roots if r.is_dir())


def _under_tmp(paths: Sequence[str]) -> list[str]:
    """The paths the private ``/tmp`` would hide."""
    return [p for p in paths if p == "/tmp" or p.startswith("/tmp/")]


def _existing(paths: Sequence[str]) -> list[str]:
    expanded = (str(Path(os.path.expanduser(p)).resolve()) for p in paths)
    return [p for p in expanded if os.path.lexists(p)]


def _environment(env: Mapping[str, str]) -> dict[str, str]:
    base = {name: os.environ[name] for name in BASE_ENV if name in os.environ}
    return {**base, "HOME": "/tmp", **env}


def bwrap_path() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise BackendUnavailable(
            "the sandbox needs bubblewrap, which is not installed "
            "(Debian/Ubuntu: apt install bubblewrap; Fedora: dnf install bubblewrap)"
        )
    return found


def check_sandbox() -> None:
    """Raise ``BackendUnavailable`` unless this host can run a sandbox."""
    _probe(bwrap_path())


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str) -> None:
    """Run one empty sandbox (once per bwrap binary and process: a success is kept)."""
    argv = [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--", "true"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        detail = proc.stderr.strip() or f"exit status {proc.returncode}"
        raise BackendUnavailable(
            f"bubblewrap cannot create a sandbox here ({detail}); the host may forbid user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1, or run in a container "
            "that allows them)"
        )
