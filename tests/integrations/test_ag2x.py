"""AG2 1.x: KernelCodeEnvironment behind AG2's own SandboxCodeTool, the model scripted with
ag2.testing.TestConfig (no LLM).

AG2 1.x cannot share an environment with classic AG2 (both are the `ag2` distribution), so CI
runs this file in .venv-ag2x (`extras_test` in .ci/extras.sh); the main run skips it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip(
    "ag2.tools.code", reason="AG2 1.x runs in .venv-ag2x: `extras_test` in .ci/extras.sh"
)

from ag2 import Agent
from ag2.events import ToolCallEvent, ToolResultEvent
from ag2.testing import TestConfig
from ag2.tools.code import CodeEnvironment, SandboxCodeTool

from kernelexec import make_async_executor
from kernelexec.integrations.ag2x import KernelCodeEnvironment

from . import _fixtures as flows
from .conftest import KINDS, PipSetup

T = TypeVar("T")


def code_of(message: str) -> tuple[str, str]:
    """(code, AG2 language) of the one fenced block in a scripted message."""
    head, rest = message.split("```", 1)[1].split("\n", 1)
    language = {"python": "python", "sh": "bash"}[head.strip()]
    return rest.rsplit("```", 1)[0], language


def call(message: str) -> ToolCallEvent:
    code, language = code_of(message)
    return ToolCallEvent("run_code", arguments=json.dumps({"code": code, "language": language}))


async def agent_run(env: KernelCodeEnvironment, *turns: Any) -> tuple[str | None, list[str]]:
    """Ask an agent whose model plays ``turns``; return its answer and the tool outputs."""
    agent = Agent("coder", config=TestConfig(*turns), tools=[SandboxCodeTool(env)])
    reply = await agent.ask("solve the task")
    outputs = [
        "".join(getattr(part, "content", "") for part in event.result.parts)
        for event in await reply.history.get_events()
        if isinstance(event, ToolResultEvent)
    ]
    return reply.body, outputs


def run_with(kind: str, tmp_path: Path, body: Callable[[KernelCodeEnvironment], Awaitable[T]]) -> T:
    async def main() -> T:
        async with KernelCodeEnvironment(kind=kind, work_dir=tmp_path, timeout=60) as env:
            return await body(env)

    return asyncio.run(main())


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_is_a_code_environment(tmp_path: Path) -> None:
    async def body(env: KernelCodeEnvironment) -> None:
        assert isinstance(env, CodeEnvironment)
        assert env.supported_languages == ("python", "bash")

    run_with("command", tmp_path, body)


def test_fibonacci(kind: str, tmp_path: Path) -> None:
    answer, outputs = run_with(
        kind, tmp_path, lambda env: agent_run(env, call(flows.FIB), "377. TERMINATE")
    )
    assert outputs == ["377\n"] and answer == "377. TERMINATE"


def test_plot_saved_to_named_file(kind: str, tmp_path: Path) -> None:
    _, outputs = run_with(kind, tmp_path, lambda env: agent_run(env, call(flows.PLOT), "done"))
    assert outputs == ["saved squares.png\nFiles: squares.png"]
    assert (tmp_path / "squares.png").read_bytes().startswith(b"\x89PNG")


def test_state_across_tool_calls(kind: str, tmp_path: Path) -> None:
    _, outputs = run_with(
        kind,
        tmp_path,
        lambda env: agent_run(env, call(flows.SET_STATE), call(flows.USE_STATE), "done"),
    )
    if kind == "kernel":
        assert outputs[1] == "42\n"
    else:
        assert "NameError" in outputs[1] and outputs[1].endswith("[exit code: 1]")


def test_bad_input(tmp_path: Path) -> None:
    async def body(env: KernelCodeEnvironment) -> list[Any]:
        unsupported = await env.run("puts 1", "ruby")
        mixed = [
            await env.run(f"echo b{i}", "bash")
            if i % 2
            else await env.run(f"print('b{i}')", "python")
            for i in range(10)
        ]
        return [unsupported, mixed]

    unsupported, mixed = run_with("command", tmp_path, body)
    assert unsupported.exit_code != 0 and "unsupported language: ruby" in unsupported.output
    assert [r.output.strip() for r in mixed] == [f"b{i}" for i in range(10)]
    # A model turn with no tool call (no code) simply ends the turn; nothing crashes.
    answer, outputs = run_with("command", tmp_path, lambda env: agent_run(env, "no code here"))
    assert answer == "no code here" and outputs == []


@pytest.mark.slow
def test_missing_module_then_pip_install(kind: str, pip_setup: PipSetup, tmp_path: Path) -> None:
    async def main() -> list[str]:
        core = make_async_executor(
            kind, python=pip_setup.python, env=pip_setup.env, work_dir=tmp_path, timeout=90
        )
        async with core, KernelCodeEnvironment(core) as env:
            _, outputs = await agent_run(
                env,
                call(flows.IMPORT_DEMO),
                call(flows.install_demo(pip_setup.wheel)),
                call(flows.IMPORT_DEMO),
                "done",
            )
        return outputs

    outputs = asyncio.run(main())
    assert "ModuleNotFoundError" in outputs[0]
    assert outputs[2] == "kxdemo says 42\n"


# -- issue 32.6: issue 32's AG2 list through AG2 1.x ---------------------------------------------
# AG2 1.x has no DEFAULT_EXECUTION_POLICY and no markdown extraction (code comes as a tool
# call's arguments), so 32.3 and 32.4 do not apply; the rest is checked side by side with its
# LocalEnvironment (behind AG2's own CodeAdapter, as SandboxCodeTool builds it).


def peer_run(path: Path, code: str, language: str) -> Any:
    from ag2.tools.code.tool import CodeAdapter
    from ag2.tools.sandbox import LocalEnvironment

    async def main() -> Any:
        return await CodeAdapter(LocalEnvironment(path)).run(code, language)  # type: ignore[arg-type]

    return asyncio.run(main())


def ours_run(path: Path, code: str, language: str, **options: Any) -> Any:
    async def main() -> Any:
        async with KernelCodeEnvironment(kind="command", work_dir=path, **options) as env:
            return await env.run(code, language)  # type: ignore[arg-type]

    return asyncio.run(main())


def test_a_missing_work_dir_chain_is_made_as_ag2_1x(tmp_path: Path) -> None:
    """AG2 1.x's LocalEnvironment makes the whole chain (``mkdir(parents=True)``), unlike
    classic AG2: a 1.x user asked for it, so kernelexec does the same here."""
    peer = peer_run(tmp_path / "peer" / "a" / "b", "print(1)", "python")
    ours = ours_run(tmp_path / "ours" / "a" / "b", "print(1)", "python")
    assert (
        (peer.exit_code, peer.output.strip()) == (ours.exit_code, ours.output.strip()) == (0, "1")
    )
    assert (tmp_path / "peer" / "a" / "b").is_dir() and (tmp_path / "ours" / "a" / "b").is_dir()


def test_dangerous_commands_run_as_in_ag2_1x_unless_refused(tmp_path: Path) -> None:
    """AG2 1.x checks no command (its SandboxShellTool has allow and block lists instead): the
    guard-rail is kernelexec's opt-in ``refuse_dangerous``, a failed result the model reads."""
    code = "touch ran.txt; exit 0\nrm -rf ./gone"
    peer = peer_run(tmp_path / "peer", code, "bash")
    ours = ours_run(tmp_path / "ours", code, "bash")
    assert peer.exit_code == ours.exit_code == 0
    assert (tmp_path / "peer" / "ran.txt").exists() and (tmp_path / "ours" / "ran.txt").exists()
    refused = ours_run(tmp_path / "guarded", code, "bash", refuse_dangerous=True)
    assert refused.exit_code != 0 and "Potentially dangerous command detected" in refused.output
    assert not (tmp_path / "guarded" / "ran.txt").exists()


@pytest.mark.docker
def test_docker_environment_and_labels_add_to_kernelexecs(
    tmp_path: Path, docker_ready: None
) -> None:
    """Issue 32.1 through AG2 1.x: ``run_kwargs``' environment and labels reach the container
    (the environment as AG2 1.x's DockerSandbox ``env_vars`` does), kernelexec's labels kept."""
    import uuid

    import docker

    from kernelexec.backends._owner import OWNER_LABEL

    team = uuid.uuid4().hex
    create = {"environment": {"GREETING": "hi"}, "labels": {"team": team, OWNER_LABEL: "forged"}}

    async def main() -> tuple[Any, dict[str, str]]:
        async with KernelCodeEnvironment(
            kind="docker-command", work_dir=tmp_path, run_kwargs=create
        ) as env:
            result = await env.run("echo $GREETING", "bash")
            client = docker.from_env()
            try:
                [container] = client.containers.list(filters={"label": f"team={team}"})
                return result, container.labels
            finally:
                client.close()

    result, labels = asyncio.run(main())
    assert (result.exit_code, result.output.strip()) == (0, "hi")
    assert labels["team"] == team and labels[OWNER_LABEL] != "forged"
