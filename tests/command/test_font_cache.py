"""Matplotlib's font list in sandboxes: built once by the host, handed over read-only, never
read back. Before, every sandboxed block or kernel built it again on its first import (2 to 5 s)
and "Matplotlib is building the font cache" landed in the block's output."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelexec import (
    CommandLineExecutor,
    KernelExecutor,
    SandboxedCommand,
    SandboxedKernel,
    SandboxOptions,
)
from kernelexec.backends import _fontcache

_WHERE = (
    "import matplotlib, matplotlib.font_manager\n"
    "print(matplotlib.get_cachedir())\n"
    "print(sorted(os.listdir(matplotlib.get_cachedir())))\n"
)
_ATTACK = """
import os, matplotlib
folder = matplotlib.get_cachedir()
name = [n for n in os.listdir(folder) if n.startswith('fontlist-')][0]
path = os.path.join(folder, name)
for attempt in (lambda: open(path, 'w').write('{}'), lambda: os.remove(path),
                lambda: os.chmod(path, 0o666), lambda: os.rename(path, path + '.x')):
    try:
        attempt()
        print('allowed')
    except OSError:
        print('refused')
os.symlink('/etc/shadow', os.path.join(folder, 'fontlist-v0.json'))
open(os.path.join(folder, 'fontlist-v1.json'), 'w').write('{"planted": 1}')
"""


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache of this module's own (the list is built here, once, by the host)."""
    root = tmp_path_factory.mktemp("xdg-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root))
        mp.delenv(_fontcache.ENV_VAR, raising=False)
        yield root / "kernelexec" / "matplotlib"


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_sandboxed_block_finds_the_list_and_cannot_change_it(
    cache_root: Path, tmp_path: Path
) -> None:
    with CommandLineExecutor(backend=SandboxedCommand(), work_dir=tmp_path, timeout=120) as ex:
        first = ex.execute("import os\n" + _WHERE)
        lists = sorted(p.name for p in cache_root.glob("*/fontlist-*.json"))
        assert len(lists) == 1, list(cache_root.rglob("*"))
        # exactly what the block printed: no "building the font cache" line
        assert first.output == f"{_fontcache.SANDBOX_FOLDER}\n{lists}\n", first.output
        before = _digest(cache_root)
        attack = ex.execute(_ATTACK)
        assert attack.exit_code == 0, attack.output
        assert attack.output.split() == ["refused"] * 4, attack.output
        assert _digest(cache_root) == before  # nothing the block wrote reached the host's
    with CommandLineExecutor(backend=SandboxedCommand(), work_dir=tmp_path, timeout=120) as ex:
        again = ex.execute("import os\n" + _WHERE)  # another sandbox: a clean folder again
    assert again.output == first.output, again.output


def test_a_sandboxed_kernel_finds_the_list_in_its_own_folder(
    cache_root: Path, tmp_path: Path
) -> None:
    code = "import os\n" + _WHERE + "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
    with KernelExecutor(backend=SandboxedKernel(), work_dir=tmp_path, timeout=120) as ex:
        result = ex.execute(code)
        folder, names, *rest = result.output.splitlines()
        assert folder.endswith("/run/matplotlib") and names.startswith("['fontlist-"), names
        # the host's copy (root's), not one the kernel built on its first import (its user's)
        listed = Path(folder, names[2:-2])
        assert listed.stat().st_uid == os.getuid() != SandboxOptions().host_uid, listed
    assert not [line for line in rest if not line.startswith("[chart: line")], result.output
    assert [o.get("output_type") for o in result.outputs].count("display_data") == 1


def test_an_untrusted_or_switched_off_cache_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    (shared / "kernelexec" / "matplotlib").mkdir(parents=True)
    os.chmod(shared / "kernelexec" / "matplotlib", 0o777)  # anyone could swap the lists
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    assert _fontcache.font_lists(sys.executable) == []
    assert not list((shared / "kernelexec" / "matplotlib").iterdir())  # nothing built there
    elsewhere = tmp_path / "link-target"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "linked" / "kernelexec").mkdir(parents=True)
    (tmp_path / "linked" / "kernelexec" / "matplotlib").symlink_to(elsewhere)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "linked"))
    assert _fontcache.font_lists(sys.executable) == []
    assert not list(elsewhere.iterdir())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh"))
    monkeypatch.setenv(_fontcache.ENV_VAR, "off")
    assert _fontcache.font_lists(sys.executable) == []
    assert not (tmp_path / "fresh").exists()
    assert stat.S_IMODE(os.stat(shared / "kernelexec" / "matplotlib").st_mode) == 0o777
