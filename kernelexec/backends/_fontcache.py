"""Matplotlib's font list, built once per interpreter on the host and handed to every sandbox.

A sandbox starts with an empty ``/tmp`` (a command's blocks) or an empty runtime folder (a
kernel), so matplotlib inside built its font list again on every first import: 2 to 5 s, and a
"Matplotlib is building the font cache" line in the block's output that the code never printed.

The host builds the list once per interpreter, by running that interpreter's own matplotlib
(``python -I``: the interpreter and its packages are the host's, shown read-only in the
sandbox) with its cache folder in kernelexec's cache, ``$XDG_CACHE_HOME/kernelexec/matplotlib``
(else ``~/.cache/...``), a folder of this user that nobody else can write. Nothing a sandbox
writes is ever read back into it: a sandbox gets a read-only copy (bound into its private
``/tmp``, or copied into a kernel's runtime folder before the kernel starts), so one session
cannot plant fonts for the next. Matplotlib names the file after its font-list version and
rebuilds on its own when the file does not fit, as it would with no list at all.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

#: ``KERNELEXEC_FONT_CACHE=off``: no list is built or handed to a sandbox
ENV_VAR = "KERNELEXEC_FONT_CACHE"
#: matplotlib's cache folder inside a sandbox whose blocks share a private ``/tmp``
SANDBOX_FOLDER = "/tmp/.kernelexec-matplotlib"
_BUILD = "import matplotlib.font_manager"
_BUILD_TIMEOUT = 120.0


def font_lists(python: str) -> list[Path]:
    """The font-list files of ``python``'s matplotlib, built now when missing; none when it has
    no matplotlib, the build failed, or the cache is off (a failure is never an error: the
    sandbox builds its own, as before)."""
    if os.environ.get(ENV_VAR, "").lower() in ("off", "0", "none"):
        return []
    return list(_built(_folder_for(python), python))


def copy_into(folder: str | os.PathLike[str], python: str) -> None:
    """Put ``python``'s font lists into ``folder`` (a kernel's matplotlib folder, made by the
    host and not yet given to the sandbox)."""
    for source in font_lists(python):
        shutil.copyfile(source, os.path.join(folder, source.name))


def _root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernelexec" / "matplotlib"


def _folder_for(python: str) -> Path:
    """One folder per interpreter (its real path, and its matplotlib's when it is this one)."""
    return _root() / _key(python)


@functools.cache
def _key(python: str) -> str:
    """Worked out once per process: a sandboxed command asks before every block."""
    real = os.path.realpath(shutil.which(python) or python)
    return hashlib.sha256(f"{real}\0{_matplotlib_stamp(real)}".encode()).hexdigest()[:16]


def _matplotlib_stamp(real: str) -> str:
    """This interpreter's matplotlib, where it can be told without importing it: an upgrade
    then gets a folder of its own (another interpreter's upgrade is matplotlib's to notice)."""
    import importlib.util
    import sys

    if real != os.path.realpath(sys.executable):
        return ""
    with contextlib.suppress(Exception):
        spec = importlib.util.find_spec("matplotlib")
        if spec is not None and spec.origin:
            return f"{spec.origin}:{os.stat(spec.origin).st_mtime_ns}"
    return ""


#: folder -> its font lists, once known (an interpreter without matplotlib: none, not asked
#: again); a failure that may pass (a timeout on a loaded machine) is not remembered
_KNOWN: dict[Path, tuple[Path, ...]] = {}


def _built(folder: Path, python: str) -> tuple[Path, ...]:
    """The font lists in ``folder``, built into it first when it has none."""
    if folder in _KNOWN:
        return _KNOWN[folder]
    if not _trusted_parent():
        return ()
    found = _lists(folder) or _build(folder, python)
    if found is not None:
        _KNOWN[folder] = found
    return found or ()


def _build(folder: Path, python: str) -> tuple[Path, ...] | None:
    """Build into a private folder, then rename it into place (two hosts building at once:
    the first one's stays). None: it failed, and may not the next time."""
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=_root()))
    try:
        env = {"MPLCONFIGDIR": str(building), "PATH": os.environ.get("PATH", os.defpath)}
        done = subprocess.run(
            [python, "-I", "-c", _BUILD],
            env=env,
            capture_output=True,
            timeout=_BUILD_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            return () if b"ModuleNotFoundError" in done.stderr else None
        with contextlib.suppress(OSError):  # another host process was first: its list will do
            os.rename(building, folder)
        return _lists(folder) or None
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _lists(folder: Path) -> tuple[Path, ...]:
    try:
        return tuple(sorted(p for p in folder.glob("fontlist-*.json") if p.is_file()))
    except OSError:
        return ()


def _trusted_parent() -> bool:
    """The cache's folder exists, is this user's, and nobody else can write it."""
    root = _root()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.lstat(root)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )
