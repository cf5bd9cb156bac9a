"""autogen-ext's ``DockerCommandLineCodeExecutor`` options on kernelexec's drop-in (issue 32, 9-11),
side by side with the peer where the peer can run on kernelexec's image (shell blocks: its
Python blocks need ``python`` on PATH): ``extra_volumes`` (read-only unless the mode says
``rw``), ``extra_hosts``, ``init_command``, ``functions`` and a cancelled token."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "autogen_ext.code_executors.docker", reason="the autogen extra, installed in CI"
)

from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.code_executors.docker import DockerCommandLineCodeExecutor as PeerDocker

from kernelexec import DockerConfigError, KernelExecError
from kernelexec.backends._docker import DEFAULT_IMAGE
from kernelexec.integrations.autogen import DockerCommandLineCodeExecutor

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_ready")]

PROBE = """cat /data/in.txt
touch /data/planted 2>/dev/null && echo data-written || echo data-refused
echo w > /out/new.txt && echo out-written
getent hosts db.kx.test
cat init.txt
"""


def add(a: int, b: int) -> int:
    return a + b


def sh(code: str) -> list[CodeBlock]:
    return [CodeBlock(code=code, language="sh")]


def volumes(tmp_path: Path, name: str, **data_mode: str) -> dict[str, Any]:
    data, out = tmp_path / f"{name}-data", tmp_path / f"{name}-out"
    for folder in (data, out):
        folder.mkdir()
        os.chmod(folder, 0o777)  # the container's user may write where the mount allows
    (data / "in.txt").write_text("from the host\n")
    return {
        str(data): {"bind": "/data", **data_mode},
        str(out): {"bind": "/out", "mode": "rw"},
    }


def options(tmp_path: Path, name: str, **data_mode: str) -> dict[str, Any]:
    work = tmp_path / f"{name}-work"
    work.mkdir()
    os.chmod(work, 0o777)
    return {
        "work_dir": work,
        "extra_volumes": volumes(tmp_path, name, **data_mode),
        "extra_hosts": {"db.kx.test": "10.1.2.3"},
        "init_command": "echo init-ran > /workspace/init.txt",
        "timeout": 60,
    }


async def probe(executor: Any) -> tuple[int, str]:
    async with executor:
        result = await executor.execute_code_blocks(sh(PROBE), CancellationToken())
    return result.exit_code, result.output


def test_volumes_hosts_and_init_command_as_the_peer(tmp_path: Path) -> None:
    peer = PeerDocker(image=DEFAULT_IMAGE, **options(tmp_path, "peer", mode="ro"))
    ours = DockerCommandLineCodeExecutor(DEFAULT_IMAGE, **options(tmp_path, "ours", mode="ro"))
    theirs, mine = asyncio.run(probe(peer)), asyncio.run(probe(ours))
    expected = "from the host\ndata-refused\nout-written\n10.1.2.3        db.kx.test\ninit-ran\n"
    assert mine == theirs == (0, expected)
    assert not (tmp_path / "ours-data" / "planted").exists()
    assert (tmp_path / "ours-out" / "new.txt").read_text() == "w\n"


def test_a_volume_without_a_mode_is_read_only(tmp_path: Path) -> None:
    # kernelexec's choice (docker-py's default, the peer's, is read-write): writing to the host
    # takes a mode that says so.
    code, output = asyncio.run(probe(DockerCommandLineCodeExecutor(**options(tmp_path, "ours"))))
    assert code == 0 and "data-refused\n" in output
    assert not (tmp_path / "ours-data" / "planted").exists()


def test_a_missing_volume_source_fails_and_is_not_made(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "folder"
    executor = DockerCommandLineCodeExecutor(
        work_dir=tmp_path, extra_volumes={str(missing): {"bind": "/data", "mode": "rw"}}
    )
    with pytest.raises(KernelExecError):
        asyncio.run(executor.start())
    assert not (tmp_path / "no").exists()
    asyncio.run(executor.stop())


@pytest.mark.parametrize(
    "spec",
    [
        {"bind": "/workspace"},
        {"bind": "/workspace/sub"},
        {"bind": "/"},
        {"bind": "relative"},
        {"bind": "/data", "mode": "rx"},
    ],
)
def test_volume_specs_that_would_hide_the_work_dir_are_refused(spec: dict[str, str]) -> None:
    with pytest.raises(DockerConfigError):
        DockerCommandLineCodeExecutor(extra_volumes={"/tmp": spec})


def test_functions_importable_in_the_container(tmp_path: Path) -> None:
    async def go() -> tuple[Any, str]:
        executor = DockerCommandLineCodeExecutor(work_dir=tmp_path, functions=[add])
        async with executor:
            block = CodeBlock(
                code="from functions import add\nprint(add(20, 22))", language="python"
            )
            result = await executor.execute_code_blocks([block], CancellationToken())
        return result, executor.format_functions_for_prompt()

    result, prompt = asyncio.run(go())
    assert (result.exit_code, result.output) == (0, "42\n")
    assert "def add(a: int, b: int) -> int:" in prompt


def test_cancelling_a_running_block_answers_as_the_peer(tmp_path: Path) -> None:
    async def go(executor: Any) -> tuple[Any, Any]:
        async with executor:
            token = CancellationToken()
            asyncio.get_running_loop().call_later(3.0, token.cancel)
            cancelled = await executor.execute_code_blocks(sh("sleep 60"), token)
            after = await executor.execute_code_blocks(sh("echo still-here"), CancellationToken())
        return (cancelled.exit_code, cancelled.output), (after.exit_code, after.output)

    (tmp_path / "peer").mkdir()
    (tmp_path / "ours").mkdir()
    theirs = asyncio.run(go(PeerDocker(image=DEFAULT_IMAGE, work_dir=tmp_path / "peer")))
    mine = asyncio.run(go(DockerCommandLineCodeExecutor(work_dir=tmp_path / "ours")))
    assert mine == theirs == ((1, "Code execution was cancelled."), (0, "still-here\n"))
