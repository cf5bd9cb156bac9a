"""The Docker drop-ins (issue 19.3 / 19.4): kernelexec's replacements for AG2's and autogen-ext's
``DockerCommandLineCodeExecutor``, with the peers' constructor arguments, driving the kernelexec
image; the seed flows run through them end to end."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("autogen.coding", reason="the ag2 extra is installed in CI (.ci/extras.sh)")
pytest.importorskip("autogen_ext", reason="the autogen extra is installed in CI")

from autogen.coding import CodeBlock as AG2Block
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock as AutoGenBlock

from kernelexec import ExecutorNotStarted
from kernelexec.backends._docker import DEFAULT_IMAGE
from kernelexec.integrations import ag2, autogen

from . import _fixtures as flows
from .test_ag2 import ag2_chat

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_ready")]


def image_pip_problem() -> str | None:
    """Why the image cannot ``pip install`` (None when it can)."""
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", DEFAULT_IMAGE, "python3", "-m", "pip"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return None if probe.returncode == 0 else probe.stderr.strip()[-300:]


# -- AG2 -----------------------------------------------------------------------------------------


def test_ag2_fibonacci_chat_through_the_docker_drop_in(tmp_path: Path) -> None:
    executor = ag2.DockerCommandLineCodeExecutor(image=DEFAULT_IMAGE, timeout=60, work_dir=tmp_path)
    with executor:
        assert executor.timeout == 60 and executor.work_dir == tmp_path
        assert executor.bind_dir == tmp_path  # AG2: bind_dir falls back to work_dir
        heard = ag2_chat(executor, "What is the 14th Fibonacci number?", flows.FIB, flows.DONE)
        # Files persist between blocks: one container serves the whole chat.
        heard += ag2_chat(
            executor,
            "files",
            "```sh\necho kept > note.txt\n```",
            "```python\nprint(open('note.txt').read().strip())\n```",
            flows.DONE,
        )
    assert heard[0] == "exitcode: 0 (execution succeeded)\nCode output: 377\n"
    assert heard[2] == "exitcode: 0 (execution succeeded)\nCode output: kept\n"
    assert executor.executor.closed


def test_ag2_docker_rules(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Timeout"):
        ag2.DockerCommandLineCodeExecutor(timeout=0)
    with ag2.DockerCommandLineCodeExecutor(timeout=2, work_dir=tmp_path) as executor:
        with pytest.raises(ValueError, match="No code blocks"):
            executor.execute_code_blocks([])
        timed_out = executor.execute_code_blocks([AG2Block(code="sleep 30", language="sh")])
        saved = executor.execute_code_blocks([AG2Block(code="<p>x</p>", language="html")])
        named = executor.execute_code_blocks(
            [AG2Block(code="# run_me.py\nprint('named')", language="python")]
        )
    assert timed_out.exit_code == 124 and "Timeout" in timed_out.output
    assert saved.exit_code == 0 and saved.output.startswith("Code saved to ")
    assert named.output == "named\n" and (tmp_path / "run_me.py").exists()


def test_ag2_missing_module_then_pip_install_in_the_same_container(tmp_path: Path) -> None:
    problem = image_pip_problem()
    assert problem is None, f"{DEFAULT_IMAGE} cannot pip install (rebuild the image): {problem}"
    wheel = flows.build_demo_wheel(tmp_path)  # in the work dir: the container sees it
    # As an agent writes it; no network: the wheel is a file in the work dir.
    install = f"```sh\npython3 -m pip install --no-index --no-deps {wheel.name}\n```"
    with ag2.DockerCommandLineCodeExecutor(timeout=120, work_dir=tmp_path) as executor:
        heard = ag2_chat(
            executor, "use kxdemo_pkg", flows.IMPORT_DEMO, install, flows.IMPORT_DEMO, flows.DONE
        )
    assert heard[0].startswith("exitcode: 1") and "ModuleNotFoundError" in heard[0]
    assert heard[1].startswith("exitcode: 0"), heard[1]
    assert heard[2] == "exitcode: 0 (execution succeeded)\nCode output: kxdemo says 42\n"


def test_ag2_docker_kernel_by_name(tmp_path: Path) -> None:
    with ag2.AG2CodeExecutor(kind="docker-kernel", work_dir=tmp_path, timeout=60) as executor:
        heard = ag2_chat(executor, "state", flows.SET_STATE, flows.USE_STATE, flows.DONE)
    assert heard[1] == "exitcode: 0 (execution succeeded)\nCode output: 42\n"


# -- autogen-ext ---------------------------------------------------------------------------------


def test_autogen_docker_drop_in(tmp_path: Path) -> None:
    fib = flows.FIB.split("```python\n", 1)[1].rsplit("```", 1)[0]

    async def go() -> tuple[Any, Any, Any]:
        executor = autogen.DockerCommandLineCodeExecutor(
            DEFAULT_IMAGE, timeout=2, work_dir=tmp_path
        )
        with pytest.raises(ExecutorNotStarted, match="not running"):  # a ValueError, as there
            await executor.execute_code_blocks(
                [AutoGenBlock(code="1", language="python")], CancellationToken()
            )
        async with executor:
            with pytest.raises(ValueError, match="No code blocks"):
                await executor.execute_code_blocks([], CancellationToken())
            ok = await executor.execute_code_blocks(
                [AutoGenBlock(code=fib, language="python")], CancellationToken()
            )
            late = await executor.execute_code_blocks(
                [AutoGenBlock(code="sleep 30", language="sh")], CancellationToken()
            )
            assert executor.bind_dir == executor.work_dir == tmp_path
        return executor, ok, late

    executor, ok, late = asyncio.run(go())
    assert ok.exit_code == 0 and ok.output == "377\n"
    assert late.exit_code == 124 and "Timeout" in late.output  # a result, as autogen-ext's
    assert Path(ok.code_file).exists()  # delete_tmp_files=False by default, as there
    assert executor.executor.closed


def test_autogen_docker_unsupported_arguments_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="init_command"):
        autogen.DockerCommandLineCodeExecutor(init_command="pip install x")
    with pytest.raises(TypeError, match="bogus"):
        autogen.DockerCommandLineCodeExecutor(bogus=1)


def test_ag2_container_name_and_a_kept_container(tmp_path: Path) -> None:
    import contextlib
    import uuid

    import docker

    name = f"kx-dropin-{uuid.uuid4().hex[:8]}"
    client = docker.from_env()
    try:
        with ag2.DockerCommandLineCodeExecutor(
            container_name=name, auto_remove=False, stop_container=False, work_dir=tmp_path
        ) as executor:
            result = executor.execute_code_blocks([AG2Block(code="print(1)", language="python")])
            assert result.exit_code == 0 and result.output == "1\n"
            assert client.containers.get(name).status == "running"
        kept = client.containers.get(name)  # closing the executor kept it, as AG2 does
        assert kept.status == "running"
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(name).remove(force=True)
        client.close()


def test_autogen_bind_dir_is_what_the_container_mounts(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    app = tmp_path / "app"
    app.symlink_to(host)  # the same folder seen under another path, as in Docker out of Docker

    async def go() -> tuple[Any, Any]:
        async with autogen.DockerCommandLineCodeExecutor(work_dir=app, bind_dir=host) as ex:
            code = "open('seen.txt', 'w').write('x')\nprint('ok')"
            result = await ex.execute_code_blocks(
                [AutoGenBlock(code=code, language="python")], CancellationToken()
            )
            return ex, result

    executor, result = asyncio.run(go())
    assert result.exit_code == 0 and result.output == "ok\n"
    assert executor.bind_dir == host and executor.work_dir == app
    assert (host / "seen.txt").read_text() == "x"
