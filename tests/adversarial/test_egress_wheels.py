"""``packages=`` in a bubblewrap sandbox and the host's wheel cache (``backends/_wheels``).

A local index (``kx_egress``) serves a wheel the test builds; the cache is a folder of this test
(``KERNELEXEC_WHEEL_CACHE``) and the host's pip is pointed at the index (``PIP_INDEX_URL``), so
nothing leaves loopback. The code is the attacker: it must not change the cache, the wheelhouse
or the session's packages, and a cache entry whose hash changed must not be installed.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kx_egress
import pytest
from kx_egress import PACKAGE, served_index

from kernelexec import BackendUnavailable, NetworkPolicy, SandboxOptions, make_executor
from kernelexec.backends import _sandbox
from kernelexec.backends._wheels import WheelCache

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


@pytest.fixture(scope="module")
def filled(index: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """(the cache, the first block's result) after a first session, from an empty cache."""
    root = tmp_path_factory.mktemp("wheels")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNELEXEC_WHEEL_CACHE", str(root / "cache"))
        patch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{index}/simple")
        with _session("sandboxed-command", root / "one", index) as ex:
            first = ex.execute(USE)
        yield root / "cache", first


@pytest.fixture(scope="module")
def second(filled: tuple[Path, Any], index: int, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A second session (a kernel) over the filled cache, links planted in its work dir."""
    root = tmp_path_factory.mktemp("second")
    outside, work = root / "outside", root / "work"
    outside.mkdir()
    work.mkdir()
    # Names the install might use, pointing at a host folder and at the cache
    for name in ("wheels", "site", "kernelexec-wheels", ".kernelexec"):
        (work / name).symlink_to(outside)
    (work / "cache").symlink_to(filled[0])
    with _session("sandboxed-kernel", work, index) as ex:
        ex.outside = outside
        yield ex


def _session(kind: str, work: Path, index: int) -> Any:
    policy = NetworkPolicy(allow=[f"127.0.0.1:{index}"], packages=[PACKAGE])
    return make_executor(kind, work_dir=work, timeout=90, sandbox=SandboxOptions(network=policy))


def _index_used(result: Any, index: int) -> bool:
    return any(e.allowed and e.port == index for e in result.network_log)


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir())


CACHED = sorted([".lock", "MANIFEST.json", f"{PACKAGE}-1.0-py3-none-any.whl"])


def test_a_first_session_installs_its_packages_and_fills_the_cache(
    filled: tuple[Path, Any], index: int
) -> None:
    cache, first = filled
    assert "answer 42" in first.output, first.output
    assert _index_used(first, index), first.network_log  # nothing cached: the index, via proxy
    assert _entries(cache) == CACHED
    manifest = json.loads((cache / "MANIFEST.json").read_text())
    assert list(manifest) == [f"{PACKAGE}-1.0-py3-none-any.whl"]


def test_a_second_session_installs_from_the_cache_alone(second: Any, index: int) -> None:
    result = second.execute(USE)
    assert "answer 42" in result.output, result.output
    assert not _index_used(result, index), result.network_log  # the index was not asked


def test_the_code_cannot_write_the_cache_the_wheelhouse_or_the_site(
    second: Any, filled: tuple[Path, Any]
) -> None:
    egress = second.aio.backend._egress.get()
    places = [filled[0], egress.wheels, egress.site]
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
    result = second.execute(attack + USE)
    assert "WROTE" not in result.output and "EMPTIED" not in result.output, result.output
    assert "answer 42" in result.output, result.output
    assert _entries(filled[0]) == CACHED


def test_planted_links_in_the_work_dir_do_not_send_the_host_elsewhere(
    second: Any, filled: tuple[Path, Any]
) -> None:
    plant = (
        f"import os\nfor n in ('pip', 'tmp', 'more'):\n    os.symlink({str(second.outside)!r}, n)\n"
    )
    assert "answer 42" in second.execute(plant + USE).output
    assert list(second.outside.iterdir()) == []
    assert _entries(filled[0]) == CACHED


def test_a_cache_entry_with_a_bad_hash_is_not_installed(
    filled: tuple[Path, Any], index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(filled[0], cache)
    monkeypatch.setenv("KERNELEXEC_WHEEL_CACHE", str(cache))
    # The cached wheel is swapped for a valid one that answers otherwise (its hash changes)
    wheel = cache / f"{PACKAGE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as old:
        files = {name: old.read(name) for name in old.namelist()}
    files[f"{PACKAGE}.py"] = b"ANSWER = 666\n"
    with zipfile.ZipFile(wheel, "w") as new:
        for name, data in files.items():
            new.writestr(name, data)
    with _session("sandboxed-command", tmp_path / "work", index) as ex:
        result = ex.execute(USE)
        assert "answer 42" in result.output and "666" not in result.output, result.output
        assert _index_used(result, index), result.network_log  # fetched anew from the index
    with zipfile.ZipFile(wheel) as kept:  # the cache holds the index's wheel again
        assert kept.read(f"{PACKAGE}.py") == b"ANSWER = 42\n"


def test_a_direct_reference_is_never_fetched_by_the_host(tmp_path: Path) -> None:
    # a valid wheel among the host's files: pip would copy it into the cache, for the code
    secret = kx_egress._wheel(tmp_path)
    cache = WheelCache(tmp_path / "cache")
    for spec in (f"{PACKAGE} @ file://{secret}", f"{PACKAGE} @ {secret.as_uri()}"):
        assert cache.fill([spec], "http://127.0.0.1:9/simple") == []
    assert _entries(tmp_path / "cache") == []


def test_a_session_gets_only_the_wheels_of_its_own_packages(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    wheel = kx_egress._wheel(staging)
    cache = WheelCache(tmp_path / "cache")
    assert cache._add(staging, [PACKAGE]) == [wheel.name]
    assert cache.wheelhouse(tmp_path / "other", ["numpy"]) == 0
    assert list((tmp_path / "other").iterdir()) == []
    assert cache.wheelhouse(tmp_path / "mine", [PACKAGE]) == 1
    copied = tmp_path / "mine" / wheel.name
    assert copied.read_bytes() == wheel.read_bytes() and copied.stat().st_mode & 0o777 == 0o644
