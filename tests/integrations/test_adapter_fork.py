"""Fork and snapshot through the AG2, AutoGen and smolagents adapters, with the real frameworks.

None of the three frameworks has a place for a fork in its executor protocol: each adapter adds
``fork()`` returning a new executor of the framework's own type (to give another agent), and
``snapshot()`` / ``restore()``. A command executor keeps no state: ``ForkUnsupported``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernelexec import ForkUnsupported

KEY = b"a" * 32


def add(a: int, b: int) -> int:
    """A function given to the AutoGen executor (loaded into its kernel)."""
    return a + b


def test_ag2_executor_forks_and_snapshots(tmp_path: Path) -> None:
    pytest.importorskip("autogen.coding", reason="the ag2 extra is installed in CI")
    from autogen.coding import CodeBlock, CodeExecutor

    from kernelexec.integrations.ag2 import AG2CodeExecutor

    def run(executor: AG2CodeExecutor, code: str) -> str:
        return str(executor.execute_code_blocks([CodeBlock(code=code, language="python")]).output)

    with AG2CodeExecutor(kind="fork-kernel", timeout=60) as ex:
        run(ex, "x = 1\nopen('f.txt', 'w').write('parent')")
        child = ex.fork()
        try:
            assert isinstance(child, CodeExecutor) and isinstance(child, AG2CodeExecutor)
            assert run(child, "x += 1\nprint(x, open('f.txt').read())").split() == ["2", "parent"]
            assert child.work_dir != ex.work_dir
        finally:
            child.close()
        assert child.executor.closed  # the fork is the adapter's own: closed with it
        assert run(ex, "print(x)").strip() == "1"
        manifest = ex.snapshot(tmp_path / "s.kx", key=KEY)
        assert manifest.names["x"] == "saved"
        run(ex, "x = 5")
        assert ex.restore(tmp_path / "s.kx", key=KEY).names["x"] == "restored"
        assert run(ex, "print(x)").strip() == "1"
    with AG2CodeExecutor(kind="command") as command, pytest.raises(ForkUnsupported):
        command.fork()


def test_autogen_executor_forks_and_snapshots(tmp_path: Path) -> None:
    pytest.importorskip("autogen_core", reason="the autogen extra is installed in CI")
    from autogen_core import CancellationToken
    from autogen_core.code_executor import CodeBlock, CodeExecutor

    from kernelexec.integrations.autogen import KernelExecCodeExecutor

    async def run(executor: KernelExecCodeExecutor, code: str) -> str:
        blocks = [CodeBlock(code=code, language="python")]
        result = await executor.execute_code_blocks(blocks, CancellationToken())
        return result.output

    async def main() -> None:
        ex = KernelExecCodeExecutor(kind="fork-kernel", timeout=60, functions=[add])
        await ex.start()
        try:
            await run(ex, "y = 2")
            (child,) = await ex.fork(n=1)
            try:
                assert isinstance(child, CodeExecutor)
                out = await run(child, "from functions import add\ny *= 10\nprint(add(y, 1))")
                assert out.strip() == "21"
            finally:
                await child.stop()
            assert child.executor.closed
            assert (await run(ex, "print(y)")).strip() == "2"
            live = await ex.snapshot()
            await run(ex, "y = 7")
            await ex.restore(live)
            assert (await run(ex, "print(y)")).strip() == "2"
            await live.release()
        finally:
            await ex.stop()
        command = KernelExecCodeExecutor(kind="command")
        with pytest.raises(ForkUnsupported):
            await command.fork()
        await command.stop()

    asyncio.run(main())


def test_smolagents_executor_forks_and_snapshots(tmp_path: Path) -> None:
    pytest.importorskip("smolagents", reason="the smolagents extra is installed in CI")
    from smolagents.remote_executors import RemotePythonExecutor

    from kernelexec.integrations.smolagents import KernelExecPythonExecutor

    with KernelExecPythonExecutor(kind="fork-kernel", timeout=60) as ex:
        ex.run_code_raise_errors("z = 3")
        child = ex.fork()
        with child:
            assert isinstance(child, RemotePythonExecutor)
            assert child.run_code_raise_errors("z += 1\nz").output == "4"
        assert child.executor.closed
        assert ex.run_code_raise_errors("z").output == "3"
        ex.snapshot(tmp_path / "s.kx", key=KEY)
        ex.run_code_raise_errors("z = 0")
        ex.restore(tmp_path / "s.kx", key=KEY)
        assert ex.run_code_raise_errors("z").output == "3"
