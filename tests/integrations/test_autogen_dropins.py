"""autogen-ext's executors and kernelexec's drop-ins side by side (issue 32, 7-12): the same
calls on the peer's class (autogen-ext 0.7) and on kernelexec's class of the same name, the same
observable behaviour asserted. The Docker drop-in's own options are in test_docker_dropins.py
(the peer's Docker executor needs an image with ``python`` on PATH)."""

from __future__ import annotations

import asyncio
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("autogen_ext.code_executors.local", reason="the autogen extra, installed in CI")

from autogen_core import CancellationToken
from autogen_core.code_executor import (
    CodeBlock,
    CodeExecutor,
    FunctionWithRequirements,
    with_requirements,
)
from autogen_ext.code_executors import local as peer_local
from autogen_ext.code_executors.docker import _docker_code_executor as peer_docker
from autogen_ext.code_executors.jupyter import _jupyter_code_executor as peer_jupyter

from kernelexec.integrations import autogen as ours

IMAGE = "from PIL import Image\ndisplay(Image.new('RGB', (4, 4), 'red'))"


def py(code: str) -> list[CodeBlock]:
    return [CodeBlock(code=code, language="python")]


def peer_local_executor(**kwargs: Any) -> peer_local.LocalCommandLineCodeExecutor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "may execute code on the local machine"
        return peer_local.LocalCommandLineCodeExecutor(**kwargs)


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@with_requirements(global_imports=["math"])
def hypot(x: float, y: float) -> float:
    return math.hypot(x, y)  # type: ignore[name-defined] # noqa: F821


MUL = FunctionWithRequirements.from_str(
    'def mul(a: int, b: int) -> int:\n    """Times."""\n    return a * b\n'
)
USE = "from {module} import add, hypot, mul\nprint(add(1, 2), hypot(3, 4), mul(6, 7))"


# -- 7: JupyterCodeExecutor: output_files are Paths, in output_dir itself ----------------------


def test_jupyter_output_files_are_paths_in_output_dir_as_the_peer(tmp_path: Path) -> None:
    async def both() -> list[Any]:
        results = []
        for cls, folder in [
            (peer_jupyter.JupyterCodeExecutor, "peer"),
            (ours.JupyterCodeExecutor, "ours"),
        ]:
            async with cls(output_dir=tmp_path / folder) as executor:
                results.append(await executor.execute_code_blocks(py(IMAGE), CancellationToken()))
        async with ours.KernelExecCodeExecutor(output_dir=tmp_path / "adapter") as adapter:
            results.append(await adapter.execute_code_blocks(py(IMAGE), CancellationToken()))
        return results

    theirs, mine, adapter = asyncio.run(both())
    for result, folder in [(theirs, "peer"), (mine, "ours"), (adapter, "adapter")]:
        [png] = result.output_files
        assert isinstance(png, Path) and png.suffix == ".png"
        assert png.parent == tmp_path / folder  # not a folder under it
        assert png.read_bytes() == theirs.output_files[0].read_bytes()
    # (The text differs by design: the image's bare repr is not repeated; see the README.)


# -- 8: LocalCommandLineCodeExecutor runs without start() --------------------------------------


def test_local_runs_without_start_as_the_peer(tmp_path: Path) -> None:
    async def run_twice(executor: Any) -> list[Any]:
        first = await executor.execute_code_blocks(py("print('hi')"), CancellationToken())
        await executor.stop()  # and again after stop(), as there
        second = await executor.execute_code_blocks(py("print('again')"), CancellationToken())
        await executor.stop()
        return [(first.exit_code, first.output), (second.exit_code, second.output)]

    theirs = asyncio.run(run_twice(peer_local_executor(work_dir=tmp_path / "peer")))
    mine = asyncio.run(run_twice(ours.LocalCommandLineCodeExecutor(work_dir=tmp_path / "ours")))
    assert mine == theirs == [(0, "hi\n"), (0, "again\n")]
    # Code files are removed after the run, as there (cleanup_temp_files=True).
    assert list((tmp_path / "ours").glob("tmp_code_*")) == []


# -- 9: functions=[...] and format_functions_for_prompt() --------------------------------------


@pytest.mark.parametrize("module", ["functions", "tools"])
def test_local_functions_importable_as_the_peer(tmp_path: Path, module: str) -> None:
    functions = [add, hypot, MUL]

    async def go(executor: Any) -> Any:
        return await executor.execute_code_blocks(
            py(USE.format(module=module)), CancellationToken()
        )

    peer = peer_local_executor(
        work_dir=tmp_path / "peer", functions=functions, functions_module=module
    )
    mine = ours.LocalCommandLineCodeExecutor(
        work_dir=tmp_path / "ours", functions=functions, functions_module=module
    )
    theirs, result = asyncio.run(go(peer)), asyncio.run(go(mine))
    assert (
        (result.exit_code, result.output) == (theirs.exit_code, theirs.output) == (0, "3 5.0 42\n")
    )
    assert (tmp_path / "ours" / f"{module}.py").is_file()
    assert mine.functions_module == peer.functions_module == module
    # Stubs from the source (this module's annotations are strings: the peer quotes them).
    prompt = mine.format_functions_for_prompt()
    assert "def add(a: int, b: int) -> int:" in prompt and f"`from {module} import foo`" in prompt
    assert "def mul(a: int, b: int) -> int:\n" in prompt
    only_str = [MUL]
    assert ours.LocalCommandLineCodeExecutor(functions=only_str).format_functions_for_prompt() == (
        peer_local_executor(functions=only_str).format_functions_for_prompt()
    )
    template = "$module_name: $functions"
    assert mine.format_functions_for_prompt(template).startswith(f"{module}: def add(")


def test_functions_that_fail_to_load_raise_value_error_as_the_peer(tmp_path: Path) -> None:
    broken = FunctionWithRequirements.from_str(
        "def f():\n    return 1\n", global_imports=["no_such_mod_kx"]
    )

    async def go(executor: Any) -> str:
        with pytest.raises(ValueError, match="Functions failed to load") as error:
            await executor.execute_code_blocks(py("print(1)"), CancellationToken())
        return str(error.value)

    theirs = asyncio.run(go(peer_local_executor(work_dir=tmp_path / "peer", functions=[broken])))
    mine = asyncio.run(
        go(ours.LocalCommandLineCodeExecutor(work_dir=tmp_path / "ours", functions=[broken]))
    )
    assert "no_such_mod_kx" in theirs and "no_such_mod_kx" in mine
    with pytest.raises(ValueError, match="identifier"):
        peer_local_executor(functions_module="not-a-name")
    with pytest.raises(ValueError, match="identifier"):
        ours.LocalCommandLineCodeExecutor(functions_module="not-a-name")


def test_functions_in_a_kernel_are_also_defined_in_the_session(tmp_path: Path) -> None:
    async def go() -> list[str]:
        outputs = []
        async with ours.KernelExecCodeExecutor(
            kind="kernel", work_dir=tmp_path, functions=[add, MUL]
        ) as ex:
            for code in [
                "print(add(2, 3), mul(2, 3))",
                "from functions import add\nprint(add(1, 1))",
            ]:
                outputs.append((await ex.execute_code_blocks(py(code), CancellationToken())).output)
            await ex.restart()  # a new kernel: the names are bound again before the next block
            outputs.append(
                (await ex.execute_code_blocks(py("print(add(4, 4))"), CancellationToken())).output
            )
        return outputs

    assert asyncio.run(go()) == ["5 6\n", "2\n", "8\n"]


# -- 10: cancellation answers as each peer --------------------------------------------------------


def cancelled_token() -> CancellationToken:
    token = CancellationToken()
    token.cancel()
    return token


def test_cancelled_local_gives_the_peers_result(tmp_path: Path) -> None:
    async def go(executor: Any) -> tuple[int, str]:
        result = await executor.execute_code_blocks(py("print('ran')"), cancelled_token())
        return result.exit_code, result.output

    theirs = asyncio.run(go(peer_local_executor(work_dir=tmp_path / "peer")))
    mine = asyncio.run(go(ours.LocalCommandLineCodeExecutor(work_dir=tmp_path / "ours")))
    assert mine == theirs == (125, "\nCancelled")


def test_cancelling_a_running_local_block_gives_the_cancelled_result(tmp_path: Path) -> None:
    async def go() -> tuple[Any, float]:
        executor = ours.LocalCommandLineCodeExecutor(work_dir=tmp_path)
        token = CancellationToken()
        asyncio.get_running_loop().call_later(1.0, token.cancel)
        started = time.monotonic()
        result = await executor.execute_code_blocks(py("import time; time.sleep(60)"), token)
        return result, time.monotonic() - started

    result, took = asyncio.run(go())
    assert (result.exit_code, result.output) == (125, "\nCancelled")
    assert took < 30  # the process was killed, not waited for


def test_cancelled_jupyter_raises_as_the_peer(tmp_path: Path) -> None:
    async def go(executor: Any) -> None:
        async with executor:
            with pytest.raises(asyncio.CancelledError):
                await executor.execute_code_blocks(py("print('ran')"), cancelled_token())

    asyncio.run(go(peer_jupyter.JupyterCodeExecutor(output_dir=tmp_path / "peer")))
    asyncio.run(go(ours.JupyterCodeExecutor(output_dir=tmp_path / "ours")))
    # kernelexec's own adapter keeps the CodeExecutor contract.
    asyncio.run(go(ours.KernelExecCodeExecutor(kind="command", work_dir=tmp_path / "adapter")))


# -- 12: each drop-in dumps and loads as itself -------------------------------------------------


def round_trip(executor: Any, cls: type) -> dict[str, Any]:
    model = executor.dump_component()
    assert model.provider == f"kernelexec.integrations.autogen.{cls.__name__}"
    for loaded in (cls.load_component(model), CodeExecutor.load_component(model)):
        assert type(loaded) is cls
        assert loaded.dump_component().config == model.config
    return dict(model.config)


def test_each_drop_in_round_trips_as_itself(tmp_path: Path) -> None:
    docker_options: dict[str, Any] = {
        "image": "kernelexec/python:latest",
        "container_name": "kx-roundtrip",
        "timeout": 17,
        "work_dir": str(tmp_path / "w"),
        "bind_dir": "/srv/on-the-host",
        "auto_remove": False,
        "stop_container": False,
        "functions_module": "tools",
        "extra_volumes": {str(tmp_path): {"bind": "/data", "mode": "ro"}},
        "extra_hosts": {"db.local": "10.0.0.7"},
        "init_command": "echo ready",
        "delete_tmp_files": True,
    }
    docker_config = round_trip(
        ours.DockerCommandLineCodeExecutor(**docker_options), ours.DockerCommandLineCodeExecutor
    )
    assert docker_config == docker_options
    loaded = ours.DockerCommandLineCodeExecutor.load_component(
        ours.DockerCommandLineCodeExecutor(**docker_options).dump_component()
    )
    assert loaded.bind_dir == Path("/srv/on-the-host") and loaded.timeout == 17
    # The same field names as the peer's configuration.
    peer_fields = set(peer_docker.DockerCommandLineCodeExecutorConfig.model_fields)
    assert peer_fields <= set(ours.DockerCommandLineCodeExecutorConfig.model_fields)

    local = ours.LocalCommandLineCodeExecutor(
        timeout=9, work_dir=tmp_path, functions_module="tools", cleanup_temp_files=False
    )
    local_config = round_trip(local, ours.LocalCommandLineCodeExecutor)
    assert local_config == {
        "timeout": 9,
        "work_dir": str(tmp_path),
        "functions_module": "tools",
        "cleanup_temp_files": False,
    }
    assert set(local_config) == set(peer_local.LocalCommandLineCodeExecutorConfig.model_fields)

    jupyter = ours.JupyterCodeExecutor(timeout=11, output_dir=tmp_path / "out")
    jupyter_config = round_trip(jupyter, ours.JupyterCodeExecutor)
    assert jupyter_config == {
        "kernel_name": "python3",
        "timeout": 11,
        "output_dir": str(tmp_path / "out"),
    }
    assert set(jupyter_config) == set(peer_jupyter.JupyterCodeExecutorConfig.model_fields)
