"""``packages=`` in a bubblewrap sandbox and the host's wheel cache (``backends/_wheels``).

A local index (``kx_egress``) serves a wheel the test builds; the cache is a folder of this test
(``KERNELEXEC_WHEEL_CACHE``) and the host's pip is pointed at the index (``PIP_INDEX_URL``), so
nothing leaves loopback. The code is the attacker: it must not change the cache, the wheelhouse
or the session's packages, and a cache entry whose hash changed must not be installed.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_egress import PACKAGE, served_index

from kernelexec import BackendUnavailable, NetworkPolicy, SandboxOptions, make_executor
from kernelexec.backends import _sandbox

pytestmark = [pytest.mark.adversarial]

USE = f"import {PACKAGE}; print('answer', {PACKAGE}.ANSWER)\n"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    try:
        _sandbox.check_sandbox()
    except BackendUnavailable as exc:
        if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
            raise
        pytest.skip(str(exc))
    with served_index(tmp_path_factory.mktemp("index")) as ports:
        yield ports[0]


@pytest.fixture
def cache(tmp_path: Path, index: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("KERNELEXEC_WHEEL_CACHE", str(root))
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{index}/simple")
    return root


def _session(kind: str, work: Path, index: int) -> Any:
    policy = NetworkPolicy(allow=[f"127.0.0.1:{index}"], packages=[PACKAGE])
    return make_executor(kind, work_dir=work, timeout=90, sandbox=SandboxOptions(network=policy))


def _index_used(result: Any, index: int) -> bool:
    return any(e.allowed and e.port == index for e in result.network_log)


@pytest.mark.parametrize("kind", ["sandboxed-command", "sandboxed-kernel"])
def test_packages_install_in_a_sandbox_and_a_second_session_uses_the_cache(
    kind: str, cache: Path, index: int, tmp_path: Path
) -> None:
    with _session(kind, tmp_path / "one", index) as ex:
        first = ex.execute(USE)
        assert "answer 42" in first.output, first.output
        assert _index_used(first, index), first.network_log  # the install's own fallback
    manifest = json.loads((cache / "MANIFEST.json").read_text())
    assert list(manifest) == [f"{PACKAGE}-1.0-py3-none-any.whl"]
    with _session(kind, tmp_path / "two", index) as ex:
        second = ex.execute(USE)
        assert "answer 42" in second.output, second.output
        # from the cache alone: the index was not asked at all
        assert not _index_used(second, index), second.network_log
        again = ex.execute(USE)  # every block of the session has them
        assert "answer 42" in again.output, again.output


def test_the_code_cannot_write_the_cache_the_wheelhouse_or_the_site(
    cache: Path, index: int, tmp_path: Path
) -> None:
    with _session("sandboxed-command", tmp_path / "work", index) as ex:
        egress = ex.aio.backend._egress.get()
        places = [cache, egress.wheels, egress.site]
        attack = (
            "import os, sys\n"
            f"for folder in {[str(p) for p in places]!r}:\n"
            "    for name in ['planted.whl', 'MANIFEST.json', 'kxegressdemo.py']:\n"
            "        try:\n"
            "            with open(os.path.join(folder, name), 'w') as f: f.write('x')\n"
            "            print('WROTE', folder, name)\n"
            "        except OSError as exc:\n"
            "            print('refused', folder, exc.strerror)\n"
            "    try:\n"
            "        for name in os.listdir(folder): os.unlink(os.path.join(folder, name))\n"
            "        print('EMPTIED', folder)\n"
            "    except OSError as exc:\n"
            "        print('refused', folder, exc.strerror)\n"
        )
        result = ex.execute(attack + USE)
        assert "WROTE" not in result.output and "EMPTIED" not in result.output, result.output
        assert "answer 42" in result.output, result.output
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [".lock", "MANIFEST.json", f"{PACKAGE}-1.0-py3-none-any.whl"]
    )


def test_planted_links_in_the_work_dir_do_not_send_the_host_elsewhere(
    cache: Path, index: int, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    # Every name the install might use, pointing at the cache and at a host folder
    for name in ("wheels", "site", "kernelexec-wheels", ".kernelexec"):
        (work / name).symlink_to(outside)
    (work / "cache").symlink_to(cache.parent)
    with _session("sandboxed-command", work, index) as ex:
        plant = (
            "import os\n"
            f"os.symlink({str(outside)!r}, {str(tmp_path / 'work' / 'more')!r})\n"
            "for n in ('pip', 'tmp'):\n"
            f"    os.symlink({str(outside)!r}, n)\n"
        )
        assert "answer 42" in ex.execute(plant + USE).output
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [".lock", "MANIFEST.json", f"{PACKAGE}-1.0-py3-none-any.whl"]
    )


def test_a_cache_entry_with_a_bad_hash_is_not_installed(
    cache: Path, index: int, tmp_path: Path
) -> None:
    with _session("sandboxed-command", tmp_path / "one", index) as ex:
        assert "answer 42" in ex.execute(USE).output
    # The cached wheel is swapped for a valid one that answers otherwise (its hash changes)
    wheel = cache / f"{PACKAGE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as old:
        files = {name: old.read(name) for name in old.namelist()}
    files[f"{PACKAGE}.py"] = b"ANSWER = 666\n"
    with zipfile.ZipFile(wheel, "w") as new:
        for name, data in files.items():
            new.writestr(name, data)
    with _session("sandboxed-command", tmp_path / "two", index) as ex:
        result = ex.execute(USE)
        assert "answer 42" in result.output and "666" not in result.output, result.output
        assert _index_used(result, index), result.network_log  # fetched anew from the index
    with zipfile.ZipFile(wheel) as kept:  # the cache holds the index's wheel again
        assert kept.read(f"{PACKAGE}.py") == b"ANSWER = 42\n"
