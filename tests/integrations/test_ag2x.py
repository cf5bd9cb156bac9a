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
        unsupported = await env.run("console.log(1)", "javascript")
        mixed = [
            await env.run(f"echo b{i}", "bash")
            if i % 2
            else await env.run(f"print('b{i}')", "python")
            for i in range(10)
        ]
        return [unsupported, mixed]

    unsupported, mixed = run_with("command", tmp_path, body)
    assert unsupported.exit_code != 0 and "unsupported language: javascript" in unsupported.output
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
