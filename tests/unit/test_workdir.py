"""The work dir: ``# filename:`` parsing, paths that must stay inside, change detection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernelexec import InvalidBlock, InvalidPath
from kernelexec._workdir import (
    INTERNAL_DIR,
    Snapshot,
    confine,
    filename_from_code,
    folder_option,
    resolve_inside,
)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("# filename: app.py\nprint(1)", "app.py"),
        ("#filename:pkg/mod.py\n", "pkg/mod.py"),
        ("\n\n# filename: a b.py  \nx", "a b.py"),
        ("# FILENAME: up.py", "up.py"),
        ("// filename: main.js", "main.js"),
        ("# app.py\nprint(1)", None),  # the literal prefix is required
        ("# file: app.py", None),
        ("print(1)\n# filename: late.py", None),  # only the first line counts
        ("", None),
    ],
)
def test_filename_from_code(code: str, expected: str | None) -> None:
    assert filename_from_code(code) == expected


def test_resolve_inside_accepts_nested_paths(tmp_path: Path) -> None:
    assert resolve_inside(tmp_path, "a/b/c.py") == tmp_path.resolve() / "a" / "b" / "c.py"
    assert resolve_inside(tmp_path, "a/../b.py") == tmp_path.resolve() / "b.py"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../evil.py", "escapes the work dir"),
        ("a/../../evil.py", "escapes the work dir"),
        ("/etc/evil.py", "relative to the work dir"),
        ("~/evil.py", "relative to the work dir"),
        (".", "work dir itself"),
        ("a\x00b", "invalid filename"),
        ("", "invalid filename"),
    ],
)
def test_resolve_inside_refuses(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(InvalidBlock, match=message):
        resolve_inside(tmp_path / "work", name)


def test_symlinked_dir_pointing_outside_is_refused(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidBlock, match="escapes"):
        resolve_inside(work, "link/evil.py")


def test_symlinked_file_pointing_outside_is_refused(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "out.py").symlink_to(tmp_path / "target.py")
    with pytest.raises(InvalidBlock, match="escapes"):
        resolve_inside(work, "out.py")


def test_symlink_that_stays_inside_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    assert resolve_inside(tmp_path, "alias/x.py") == tmp_path.resolve() / "real" / "x.py"


def test_snapshot_reports_new_and_modified_files_only(tmp_path: Path) -> None:
    (tmp_path / "same.txt").write_text("same")
    (tmp_path / "grows.txt").write_text("a")
    (tmp_path / "touched.txt").write_text("abc")
    (tmp_path / "gone.txt").write_text("x")
    before = Snapshot.take(tmp_path)

    (tmp_path / "grows.txt").write_text("ab")
    st = (tmp_path / "touched.txt").stat()
    os.utime(tmp_path / "touched.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "sub" / "deep" / "new.csv").write_text("1,2")
    after = Snapshot.take(tmp_path)

    assert after.changed_since(before) == ["grows.txt", "sub/deep/new.csv", "touched.txt"]


def test_snapshot_skips_internal_files_caches_and_symlinks(tmp_path: Path) -> None:
    before = Snapshot.take(tmp_path)
    (tmp_path / INTERNAL_DIR / "output").mkdir(parents=True)
    (tmp_path / INTERNAL_DIR / "output" / "block-1.txt").write_text("spilled")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.pyc").write_bytes(b"\0")
    (tmp_path / "code.py").write_text("print(1)")
    (tmp_path / "link").symlink_to(tmp_path / "code.py")
    after = Snapshot.take(tmp_path, skip={"code.py"})
    assert after.changed_since(before) == []


def test_snapshot_of_missing_dir_is_empty(tmp_path: Path) -> None:
    assert Snapshot.take(tmp_path / "missing").entries == {}


@pytest.mark.parametrize("value", ["../out", "/abs/out", "~/out", "a/../../b", "x\x00y", ""])
def test_folder_option_refuses_places_outside_the_work_dir(value: str) -> None:
    with pytest.raises(InvalidPath, match="must be a folder inside the work dir"):
        folder_option(value, "outputs_dir")


def test_folder_option_accepts_folders_and_the_root_only_when_asked() -> None:
    assert folder_option(None, "code_dir") is None
    assert folder_option("a/b/", "outputs_dir") == "a/b"
    assert folder_option(".", "code_dir", allow_root=True) == "."
    with pytest.raises(InvalidPath):
        folder_option(".", "outputs_dir")


def test_confine_names_what_was_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidPath, match=r"^path escapes the work dir"):
        confine(tmp_path, "../x")
    assert confine(tmp_path, ".", allow_root=True) == tmp_path.resolve()
    with pytest.raises(InvalidBlock, match=r"^filename names the work dir itself"):
        resolve_inside(tmp_path, ".")


# -- the dangerous-command guard-rail (issue 32.5) ---------------------------------------------


def test_guard_reads_ag2s_patterns_and_a_kernels_shell_lines() -> None:
    from kernelexec._guard import dangerous_command, shell_part

    assert dangerous_command("ls -la") is None
    assert dangerous_command("rm -rf /") == "Use of 'rm -rf' command is not allowed."
    assert dangerous_command(":(){ :|:& };:") == "Fork bombs are not allowed."
    assert shell_part("x = 1\n  !rm -rf /\n", "python") == "rm -rf /"
    assert shell_part("%%bash\nrm -rf /\n", "python") == "rm -rf /\n"
    assert shell_part("rm -rf /", "powershell") == ""
