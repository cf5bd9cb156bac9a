"""Classic AG2 (`autogen.coding`): kernelexec executors inside real ConversableAgent chats, the
writer scripted with a reply function (no LLM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("autogen.coding", reason="the ag2 extra is installed in CI (.ci/extras.sh)")

from autogen import Agent, ConversableAgent
from autogen.coding import CodeBlock as AG2CodeBlock
from autogen.coding import CodeExecutor, CodeResult

from kernelexec import CommandLineExecutor
from kernelexec.integrations.ag2 import AG2CodeExecutor, KernelExecCodeResult

from . import _fixtures as flows
from .conftest import PipSetup, venv_executor


def ag2_chat(executor: Any, task: str, *replies: str) -> list[str]:
    """Run a writer/executor chat in AG2; return what the executor agent replied each turn."""
    queue = list(replies)
    heard: list[str] = []

    def scripted_reply(
        recipient: ConversableAgent,
        messages: list[dict[str, Any]] | None = None,
        sender: Agent | None = None,
        config: Any = None,
    ) -> tuple[bool, str]:
        if messages and len(messages) > 1:
            heard.append(str(messages[-1]["content"]))
        return True, queue.pop(0)

    writer = ConversableAgent("writer", llm_config=False, human_input_mode="NEVER")
    writer.register_reply([Agent, None], scripted_reply, position=0)
    runner = ConversableAgent(
        "executor",
        llm_config=False,
        human_input_mode="NEVER",
        code_execution_config={"executor": executor},
        is_termination_msg=lambda msg: "TERMINATE" in str(msg.get("content") or ""),
    )
    runner.initiate_chat(writer, message=task, max_turns=len(replies) + 1)
    assert not queue, "the chat ended before the writer's script did"
    return heard


def test_executors_satisfy_the_protocol_unchanged(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path, timeout=30) as executor:
        assert isinstance(executor, CodeExecutor)
        heard = ag2_chat(executor, "fib 14", flows.FIB, flows.DONE)
    assert heard == ["exitcode: 0 (execution succeeded)\nCode output: 377\n"]


@pytest.fixture(scope="module")
def adapter(shared_executor: Any) -> AG2CodeExecutor:
    return AG2CodeExecutor(shared_executor)


def test_adapter_results_are_ag2_models(adapter: AG2CodeExecutor) -> None:
    blocks = adapter.code_extractor.extract_code_blocks(flows.PLOT)
    assert len(blocks) == 1 and isinstance(blocks[0], AG2CodeBlock)
    result = adapter.execute_code_blocks(blocks)
    assert isinstance(result, CodeResult) and isinstance(result, KernelExecCodeResult)
    assert result.exit_code == 0 and "saved squares.png" in result.output
    plot = adapter.executor.work_dir / "squares.png"
    assert str(plot) in result.output_files
    assert result.result is not None and result.result.exit_code == 0
    assert "result" not in result.model_dump()  # AG2 serialises only its own fields


def test_fibonacci_through_the_adapter(adapter: AG2CodeExecutor) -> None:
    heard = ag2_chat(adapter, "fib 14", flows.FIB, flows.DONE)
    assert heard == ["exitcode: 0 (execution succeeded)\nCode output: 377\n"]


def test_plot_saved_to_named_file(adapter: AG2CodeExecutor) -> None:
    plot = adapter.executor.work_dir / "squares.png"
    plot.unlink(missing_ok=True)
    heard = ag2_chat(adapter, "plot", flows.PLOT, flows.DONE)
    assert heard[0].startswith("exitcode: 0") and plot.read_bytes().startswith(b"\x89PNG")


def test_state_across_turns(adapter: AG2CodeExecutor, kind: str) -> None:
    heard = ag2_chat(adapter, "state", flows.SET_STATE, flows.USE_STATE, flows.DONE)
    if kind == "kernel":
        assert heard[1] == "exitcode: 0 (execution succeeded)\nCode output: 42\n"
    else:
        assert heard[1].startswith("exitcode: 1 (execution failed)") and "NameError" in heard[1]


def test_bad_input(adapter: AG2CodeExecutor) -> None:
    # No code: a clear result, no crash.
    empty = adapter.execute_code_blocks([])
    assert empty.exit_code == 0 and "No code blocks" in empty.output
    # Ten blocks, mixed languages, in order.
    message = "\n".join(
        f"```sh\necho b{i}\n```" if i % 2 else f"```python\nprint('b{i}')\n```" for i in range(10)
    )
    result = adapter.execute_code_blocks(adapter.code_extractor.extract_code_blocks(message))
    assert result.exit_code == 0
    assert [ln for ln in result.output.splitlines() if ln] == [f"b{i}" for i in range(10)]
    # An unsupported language: a failed result naming it.
    bad = adapter.execute_code_blocks([AG2CodeBlock(code="puts 1", language="ruby")])
    assert bad.exit_code != 0 and "unsupported language: ruby" in bad.output


def test_message_without_code_does_not_crash_the_chat(adapter: AG2CodeExecutor) -> None:
    heard = ag2_chat(adapter, "talk", "No code from me yet.", flows.FIB, flows.DONE)
    assert len(heard) == 2 and "377" in heard[1]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["command", "kernel"])
def test_missing_module_then_pip_install(kind: str, pip_setup: PipSetup, tmp_path: Path) -> None:
    with venv_executor(kind, pip_setup, tmp_path / "work") as executor:
        heard = ag2_chat(
            AG2CodeExecutor(executor),
            "use kxdemo_pkg",
            flows.IMPORT_DEMO,
            flows.install_demo(pip_setup.wheel),
            flows.IMPORT_DEMO,
            flows.DONE,
        )
    assert heard[0].startswith("exitcode: 1") and "ModuleNotFoundError" in heard[0]
    assert heard[1].startswith("exitcode: 0"), heard[1]
    assert heard[2] == "exitcode: 0 (execution succeeded)\nCode output: kxdemo says 42\n"


def test_restart_and_owned_executor(tmp_path: Path) -> None:
    with AG2CodeExecutor(kind="command", work_dir=tmp_path, timeout=30) as owned:
        assert owned.execute_code_blocks([AG2CodeBlock(code="print(1)", language="python")]).output
        owned.restart()
    assert owned.executor.closed
    with pytest.raises(ValueError, match="not both"):
        AG2CodeExecutor(CommandLineExecutor(), timeout=3)


MIXED_R = """Python writes the number, R doubles it.
```python
_ = open("n.txt", "w").write("21")
```
```r
n <- as.numeric(readLines("n.txt", warn = FALSE))
cat("doubled", n * 2, "\\n")
```
"""


def test_a_chat_reply_mixing_python_and_r_runs_both_in_one_session(tmp_path: Path) -> None:
    from kx_languages import need_kernels

    from kernelexec import KernelExecutor

    need_kernels("r")
    with KernelExecutor(work_dir=tmp_path, timeout=60) as executor:
        heard = ag2_chat(AG2CodeExecutor(executor), "mixed", MIXED_R, flows.DONE)
        assert executor.execute("cat(n)", "r").output == "21"  # R's state outlives the turn
    assert heard[0].startswith("exitcode: 0 (execution succeeded)") and "doubled 42" in heard[0]
