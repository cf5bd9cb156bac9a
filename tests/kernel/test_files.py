"""The files API (read, write, list, upload, download) on the local back ends, sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelexec import (
    AsyncKernelExecutor,
    CommandLineExecutor,
    ExecutorClosed,
    FileTooLarge,
    InvalidPath,
    KernelExecutor,
)
from kernelexec._files import KernelFiles


@pytest.fixture(params=["kernel", "command"])
def ex(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    cls = KernelExecutor if request.param == "kernel" else CommandLineExecutor
    with cls(work_dir=tmp_path / "work", timeout=30) as executor:
        yield executor


def test_files_contract(ex: Any, files_contract: Callable[[Any, Path], None]) -> None:
    files_contract(ex, ex.work_dir)


def test_upload_and_download(ex: Any, transfer_roundtrip: Callable[[Any], None]) -> None:
    transfer_roundtrip(ex)


def test_use_after_close_is_refused(tmp_path: Path) -> None:
    ex = CommandLineExecutor(work_dir=tmp_path)
    ex.close()
    with pytest.raises(ExecutorClosed):
        ex.read_file("x")


def test_async_core_and_the_kernel_route(tmp_path: Path) -> None:
    """The async API; and the through-the-kernel store driven by a local kernel (the route a
    remote gateway kernel takes), including its size limit."""
    asyncio.run(_async_scenario(tmp_path))


async def _async_scenario(tmp_path: Path) -> None:
    async with AsyncKernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        await ex.write_file("a.txt", b"abc")
        assert await ex.read_file("a.txt") == b"abc"
        assert [e.path for e in await ex.list_files()] == ["a.txt"]
        store = KernelFiles(ex._evaluate, str(tmp_path), limit=1000)
        await store.write("remote/b.txt", b"x" * 1000)
        assert (tmp_path / "remote" / "b.txt").read_bytes() == b"x" * 1000
        with pytest.raises(FileTooLarge, match="1001 bytes"):
            await store.write("big.txt", b"x" * 1001)
        (tmp_path / "big2.txt").write_bytes(b"y" * 5000)
        with pytest.raises(FileTooLarge):
            await store.read("big2.txt")
        with pytest.raises(InvalidPath):
            await store.read("../escape")
        with pytest.raises(FileNotFoundError):
            await store.read("nope")
        # nothing of the transfers shows in the session: no history, no outputs
        r = await ex.execute("len([h for h in In if '__kx_' + 'files__' in h])")
        assert r.output == "0"
