"""Durable snapshots of a kernel session: one signed file, restorable in a fresh kernel.

The file: ``MAGIC``, then an HMAC-SHA256 of the rest under the user's snapshot key, then a zip
archive holding ``manifest.json`` (Python version, back end kind, kernelspec, every name with
its fate), one pickle per saved name (``ns/N.pkl``, cloudpickle: functions and classes defined
in the session are saved by value) and the work dir's regular files (``work/...``).

A snapshot is code (unpickling runs it), so a file is read only after its signature checks out
with the key: a truncated, altered or unsigned file is ``SnapshotError`` before anything in it
is parsed. The host never unpickles: the pickles go back into the new kernel, which loads them.
A snapshot written by another Python version (pickles of its objects are not portable) is refused
too. The key is a key file the user controls (``key=``, ``$KERNELEXEC_SNAPSHOT_KEY``, or one made
at ``~/.config/kernelexec/snapshot.key`` on first use, mode 0600), not a kernel's session key,
which ends with its kernel: a snapshot resumed tomorrow, or on another machine, needs the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._door import Door
from ._errors import InvalidPath, SnapshotError, UnsafePath
from ._files import KernelFiles
from ._workdir import INTERNAL_DIR

MAGIC = b"KXSNAP1\n"
_SIG = 32
_KEY_ENV = "KERNELEXEC_SNAPSHOT_KEY"
_MIN_KEY = 16
_CHUNK = 1 << 20

#: what a name's entry says
SAVED, RESTORED, IMPORT, NOT_RESTORABLE = "saved", "restored", "import", "not restorable"


@dataclass(frozen=True, kw_only=True)
class SnapshotManifest:
    """What a durable snapshot holds, name by name: ``names[name]`` is ``"saved"`` /
    ``"restored"``, ``"import"`` (a module, imported again), or ``"not restorable: why"``
    (an open socket, a generator, a lock...). Nothing is silently missing."""

    path: Path
    python: tuple[int, int, int]
    kind: str
    kernel_name: str | None
    names: dict[str, str] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)
    files: int = 0

    @property
    def not_restorable(self) -> dict[str, str]:
        """The names that did not (or will not) come back, each with why."""
        return {k: v for k, v in self.names.items() if v.startswith(NOT_RESTORABLE)}


def snapshot_key(key: bytes | str | os.PathLike[str] | None) -> bytes:
    """The signing key: bytes as given, or a key file's contents; None: the user's default key
    file, made (32 random bytes, mode 0600) if missing."""
    if isinstance(key, (bytes, bytearray)):
        data = bytes(key)
    else:
        path = Path(key) if key is not None else default_key_path()
        if key is None and not path.exists():
            _make_key(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SnapshotError(f"cannot read the snapshot key file {path}: {exc}") from exc
    if len(data) < _MIN_KEY:
        raise SnapshotError(f"a snapshot key is at least {_MIN_KEY} bytes")
    return data


def default_key_path() -> Path:
    env = os.environ.get(_KEY_ENV)
    return Path(env) if env else Path.home() / ".config" / "kernelexec" / "snapshot.key"


def _make_key(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))


# -- kernel side (sent as source, run in a private module of the kernel) ----------------------
KERNEL_CODE = r"""
import json, os, pickle, re, sys, types

from IPython import get_ipython

_IPYTHON = re.compile(r"^(_+|_i+\d*|_\d+|_oh|_ih|_dh|In|Out|exit|quit|get_ipython|_kx\w*)$")


def save(folder):
    os.makedirs(folder, exist_ok=True)
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    shell = get_ipython()
    hidden = shell.user_ns_hidden
    names, n = {}, 0
    for name, value in list(shell.user_ns.items()):
        if _IPYTHON.match(name) or (name in hidden and hidden[name] is value):
            continue
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            names[name] = {"status": "import", "module": value.__name__}
            continue
        if cloudpickle is None:
            names[name] = {"status": "not restorable", "why": "cloudpickle is not installed"}
            continue
        try:
            data = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            why = f"{type(value).__name__}: {type(exc).__name__}: {exc}"[:300]
            names[name] = {"status": "not restorable", "why": why}
            continue
        n += 1
        with open(os.path.join(folder, f"{n}.pkl"), "wb") as f:
            f.write(data)
        names[name] = {"status": "saved", "file": f"{n}.pkl"}
    return json.dumps({"python": list(sys.version_info[:3]), "names": names})


def load(folder, names):
    import importlib

    ns, done = get_ipython().user_ns, {}
    for name, entry in json.loads(names).items():
        try:
            if entry["status"] == "import":
                ns[name] = importlib.import_module(entry["module"])
            elif entry["status"] == "saved":
                with open(os.path.join(folder, entry["file"]), "rb") as f:
                    ns[name] = pickle.load(f)
            else:
                continue
            done[name] = "restored"
        except Exception as exc:
            done[name] = f"not restorable: {type(exc).__name__}: {exc}"[:300]
    return json.dumps(done)


def version():
    return json.dumps(list(sys.version_info[:3]))


def has_cloudpickle():
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        return json.dumps(False)
    return json.dumps(True)


class _Shipped:
    # Serves modules from source text sent by the host: the last finder on sys.meta_path, so
    # an installed copy always wins; pickles that name cloudpickle's helpers import them here.
    def __init__(self, sources):
        self.sources = sources

    def find_spec(self, name, path=None, target=None):
        import importlib.util

        if name not in self.sources:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=self.sources[name][1])

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        exec(compile(self.sources[name][0], "<kernelexec: " + name + ">", "exec"), module.__dict__)


def ship(sources):
    sys.meta_path.append(_Shipped(json.loads(sources)))
    import cloudpickle  # noqa: F401

    return json.dumps(True)


def files(root):
    # The work dir's regular files (kernelexec's own folder skipped; links never followed)
    found = []
    for top, dirs, names in os.walk(root):
        rel = os.path.relpath(top, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != ".kernelexec"]
        for name in names:
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(os.path.normpath(os.path.join(rel, name)))
    return json.dumps(found)


def drop(folder):
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    return json.dumps(True)


def empty(root):
    # Everything in the work dir but kernelexec's own folder (a link removed as a link)
    import shutil

    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name == ".kernelexec":
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    return json.dumps(True)
"""
KERNEL_MODULE = "_kx_durable"


def kernel_call(call: str) -> tuple[str, str]:
    """The silent cell loading the kernel-side code into its own module, and the expression
    calling ``call`` (e.g. ``save('folder')``) in it."""
    cell = (
        "(lambda m: (m.__dict__.update(__builtins__=__import__('builtins')),"
        f" exec(compile({KERNEL_CODE!r}, '<kernelexec snapshot>', 'exec'), m.__dict__),"
        f" __import__('sys').modules.__setitem__({KERNEL_MODULE!r}, m)))"
        f"(__import__('types').ModuleType({KERNEL_MODULE!r}))\n"
    )
    return cell, f"__import__('sys').modules[{KERNEL_MODULE!r}].{call}"


# -- host side ---------------------------------------------------------------------------------
def cloudpickle_sources() -> str | None:
    """cloudpickle's own modules as source text (it is pure Python), as JSON ``{module:
    [source, is_package]}``, for a kernel that does not have it; None if the host lacks it too."""
    spec = importlib.util.find_spec("cloudpickle")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    sources: dict[str, tuple[str, bool]] = {}
    for file in sorted(folder.glob("*.py")):
        package = file.name == "__init__.py"
        name = "cloudpickle" if package else f"cloudpickle.{file.stem}"
        sources[name] = (file.read_text(encoding="utf-8"), package)
    return json.dumps(sources)


def write(
    path: Path,
    key: bytes,
    *,
    saved: dict[str, Any],
    pickles: Door,
    folder: str,
    work: Door,
    kind: str,
    kernel_name: str | None,
) -> SnapshotManifest:
    """Write the signed file atomically (a temp file beside it, renamed into place)."""
    names: dict[str, dict[str, Any]] = saved["names"]
    manifest = {
        "python": saved["python"],
        "kind": kind,
        "kernel_name": kernel_name,
        "names": names,
    }
    path = path.absolute()
    fd, temp = tempfile.mkstemp(prefix=".kx-snapshot-", dir=path.parent)
    files = 0
    try:
        with os.fdopen(fd, "w+b") as out:
            out.write(MAGIC + bytes(_SIG))
            with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                for entry in names.values():
                    if entry["status"] == SAVED:
                        rel, name = f"{folder}/{entry['file']}", f"ns/{entry['file']}"
                        with (
                            pickles.open_regular(rel) as (src, _),
                            archive.open(name, "w", force_zip64=True) as dst,
                        ):
                            shutil.copyfileobj(src, dst, _CHUNK)
                files = _add_work_dir(archive, work)
                manifest["files"] = files
                archive.writestr("manifest.json", json.dumps(manifest))
            out.seek(len(MAGIC) + _SIG)
            mac = _mac(key, out)
            out.seek(len(MAGIC))
            out.write(mac)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return _manifest(path, manifest)


def _add_work_dir(archive: zipfile.ZipFile, work: Door) -> int:
    count = 0
    for rel, entry in work.walk(
        skip=lambda r: r == INTERNAL_DIR or r.startswith(INTERNAL_DIR + "/")
    ):
        if not entry.is_file:
            continue  # folders come with their files; links and FIFOs are never followed
        try:
            with (
                work.open_regular(rel) as (src, _),
                archive.open(f"work/{rel}", "w", force_zip64=True) as dst,
            ):
                shutil.copyfileobj(src, dst, _CHUNK)
            count += 1
        except (OSError, InvalidPath):
            continue
    return count


def _mac(key: bytes, f: Any) -> bytes:
    digest = hmac.new(key, digestmod=hashlib.sha256)
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return digest.digest()


# -- a kernel on another machine: the files move through the kernel ----------------------------
async def fetch_remote(
    files: KernelFiles, saved: dict[str, Any], folder: str, work: list[str], mirror: Door
) -> None:
    """Copy a remote kernel's pickles (in ``folder``) and work dir files (``work``, as listed
    by the kernel) into ``mirror``, a local folder ``write`` then reads as it reads a local
    work dir. Every path the kernel names is confined to the mirror; a work file that cannot
    be read (gone, a FIFO) is skipped, as it is on the host's own disk."""
    for entry in saved["names"].values():
        if entry["status"] == SAVED:
            await _fetch_one(files, f"{folder}/{entry['file']}", mirror)
    for rel in work:
        if rel == INTERNAL_DIR or rel.startswith(INTERNAL_DIR + "/"):
            continue
        with contextlib.suppress(OSError, InvalidPath, UnsafePath):
            await _fetch_one(files, rel, mirror)


async def _fetch_one(files: KernelFiles, rel: str, mirror: Door) -> None:
    with mirror.replacing(rel) as dst:
        await files.fetch(rel, dst)


async def send_remote(files: KernelFiles, mirror: Door) -> None:
    """Copy every regular file of ``mirror`` (``_unpack``'s output) into the remote kernel's
    work dir, at the same relative paths."""
    for rel, entry in mirror.walk():
        if entry.is_file:
            with mirror.open_regular(rel) as (src, _):
                await files.send(src, rel)


class Verified:
    """A snapshot file whose signature checked out: a private copy, read from here on."""

    def __init__(self, path: Path, key: bytes) -> None:
        self._dir = tempfile.mkdtemp(prefix="kernelexec-resume-")
        self.copy = Path(self._dir) / "snapshot"
        try:
            self._verify(Path(path), key)
            self.archive = zipfile.ZipFile(self.copy)
            self.manifest = json.loads(self.archive.read("manifest.json"))
        except SnapshotError:
            self.close()
            raise
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            self.close()
            raise SnapshotError(f"{path} is not a readable snapshot: {exc}") from exc

    def _verify(self, path: Path, key: bytes) -> None:
        try:
            with open(path, "rb") as src, open(self.copy, "wb") as dst:
                head = src.read(len(MAGIC) + _SIG)
                if len(head) < len(MAGIC) + _SIG or not head.startswith(MAGIC):
                    raise SnapshotError(f"{path} is not a kernelexec snapshot (or is truncated)")
                digest = hmac.new(key, digestmod=hashlib.sha256)
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
        except OSError as exc:
            raise SnapshotError(f"cannot read the snapshot {path}: {exc}") from exc
        if not hmac.compare_digest(digest.digest(), head[len(MAGIC) :]):
            raise SnapshotError(
                f"{path}: the signature does not match (altered, truncated, or signed with "
                "another key): nothing in it was read"
            )

    def result(self, path: Path, fates: dict[str, str]) -> SnapshotManifest:
        return _manifest(path, self.manifest, fates)

    def close(self) -> None:
        archive = getattr(self, "archive", None)
        if archive is not None:
            archive.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _manifest(
    path: Path, raw: dict[str, Any], fates: dict[str, str] | None = None
) -> SnapshotManifest:
    names: dict[str, str] = {}
    imports: dict[str, str] = {}
    for name, entry in raw["names"].items():
        status = entry["status"]
        if status == IMPORT:
            imports[name] = entry["module"]
        if status == NOT_RESTORABLE:
            names[name] = f"{NOT_RESTORABLE}: {entry.get('why', '')}"
        elif fates is not None:
            names[name] = fates.get(name, f"{NOT_RESTORABLE}: not loaded")
        else:
            names[name] = IMPORT if status == IMPORT else SAVED
    major, minor, micro = [*raw["python"], 0, 0, 0][:3]
    return SnapshotManifest(
        path=Path(path),
        python=(int(major), int(minor), int(micro)),
        kind=str(raw.get("kind", "")),
        kernel_name=raw.get("kernel_name"),
        names=names,
        imports=imports,
        files=int(raw.get("files", 0)),
    )
