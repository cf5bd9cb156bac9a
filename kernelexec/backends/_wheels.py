"""The host's wheel cache: what makes a second session's ``packages=`` fast.

Decided so (the code inside is the enemy, so the cache is filled and checked on the host only):

* The cache is a folder of the host's user (``$KERNELEXEC_WHEEL_CACHE``, else
  ``$XDG_CACHE_HOME/kernelexec/wheels``, else ``~/.cache/kernelexec/wheels``; ``off`` disables
  it), never shown to the code. It holds wheels and ``MANIFEST.json``: each file's sha256, taken
  when the host downloaded it.
* Filled on the host: when a session's install cannot be met from the cache alone, the host's
  own pip downloads the requested specs (``pip download --only-binary=:all:``: no build step, so
  no package code runs on the host) from the index the host's pip uses, into a private folder,
  and each wheel enters the cache with its hash. Wheels are the host interpreter's; a target
  with another Python or libc ignores those that do not fit (pip's tag check) and falls back to
  the index through the proxy.
* Used through a session wheelhouse (``wheelhouse``): a folder kernelexec owns beside the egress
  proxy's socket, shown READ-ONLY to the container or sandbox, where each cache entry that was
  downloaded for one of the session's specs and whose content still has its recorded hash is
  copied; an entry whose content does not is never used (our check, not pip's: pip checks
  hashes only with ``--require-hashes``) and is dropped from the cache. pip installs with
  ``--no-index --find-links`` it first, and only when that fails does the host fill the cache
  and pip try again, the index reachable through the proxy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("kernelexec.egress")

#: where a container sees its session's wheelhouse (read-only)
CONTAINER_WHEELS = "/kernelexec-wheels"
MANIFEST = "MANIFEST.json"
#: seconds the host's ``pip download`` may take
DOWNLOAD_TIMEOUT = 600.0
_BLOCK = 1 << 20


def cache_root() -> Path | None:
    """The wheel cache's folder, or None when turned off (``KERNELEXEC_WHEEL_CACHE=off``)."""
    given = os.environ.get("KERNELEXEC_WHEEL_CACHE", "")
    if given.lower() in ("off", "0", "none"):
        return None
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernelexec" / "wheels"


class WheelCache:
    """The host's wheels and their hashes (see the module's note). Every method is the host's:
    nothing here reads a path the code can write."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True, mode=0o755)
        info = os.lstat(root)
        # Only a folder of this user that nobody else can write is trusted with the host's
        # downloads (a link or a shared folder could send them elsewhere or swap them).
        if (
            not stat.S_ISDIR(info.st_mode)
            or info.st_uid != os.getuid()
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            raise PermissionError(
                f"the wheel cache {root} is not a folder of this user that only it can write"
            )

    @classmethod
    def open(cls) -> WheelCache | None:
        """The configured cache, or None (off, or not usable: a warning says why)."""
        root = cache_root()
        if root is None:
            return None
        try:
            return cls(root)
        except OSError as exc:
            log.warning("kernelexec: no wheel cache (%s)", exc)
            return None

    def wheelhouse(self, dest: Path, specs: Sequence[str]) -> int:
        """Copy into ``dest`` (made 0755, files 0644, for a read-only mount) every entry
        downloaded for one of ``specs`` (not the whole cache) whose content still has its
        recorded hash; an entry that does not is dropped. The number there."""
        dest.mkdir(mode=0o755, exist_ok=True)
        os.chmod(dest, 0o755)
        wanted, copied = set(specs), 0
        with self._locked() as manifest:
            for name, entry in list(manifest.items()):
                if not wanted & set(entry.get("for", ())):
                    continue
                target = dest / name
                if target.exists() or self._copy_checked(name, entry.get("sha256", ""), target):
                    copied += 1
                    continue
                log.warning("kernelexec: wheel cache entry %s fails its hash; dropped", name)
                manifest.pop(name)
                with contextlib.suppress(OSError):
                    (self.root / name).unlink()
        return copied

    def fill(self, specs: Sequence[str], index_url: str) -> list[str]:
        """Download ``specs`` (and what they need) as wheels with the host's pip from
        ``index_url`` into the cache; the names added. A failed download adds nothing and is
        only logged: the install then goes to the index through the proxy. A direct reference
        (``name @ file:///...``, a URL or a path) is never fetched here: on the host it would
        read the host's files (or reach any server) with the host's rights."""
        if any(_direct(spec) for spec in specs):
            log.info("kernelexec: %s names a direct reference; not cached", list(specs))
            return []
        with tempfile.TemporaryDirectory(prefix="kernelexec-wheels-") as staging:
            argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
            argv += ["--dest", staging, "--index-url", index_url, "--", *specs]
            env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
            try:
                proc = subprocess.run(
                    argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, env=env
                )
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("kernelexec: the host's pip download failed (%s)", exc)
                return []
            if proc.returncode != 0:
                log.warning("kernelexec: the host's pip download failed: %s", proc.stderr[-2000:])
                return []
            return self._add(Path(staging), specs)

    # -- helpers -------------------------------------------------------------------------------
    def _add(self, staging: Path, specs: Sequence[str]) -> list[str]:
        added = []
        with self._locked() as manifest:
            for path in sorted(staging.iterdir()):
                if not path.name.endswith(".whl") or not path.is_file() or path.is_symlink():
                    continue
                digest = _sha256(path)
                temp = self.root / f".{path.name}.part"
                shutil.copyfile(path, temp, follow_symlinks=False)
                os.chmod(temp, 0o644)
                os.replace(temp, self.root / path.name)
                # what it was downloaded for: a later session asking for one of these gets it
                given = manifest.get(path.name, {}).get("for", [])
                manifest[path.name] = {"sha256": digest, "for": sorted({*given, *specs})}
                added.append(path.name)
        return added

    def _copy_checked(self, name: str, digest: str, target: Path) -> bool:
        """Copy the entry to ``target`` hashing what is copied (no gap between check and use)."""
        if "/" in name or name.startswith("."):
            return False
        source = self.root / name
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        partial = target.with_name(f".{name}.part")
        sha = hashlib.sha256()
        with os.fdopen(fd, "rb") as src, open(partial, "wb") as out:
            while block := src.read(_BLOCK):
                sha.update(block)
                out.write(block)
        if sha.hexdigest() != digest:
            partial.unlink()
            return False
        os.chmod(partial, 0o644)
        os.replace(partial, target)
        return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        """The manifest, under a lock (sessions fill the cache at once), written back after."""
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.root / MANIFEST
            try:
                manifest = json.loads(path.read_text())
                if not isinstance(manifest, dict):
                    manifest = {}
                manifest = {k: v for k, v in manifest.items() if isinstance(v, dict)}
            except (OSError, ValueError):
                manifest = {}
            before = dict(manifest)
            yield manifest
            if manifest != before:
                temp = path.with_name(f".{MANIFEST}.part")
                temp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
                os.replace(temp, path)


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as src:
        while block := src.read(_BLOCK):
            sha.update(block)
    return sha.hexdigest()


def _direct(spec: str) -> bool:
    """Whether a requirement names a place rather than a project and versions."""
    return any(mark in spec for mark in ("@", "/", "\\", ":"))
