"""A bubblewrap sandbox around a local process: no network, no host rights, a writable work dir.

``bwrap`` (Debian's ``bubblewrap``) runs a command in new namespaces: the host's file system
bound read-only, the work dir (and a kernel's runtime dir) writable, a private size-bounded
``/tmp``, homes, runtime dirs (engine and daemon sockets) and chosen paths hidden, no network
unless asked, a pid namespace of its own (when the sandbox's first process ends, every process
in it ends), ``--die-with-parent``, and only the environment variables the executor was given.

Whoever runs it, the code holds no host right. A host running as root starts two bwraps: the
outer one, as root, builds the file system view (root can reach every path it binds, a private
folder or ``/root`` included) and the namespaces; inside it, ``setpriv`` becomes an unprivileged
host user (``host_uid``, nobody by default) and the inner one, as that user, gives the code a
user namespace of its own (uid 1000 inside, ``host_uid`` outside), every capability dropped, no
further user namespace, no new privileges. A host running as another user runs one bwrap, as
that user (bwrap drops every capability of a sandbox whose uid is not 0). This module builds the
command line, gives the sandbox's user its writable folders, and checks that the host can run it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import BackendUnavailable
from .._network import NetworkPolicy, NetworkSetting, check_network
from ._fontcache import SANDBOX_FOLDER as FONT_FOLDER
from ._fontcache import font_lists

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
#: Hidden whatever ``hide`` says: every user's home (secrets under permissive modes are common
#: there), the runtime dirs, where engine and daemon sockets live (docker.sock, containerd,
#: dbus), and the host's cgroup tree (it names the host's containers and lists the pids of
#: other jails). The interpreter and the work dir are bound back when they live under one.
ALWAYS_HIDE = ("/root", "/home", "/run", "/var/run", "/sys/fs/cgroup")
#: Host files seen empty inside (already unreadable to the sandbox's user: belt and braces).
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
#: Host variables a process needs to work at all; none is a secret. Everything else it gets
#: comes from the executor's own ``env``.
BASE_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TERM")
#: Who the code is inside its user namespace when the host is root (the Docker back end's user).
SANDBOX_UID = SANDBOX_GID = 1000
#: nobody: the host user that owns no file and holds no right.
NOBODY = 65534

# Run by the host's own interpreter where setpriv (util-linux) is missing: become the
# unprivileged user (every capability goes with uid 0), then run the rest of the command line.
_DROP = (
    "import os, sys; os.setgroups([]); os.setgid(int(sys.argv[2])); "
    "os.setuid(int(sys.argv[1])); os.execv(sys.argv[3], sys.argv[3:])"
)


@dataclass(frozen=True, kw_only=True)
class SandboxOptions(NetworkSetting):
    """How a local back end is sandboxed (``sandbox=True`` means these defaults).

    ``readable``: host paths shown read-only although under a hidden place (a package folder
    under a home, say). ``host_uid``/``host_gid``: the host user the code runs as when the host
    is root (never 0); the work dir and the ``writable`` folders are given to it (their owner
    changes, not their contents').
    """

    #: ``"none"`` (the default), ``"all"`` (the host's network) or a ``NetworkPolicy``: no
    #: network, and the host-side egress proxy on the sandbox's loopback (``backends/_egress``).
    #: ``False``/``True`` are the old spellings of ``"none"``/``"all"``.
    network: bool | str | NetworkPolicy = False
    hide: Sequence[str] = DEFAULT_HIDE
    writable: Sequence[str] = ()
    readable: Sequence[str] = ()
    tmp_size: int = 256 * 1024 * 1024  # bytes of the private /tmp (and of /dev/shm)
    host_uid: int = NOBODY
    host_gid: int = NOBODY

    def __post_init__(self) -> None:
        check_network(self.network)
        if self.host_uid <= 0 or self.host_gid <= 0:
            raise ValueError("host_uid and host_gid must name an unprivileged user (not 0)")


def sandbox_options(value: bool | SandboxOptions | None) -> SandboxOptions | None:
    """``sandbox=`` as given to a back end: True for the defaults, False/None for none."""
    if value is None or value is False:
        return None
    if value is True:
        return SandboxOptions()
    if isinstance(value, SandboxOptions):
        return value
    raise TypeError(f"sandbox= takes True, False or SandboxOptions, not {type(value).__name__}")


def host_is_root() -> bool:
    return hasattr(os, "getuid") and os.getuid() == 0


def take_back(folder: str, *files: str) -> None:
    """Take ``folder`` (one the host made in a place the code cannot rename, given to the
    sandbox's user while a kernel started in it) back: the host's, entered but not written
    (0711), and ``files`` in it the host's too (never through a link planted in their place).
    What the code then holds open it keeps; it can no longer remove, rename or replace anything
    there. On a host that is not root the sandbox's user is the host's: only the mode changes."""
    if host_is_root():
        os.chown(folder, 0, 0)
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                os.chown(os.path.join(folder, name), 0, 0, follow_symlinks=False)
    os.chmod(folder, 0o711)


def give_to_sandbox(
    path: str | os.PathLike[str], options: SandboxOptions, *, also: Sequence[str] = ()
) -> None:
    """Let the sandbox's user write to ``path`` (and ``also``), folders the root host made: it
    becomes their owner. Only the folder itself: what is already inside keeps its owner (and
    stays readable). Files the code makes there belong to that user; the root host reads them
    all the same."""
    if not host_is_root():
        return
    for place in [os.fspath(path), *(os.path.expanduser(p) for p in also)]:
        try:
            st = os.stat(place)
            if (st.st_uid, st.st_gid) != (options.host_uid, options.host_gid):
                os.chown(place, options.host_uid, options.host_gid)
        except OSError as exc:  # a file system without owners (vfat), root squashed (NFS)
            raise BackendUnavailable(
                f"cannot give {place} to the sandbox's user {options.host_uid}: "
                f"{exc.strerror or exc}"
            ) from exc


def bwrap_argv(
    options: SandboxOptions,
    argv: Sequence[str],
    *,
    work_dir: Path,
    env: Mapping[str, str],
    writable: Sequence[str | Path] = (),
    readable: Sequence[str | Path] = (),
    files: Mapping[str, str] = {},
    as_root: Sequence[str] = (),
    fonts: str | None = None,
) -> list[str]:
    """``argv`` run inside a sandbox whose only writable places are ``work_dir``,
    ``writable`` and the options' own; ``readable`` are shown read-only (the egress proxy's
    folder); ``env`` is the whole environment it sees (plus ``BASE_ENV`` from the host).
    ``files``: host file -> the path it is shown at, read-only (the egress resolver's
    resolv.conf). ``as_root``: a command prefix run before the rights are dropped, when the
    host is root (the egress DNS responder's port 53), else left out. ``fonts``: the
    interpreter whose matplotlib font lists the sandbox gets, read-only in a folder of its own
    in ``/tmp`` (``_fontcache``), unless ``env`` names a matplotlib folder itself."""
    bwrap, root = bwrap_path(), host_is_root()
    work = _real(work_dir)
    places = [work, *(_real(p) for p in [*writable, *options.writable])]
    hidden = _hidden(options)
    shown = _shown(options, argv[0] if argv else sys.executable, env)
    shown += [_real(p) for p in readable]
    out = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    out += ["--perms", "1777", "--size", str(options.tmp_size), "--tmpfs", "/tmp"]
    # the sandbox's user writes shared memory too, within the same bound as /tmp
    out += ["--perms", "1777", "--size", str(options.tmp_size), "--tmpfs", "/dev/shm"]
    lists = font_lists(fonts) if fonts and "MPLCONFIGDIR" not in env else []
    if lists:  # matplotlib writes beside them (1777, as /tmp); the lists are only read
        out += ["--perms", "1777", "--dir", FONT_FOLDER]
        out += [a for f in lists for a in ("--ro-bind", str(f), f"{FONT_FOLDER}/{f.name}")]
        env = {**env, "MPLCONFIGDIR": FONT_FOLDER}
    if root:
        # A folder only root may enter (0700) around a bound path: the sandbox's user could not
        # reach the path through it, so an empty one takes its place and the path is bound in.
        hidden += _private_parents([*places, *shown], ["/tmp", *hidden])
    for path in hidden:
        out += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
    covered = ["/tmp", *hidden]
    for path in MASKED_FILES:
        if os.path.isfile(path) and not _under(path, covered):
            out += ["--ro-bind", "/dev/null", path]
    for path in _outermost(p for p in shown if _under(p, covered)):
        out += _bind("--ro-bind", path, covered)  # an interpreter in /tmp or a home stays visible
    for place in places:
        out += _bind("--bind", place, covered)
    for source, target in files.items():
        out += ["--ro-bind", source, target]
    out += _namespaces(options, root)
    out += ["--die-with-parent", "--new-session", "--clearenv"]
    for name, value in _environment(env).items():
        out += ["--setenv", name, value]
    out += ["--chdir", work, "--"]
    if root:
        out += [*as_root, *_drop_privileges(options), *_inner(bwrap, chdir=work)]
    return [*out, *argv]


def _bind(how: str, path: str, covered: Sequence[str]) -> list[str]:
    """Bind ``path`` at its own place. Under an empty folder, its parents are made first with
    ``--dir`` (0755: the sandbox's user passes through them), not by the bind (0700)."""
    parent = os.path.dirname(path)
    made = ["--dir", parent] if _under(parent, covered) and parent not in covered else []
    return [*made, how, path, path]


def _namespaces(options: SandboxOptions, root: bool) -> list[str]:
    if not root:
        # --unshare-all includes a user namespace where bwrap can make one (not setuid)
        return ["--unshare-all", *(["--share-net"] if options.full_network else [])]
    # No user namespace in the outer sandbox: as root bwrap would map the sandbox to host root.
    out = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    return out if options.full_network else [*out, "--unshare-net"]


def _drop_privileges(options: SandboxOptions) -> list[str]:
    """The command line prefix that runs the rest as the unprivileged host user."""
    uid, gid = str(options.host_uid), str(options.host_gid)
    setpriv = _setpriv()
    if setpriv is not None:
        return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    return [sys.executable, "-I", "-S", "-c", _DROP, uid, gid]


def _setpriv() -> str | None:
    return shutil.which("setpriv")


def _inner(bwrap: str, *, chdir: str) -> list[str]:
    """The inner bwrap, run as the unprivileged user: a user namespace of its own (uid 1000
    inside), no capability, and no new user namespace for the code (where bwrap can forbid it).
    It sees the outer sandbox's whole view, devices included."""
    out = [bwrap, "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    out += ["--cap-drop", "ALL", *_no_more_userns(bwrap), "--dev-bind", "/", "/"]
    return [*out, "--die-with-parent", "--chdir", chdir, "--"]


def _no_more_userns(bwrap: str) -> list[str]:
    return ["--disable-userns"] if "--disable-userns" in _bwrap_help(bwrap) else []


@functools.lru_cache(maxsize=4)
def _bwrap_help(bwrap: str) -> str:
    proc = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30)
    return proc.stdout + proc.stderr


def _real(path: str | os.PathLike[str]) -> str:
    return str(Path(os.path.expanduser(str(path))).resolve())


def _under(path: str, places: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in places)


def _outermost(paths: Iterable[str]) -> list[str]:
    """The paths none of the others contains, sorted."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not _under(path, kept):
            kept.append(path)
    return kept


def _hidden(options: SandboxOptions) -> list[str]:
    """The places the sandbox sees empty: always-hidden ones and the options' (resolved, so a
    link to a secret hides the secret; ``/var/run`` is ``/run``)."""
    wanted = [p for p in (_real(p) for p in [*ALWAYS_HIDE, *options.hide]) if os.path.lexists(p)]
    return [p for p in _outermost(wanted) if p != "/"]


def _shown(options: SandboxOptions, program: str, env: Mapping[str, str]) -> list[str]:
    """What must stay visible (read-only) even under a hidden place: the interpreter's
    installation, the options' ``readable``, ``PYTHONPATH``'s folders, and with a network the
    resolver's configuration (``/etc/resolv.conf`` often links into ``/run``)."""
    paths = [*_interpreter_roots(program), *(_real(p) for p in options.readable)]
    paths += [_real(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    if options.full_network:
        paths.append(_real("/etc/resolv.conf"))
    return [p for p in paths if os.path.exists(p)]


def _private_parents(paths: Sequence[str], covered: Sequence[str]) -> list[str]:
    """The outermost folders above ``paths`` that others may not enter (no ``o+x``) and that
    no hidden place already replaces."""
    found: list[str] = []
    for path in paths:
        for parent in reversed(Path(path).parents[:-1]):  # from the top, "/" left out
            folder = str(parent)
            if _under(folder, [*covered, *found]):
                break
            if not _others_may_enter(folder):
                found.append(folder)
                break
    return found


def _others_may_enter(folder: str) -> bool:
    try:
        return bool(os.stat(folder).st_mode & 0o001)
    except OSError:  # missing: bwrap says so, naming the path
        return True


def _interpreter_roots(python: str) -> list[str]:
    """Where an interpreter's files live: its environment (a virtualenv's root) and the real
    installation behind it, and this process's own (kernelexec's host interpreter)."""
    exe = Path(shutil.which(python) or python)
    roots = {exe.parent.parent, exe.resolve().parent.parent}
    roots |= {Path(sys.prefix), Path(sys.base_prefix)}
    return sorted(str(r) for r in roots if r.is_dir())


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
    """Run one empty sandbox (once per bwrap binary and process: a success is kept), as the
    back ends do: a root host's drops to the unprivileged user in a user namespace."""
    argv = [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--", "true"]
    if host_is_root():
        options = SandboxOptions()
        argv = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        argv += [*_namespaces(options, True), "--die-with-parent", "--chdir", "/", "--"]
        argv += [*_drop_privileges(options), *_inner(bwrap, chdir="/"), "true"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        detail = proc.stderr.strip() or f"exit status {proc.returncode}"
        raise BackendUnavailable(
            f"bubblewrap cannot create a sandbox here ({detail}); the host may forbid user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1, or run in a container "
            "that allows them)"
        )
