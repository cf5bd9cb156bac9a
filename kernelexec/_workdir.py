"""The work dir: safe paths inside it, and which files a block created or changed."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ._door import OWN_DIR, Door
from ._errors import InvalidBlock, InvalidPath, KernelExecError

#: kernelexec's own files (spilled output, saved notebooks' scratch) live here
INTERNAL_DIR = OWN_DIR

# The literal prefix is required: any other first-line comment is just a comment.
_FILENAME_RE = re.compile(r"^\s*(?:#|//|--|%|;|rem\s)\s*filename:\s*(\S.*?)\s*$", re.IGNORECASE)

# Walking a huge work dir on every block would cost more than the block; past this many
# entries the scan stops and changes beyond it are not reported.
MAX_SCAN_ENTRIES = 20_000


def filename_from_code(code: str) -> str | None:
    """The path named by a first line ``# filename: path``, if there is one."""
    first = code.lstrip("\n").split("\n", 1)[0]
    match = _FILENAME_RE.match(first)
    return match.group(1) if match else None


def check_relative(
    relative: str, *, what: str = "path", error: type[KernelExecError] = InvalidPath
) -> None:
    """The lexical half of ``confine``, for a work dir on another machine (a gateway kernel)."""
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise error(f"invalid {what}: {relative!r}")
    if os.path.isabs(relative) or relative.startswith("~"):
        raise error(f"{what} must be relative to the work dir: {relative}")


def confine(
    root: Path,
    relative: str,
    *,
    what: str = "path",
    error: type[KernelExecError] = InvalidPath,
    allow_root: bool = False,
) -> Path:
    """``relative`` resolved under ``root``; refuse anything that lands outside it.

    The one check behind every path a caller names inside a work dir (a block's
    ``# filename:``, the files API, the MCP tools). Symlinks are resolved, so a link inside the
    work dir pointing out of it is refused too. ``what`` and ``error`` only shape the message.
    """
    check_relative(relative, what=what, error=error)
    base = root.resolve()
    try:
        target = (base / relative).resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before 3.13), ELOOP
        raise error(f"{what} goes through a symbolic link loop: {relative}") from exc
    if target != base and base not in target.parents:
        raise error(f"{what} escapes the work dir: {relative}")
    if target == base and not allow_root:
        raise error(f"{what} names the work dir itself: {relative}")
    return target


def resolve_inside(work_dir: Path, relative: str) -> Path:
    """Where a block's ``# filename:`` points, or ``InvalidBlock``."""
    return confine(work_dir, relative, what="filename", error=InvalidBlock)


def folder_option(value: str | None, what: str, *, allow_root: bool = False) -> str | None:
    """A folder option naming a place inside the work dir (checked before the dir exists).

    Lexical only: the work dir may not exist yet when an executor is built; the paths written
    there later go through ``confine``.
    """
    if value is None:
        return None
    path = Path(value)
    if "\x00" in value or path.is_absolute() or value.startswith("~") or ".." in path.parts:
        raise InvalidPath(f"{what} must be a folder inside the work dir: {value!r}")
    if not path.parts and not allow_root:
        raise InvalidPath(f"{what} must be a folder inside the work dir: {value!r}")
    return path.as_posix() if path.parts else value


@dataclass(frozen=True)
class Snapshot:
    """(mtime_ns, size) of every file under the work dir, skipping kernelexec's own."""

    entries: dict[str, tuple[int, int]]

    @classmethod
    def take(cls, root: Path, *, skip: Iterable[str] = ()) -> Snapshot:
        """Walked through the work dir's door: folders entered by descriptor, so a folder the
        code swaps for a link mid-walk is not followed out (links are never files here)."""
        skipped = {INTERNAL_DIR, *skip}
        entries: dict[str, tuple[int, int]] = {}

        def pruned(rel: str) -> bool:
            return rel in skipped or rel.rsplit("/", 1)[-1] == "__pycache__"

        try:
            with Door(root) as door:
                for rel, entry in door.walk(skip=pruned):
                    if entry.is_file:
                        entries[rel] = (entry.mtime_ns, entry.size)
                        if len(entries) >= MAX_SCAN_ENTRIES:
                            break
        except (OSError, KernelExecError):
            pass  # no work dir (yet, or any more): nothing to report
        return cls(entries)

    def changed_since(self, before: Snapshot) -> list[str]:
        """Relative paths that are new or whose mtime/size differ, sorted."""
        return sorted(
            rel for rel, stamp in self.entries.items() if before.entries.get(rel) != stamp
        )
