"""AutoGen 0.4+: the kernelexec CodeExecutor in CodeExecutorAgent teams and behind
PythonCodeExecutionTool, writers scripted with ReplayChatCompletionClient (no LLM)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("autogen_agentchat", reason="the autogen extra is installed in CI")
pytest.importorskip("autogen_ext.models.replay", reason="the autogen extra is installed in CI")

from anyio.from_thread import BlockingPortal, start_blocking_portal
from autogen_agentchat.agents import (
    ApprovalRequest,
    ApprovalResponse,
    AssistantAgent,
    CodeExecutorAgent,
)
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import TextMessage, ToolCallExecutionEvent
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import CancellationToken, FunctionCall
from autogen_core.code_executor import CodeBlock, CodeExecutor
from autogen_core.models import CreateResult, ModelFamily, ModelInfo, RequestUsage
from autogen_ext.models.replay import ReplayChatCompletionClient
from autogen_ext.tools.code_execution import PythonCodeExecutionTool

from kernelexec import AsyncCommandLineExecutor
from kernelexec.integrations.autogen import KernelExecCodeExecutor, KernelExecCodeResult

from . import _fixtures as flows
from .conftest import PipSetup

T = TypeVar("T")

# What a replayed writer that calls tools claims to be.
TOOL_MODEL = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.UNKNOWN,
    structured_output=False,
)
Runner = Callable[[Callable[[], Awaitable[T]]], T]


@pytest.fixture(scope="module")
def portal() -> Iterator[BlockingPortal]:
    """One event loop for the module, so an async executor can serve several tests."""
    with start_blocking_portal() as p:
        yield p


@pytest.fixture(scope="module")
def adapter(portal: BlockingPortal, kind: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp(f"autogen-{kind}")
    executor = KernelExecCodeExecutor(kind=kind, work_dir=str(work), timeout=60)  # type: ignore[arg-type]
    portal.call(executor.start)
    yield executor
    portal.call(executor.stop)


def approve_all(request: ApprovalRequest) -> ApprovalResponse:
    return ApprovalResponse(approved=True, reason="test")


async def team_chat(executor: CodeExecutor, task: str, *replies: str) -> list[str]:
    """A writer (replayed) and a CodeExecutorAgent take turns until TERMINATE; return what the
    executor agent said each turn."""
    writer = AssistantAgent("writer", model_client=ReplayChatCompletionClient(list(replies)))
    runner = CodeExecutorAgent("executor", code_executor=executor, approval_func=approve_all)
    team = RoundRobinGroupChat(
        [writer, runner],
        termination_condition=TextMentionTermination("TERMINATE", sources=["writer"])
        | MaxMessageTermination(2 * len(replies) + 1),
    )
    result = await team.run(task=task)
    return [
        m.content for m in result.messages if isinstance(m, TextMessage) and m.source == "executor"
    ]


def test_dump_and_load_component(tmp_path: Path) -> None:
    executor = KernelExecCodeExecutor(kind="command", work_dir=str(tmp_path), timeout=12.5)
    model = executor.dump_component()
    assert model.provider == "kernelexec.integrations.autogen.KernelExecCodeExecutor"
    assert model.config == {"kind": "command", "work_dir": str(tmp_path), "timeout": 12.5}
    loaded = CodeExecutor.load_component(model)
    assert isinstance(loaded, KernelExecCodeExecutor)
    assert loaded.dump_component().config == model.config
    # Wrapping an executor records its settings; a temporary work dir is not carried over.
    core = AsyncCommandLineExecutor(timeout=7)
    config = KernelExecCodeExecutor(core).dump_component().config
    asyncio.run(core.close())  # removes its temporary work dir
    assert config["kind"] == "command" and config["timeout"] == 7 and "work_dir" not in config
    assert config["python"]
    # And a tool holding it serialises with it.
    tool = PythonCodeExecutionTool(executor)
    loaded_tool = PythonCodeExecutionTool.load_component(tool.dump_component())
    assert isinstance(loaded_tool, PythonCodeExecutionTool)


def test_fibonacci_through_code_executor_agent(portal: BlockingPortal, adapter: Any) -> None:
    heard = portal.call(team_chat, adapter, "fib 14", flows.FIB, flows.DONE)
    assert heard == ["377\n"]


def test_results_carry_files(portal: BlockingPortal, adapter: Any) -> None:
    blocks = [CodeBlock(code=flows.PLOT.split("\n", 1)[1].rsplit("```", 1)[0], language="python")]
    result = portal.call(adapter.execute_code_blocks, blocks, CancellationToken())
    assert isinstance(result, KernelExecCodeResult) and result.exit_code == 0
    plot = Path(adapter.work_dir) / "squares.png"
    assert plot in result.output_files and plot.read_bytes().startswith(b"\x89PNG")


def test_plot_through_the_team(portal: BlockingPortal, adapter: Any) -> None:
    plot = Path(adapter.work_dir) / "squares.png"
    plot.unlink(missing_ok=True)
    heard = portal.call(team_chat, adapter, "plot", flows.PLOT, flows.DONE)
    assert "saved squares.png" in heard[0] and plot.exists()


def test_state_across_turns(portal: BlockingPortal, adapter: Any, kind: str) -> None:
    heard = portal.call(team_chat, adapter, "state", flows.SET_STATE, flows.USE_STATE, flows.DONE)
    if kind == "kernel":
        assert heard[1] == "42\n"
    else:
        assert "NameError" in heard[1] and "exited with an error" in heard[1]


def test_python_code_execution_tool(portal: BlockingPortal, adapter: Any) -> None:
    code = flows.FIB.split("```python\n", 1)[1].rsplit("```", 1)[0]
    call = FunctionCall(id="call-1", name="CodeExecutor", arguments=json.dumps({"code": code}))
    script = [
        CreateResult(
            finish_reason="function_calls",
            content=[call],
            usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
            cached=False,
        ),
        "The 14th Fibonacci number is 377. TERMINATE",
    ]
    tool = PythonCodeExecutionTool(adapter)

    async def run() -> Any:
        agent = AssistantAgent(
            "coder",
            model_client=ReplayChatCompletionClient(script, model_info=TOOL_MODEL),
            tools=[tool],
            reflect_on_tool_use=True,
        )
        return await agent.run(task="fib 14")

    result = portal.call(run)
    executions = [m for m in result.messages if isinstance(m, ToolCallExecutionEvent)]
    assert len(executions) == 1
    assert executions[0].content[0].content.strip() == "377"
    assert not executions[0].content[0].is_error


def test_bad_input(portal: BlockingPortal, adapter: Any) -> None:
    # A writer message with no code: the agent says so, nothing crashes.
    heard = portal.call(team_chat, adapter, "talk", "Just words.", flows.DONE)
    assert heard == [CodeExecutorAgent.NO_CODE_BLOCKS_FOUND_MESSAGE]
    # Ten blocks of mixed languages run in order.
    blocks = [
        CodeBlock(code=f"echo b{i}", language="sh")
        if i % 2
        else CodeBlock(code=f"print('b{i}')", language="python")
        for i in range(10)
    ]
    result = portal.call(adapter.execute_code_blocks, blocks, CancellationToken())
    assert result.exit_code == 0
    assert [ln for ln in result.output.splitlines() if ln] == [f"b{i}" for i in range(10)]
    # A language the executor does not run.
    bad = [CodeBlock(code="puts 1", language="ruby")]
    result = portal.call(adapter.execute_code_blocks, bad, CancellationToken())
    assert result.exit_code != 0 and "unsupported language: ruby" in result.output


def test_refused_approval_runs_nothing(portal: BlockingPortal, adapter: Any) -> None:
    marker = Path(adapter.work_dir) / "autogen-refused.txt"
    code = f"open({str(marker)!r}, 'w').write('ran')"

    def refuse(request: ApprovalRequest) -> ApprovalResponse:
        return ApprovalResponse(approved=False, reason="not today")

    async def run() -> Any:
        agent = CodeExecutorAgent("executor", code_executor=adapter, approval_func=refuse)
        task = TextMessage(content=f"```python\n{code}\n```", source="writer")
        return await agent.on_messages([task], CancellationToken())

    response = portal.call(run)
    assert "not approved" in response.chat_message.content and not marker.exists()


async def outcome(adapter: Any, code: str, token: CancellationToken) -> str:
    """How a run ended, seen from inside the loop (the portal would translate the error)."""
    try:
        result = await adapter.execute_code_blocks([CodeBlock(code=code, language="python")], token)
    except asyncio.CancelledError:
        return "cancelled"
    return f"finished: {result.output}"


def test_cancellation_interrupts_the_running_block(
    portal: BlockingPortal, adapter: Any, kind: str
) -> None:
    token = CancellationToken()
    code = "import time\nkept = 'still here'\ntime.sleep(60)\nprint('not reached')"
    timer = threading.Timer(1.0, token.cancel)  # from another thread, as a UI would
    started = time.monotonic()
    timer.start()
    try:
        assert portal.call(outcome, adapter, code, token) == "cancelled"
    finally:
        timer.cancel()
    assert time.monotonic() - started < 15
    after = portal.call(outcome, adapter, "print(kept)", CancellationToken())
    if kind == "kernel":  # interrupted, not restarted: the kernel kept its variables
        assert after == "finished: still here\n"
    else:  # the process was killed; the executor still works
        assert after.startswith("finished") and "NameError" in after
    cancelled = CancellationToken()
    cancelled.cancel()
    marker = Path(adapter.work_dir) / "after-cancel.txt"
    code = f"open({str(marker)!r}, 'w').write('ran')"
    assert portal.call(outcome, adapter, code, cancelled) == "cancelled"
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["command", "kernel"])
def test_missing_module_then_pip_install(kind: str, pip_setup: PipSetup, tmp_path: Path) -> None:
    async def run() -> list[str]:
        from kernelexec import make_async_executor

        core = make_async_executor(
            kind, python=pip_setup.python, env=pip_setup.env, work_dir=tmp_path, timeout=90
        )
        async with KernelExecCodeExecutor(core) as executor:
            try:
                return await team_chat(
                    executor,
                    "use kxdemo_pkg",
                    flows.IMPORT_DEMO,
                    flows.install_demo(pip_setup.wheel),
                    flows.IMPORT_DEMO,
                    flows.DONE,
                )
            finally:
                await core.close()  # wrapped executors stay the caller's to close

    heard = asyncio.run(run())
    assert "ModuleNotFoundError" in heard[0]
    assert heard[2] == "kxdemo says 42\n"


def test_sync_executor_is_refused() -> None:
    from kernelexec import CommandLineExecutor

    with CommandLineExecutor() as sync, pytest.raises(TypeError, match="async executor"):
        KernelExecCodeExecutor(sync)  # type: ignore[arg-type]
