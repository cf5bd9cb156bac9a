"""``# filename:`` that tries to leave the work dir: ``..``, absolute paths, and symlinks made by
the host or by a block itself (in a container, a link to ``/x`` inside means the host's ``/x``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kx_adversarial import ALL, backends

pytestmark = pytest.mark.usefixtures("nothing_left")


def _refused(ex: Any, code: str) -> None:
    r = ex.execute(code)
    assert not r.ok and r.error is not None and r.error.ename == "InvalidBlock", r.output
    assert "refused" in r.output, r.output
    assert r.stdout == ""  # the block itself did not run


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside every work dir; nothing may ever be written into it."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
@pytest.mark.parametrize("name", ["../escape.py", "a/../../escape.py", "{outside}/abs.py"])
def test_traversal_is_refused(ex: Any, outside: Path, token: str, name: str) -> None:
    name = name.format(outside=outside)
    _refused(ex, f"# filename: {name}\nprint('ran')\n")
    assert list(outside.iterdir()) == []
    assert not (ex.work_dir.parent / "escape.py").exists()
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_a_symlink_made_by_the_host_is_not_followed_out(ex: Any, outside: Path, token: str) -> None:
    (ex.work_dir / token).symlink_to(outside)
    _refused(ex, f"# filename: {token}/evil.py\nprint('ran')\n")
    assert list(outside.iterdir()) == []
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_a_symlink_made_by_a_block_is_not_followed_out(ex: Any, outside: Path, token: str) -> None:
    make = (
        "import os\n"
        f"os.symlink({str(outside)!r}, {token + '-dir'!r})\n"
        f"os.symlink({str(outside / 'target.py')!r}, {token + '-file.py'!r})\n"
    )
    assert ex.execute(make).ok
    _refused(ex, f"# filename: {token}-dir/evil.py\nprint('ran')\n")
    _refused(ex, f"# filename: {token}-file.py\nprint('ran')\n")
    assert list(outside.iterdir()) == []
    assert ex.execute("print('usable')").output == "usable\n"


@pytest.mark.parametrize("backend", backends(ALL), indirect=True)
def test_a_filename_inside_is_used(ex: Any, token: str) -> None:
    r = ex.execute(f"# filename: sub/{token}.py\nprint('ran')\n")
    assert r.ok and r.output == "ran\n"
    assert (ex.work_dir / "sub" / f"{token}.py").read_text().startswith("# filename:")
