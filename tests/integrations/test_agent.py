"""The built-in writer/executor loop (`kernelexec.agent`) with scripted writers, on both
executor kinds: the seed flows end to end, bad input, approval, the notebook transcript."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernelexec import AsyncCommandLineExecutor, CodeBlock
from kernelexec.agent import (
    NO_CODE_REPLY,
    REFUSED_REPLY,
    STATEFUL_SYSTEM_PROMPT,
    STATELESS_SYSTEM_PROMPT,
    ApprovalRequest,
    Message,
    arun_chat,
    is_termination,
    run_chat,
)

from . import _fixtures as flows
from .conftest import PipSetup, sync_executor, venv_executor


def scripted(*replies: str) -> tuple[Callable[[list[Message]], str], list[list[Message]]]:
    """A writer that answers with ``replies`` in order, and the conversations it was shown."""
    seen: list[list[Message]] = []
    queue = list(replies)

    def model(messages: list[Message]) -> str:
        seen.append([dict(m) for m in messages])
        return queue.pop(0)

    return model, seen


def test_fibonacci_and_termination(shared_executor: Any, kind: str) -> None:
    model, seen = scripted(flows.FIB, "The 14th Fibonacci number is 377. TERMINATE")
    chat = run_chat("What is the 14th Fibonacci number?", model=model, executor=shared_executor)
    assert chat.stop_reason == "terminate"
    assert len(chat.turns) == 2
    first = chat.turns[0]
    assert first.result is not None and first.result.exit_code == 0
    assert first.result.output.strip() == "377"
    assert first.reply is not None and first.reply.startswith("exitcode: 0 (execution succeeded)")
    # The writer saw the system prompt for its executor, the task, then the executor's reply.
    prompt = STATEFUL_SYSTEM_PROMPT if kind == "kernel" else STATELESS_SYSTEM_PROMPT
    assert seen[0] == [
        {"role": "system", "content": prompt},
        {"role": "user", "content": "What is the 14th Fibonacci number?"},
    ]
    assert seen[1][-1]["role"] == "user" and "377" in seen[1][-1]["content"]
    assert chat.summary == "The 14th Fibonacci number is 377."


def test_plot_saved_in_work_dir_and_sent_as_image(shared_executor: Any, tmp_path: Path) -> None:
    model, seen = scripted(flows.PLOT, flows.DONE)
    notebook = tmp_path / "chat.ipynb"
    chat = run_chat(
        "Plot the squares and save the plot as squares.png",
        model=model,
        executor=shared_executor,
        send_images=True,
        notebook_path=notebook,
    )
    plot = shared_executor.work_dir / "squares.png"
    assert plot.read_bytes().startswith(b"\x89PNG")
    result = chat.turns[0].result
    assert result is not None and plot in result.files
    assert "Files: " in (chat.turns[0].reply or "") and "squares.png" in (chat.turns[0].reply or "")
    content = seen[1][-1]["content"]
    assert content[0]["type"] == "text" and content[0]["text"] == chat.turns[0].reply
    urls = [part["image_url"]["url"] for part in content[1:]]
    assert any(url.startswith("data:image/png;base64,") for url in urls)
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == 1 and "savefig" in code[0].source
    assert any("saved squares.png" in o.get("text", "") for o in code[0].outputs)


def test_state_across_turns(shared_executor: Any, kind: str) -> None:
    model, _ = scripted(flows.SET_STATE, flows.USE_STATE, flows.DONE)
    chat = run_chat("keep a number", model=model, executor=shared_executor)
    second = chat.turns[1].result
    assert second is not None
    if kind == "kernel":
        assert second.exit_code == 0 and second.output.strip() == "42"
    else:  # a process per block keeps nothing
        assert second.exit_code != 0 and second.error is not None
        assert second.error.ename == "NameError"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["command", "kernel"], indirect=False)
def test_missing_module_then_pip_install_from_local_wheel(
    kind: str, pip_setup: PipSetup, tmp_path: Path
) -> None:
    model, _ = scripted(
        flows.IMPORT_DEMO, flows.install_demo(pip_setup.wheel), flows.IMPORT_DEMO, flows.DONE
    )
    with venv_executor(kind, pip_setup, tmp_path / "work") as executor:
        chat = run_chat("use kxdemo_pkg", model=model, executor=executor)
    failed, install, again = (t.result for t in chat.turns[:3])
    assert failed is not None and failed.error is not None
    assert failed.error.ename == "ModuleNotFoundError"
    assert "ModuleNotFoundError" in (chat.turns[0].reply or "")
    assert install is not None and install.exit_code == 0, install.output
    assert again is not None and again.exit_code == 0, again.output
    assert again.output.strip() == "kxdemo says 42"
    site = pip_setup.python.parent.parent / "lib"
    assert list(site.glob("python*/site-packages/kxdemo_pkg/__init__.py"))


# -- bad input ------------------------------------------------------------------------------
def test_message_without_code_gets_a_clear_reply(shared_executor: Any) -> None:
    model, seen = scripted("I think the answer is probably 377.", flows.FIB, flows.DONE)
    chat = run_chat("fib", model=model, executor=shared_executor)
    assert chat.turns[0].reply == NO_CODE_REPLY and chat.turns[0].result is None
    assert seen[1][-1] == {"role": "user", "content": NO_CODE_REPLY}
    # The conversation carried on and the next reply's code ran.
    assert chat.turns[1].result is not None and "377" in chat.turns[1].result.output
    assert chat.stop_reason == "terminate"


def test_ten_blocks_of_mixed_languages_run_in_order(shared_executor: Any) -> None:
    blocks = []
    for i in range(10):
        if i % 2:
            blocks.append(f"```sh\necho block-{i}\n```")
        else:
            blocks.append(f"```python\nprint('block-{i}')\n```")
    message = "Here you go:\n\n" + "\n\nand\n\n".join(blocks)
    model, _ = scripted(message, flows.DONE)
    chat = run_chat("ten blocks", model=model, executor=shared_executor)
    result = chat.turns[0].result
    assert result is not None and result.exit_code == 0
    assert len(result.block_results) == 10
    assert [r.language for r in result.block_results] == ["python", "shell"] * 5
    lines = [line for line in result.output.splitlines() if line.startswith("block-")]
    assert lines == [f"block-{i}" for i in range(10)]
    assert len([c for c in chat.notebook.cells if c.cell_type == "code"]) == 10
    assert any(c.source.startswith("%%bash") for c in chat.notebook.cells if c.cell_type == "code")


def test_unsupported_language_is_reported_and_stops_the_message(shared_executor: Any) -> None:
    message = (
        "```python\nprint('before')\n```\n```ruby\nputs 'hi'\n```\n```python\nprint('after')\n```"
    )
    model, _ = scripted(message, flows.DONE)
    chat = run_chat("ruby", model=model, executor=shared_executor)
    result = chat.turns[0].result
    assert result is not None and result.exit_code != 0
    assert "before" in result.output and "after" not in result.output
    assert "unsupported language: ruby" in (chat.turns[0].reply or "")
    assert len(result.block_results) == 2  # the python block, then the refused ruby one


def test_refusing_approval_runs_nothing(shared_executor: Any) -> None:
    marker = shared_executor.work_dir / "refused-marker.txt"
    code = f"```python\nopen({str(marker)!r}, 'w').write('ran')\n```"
    requests: list[ApprovalRequest] = []

    def refuse(request: ApprovalRequest) -> bool:
        requests.append(request)
        return False

    model, seen = scripted(code, "Understood. TERMINATE")
    chat = run_chat("write a file", model=model, executor=shared_executor, approve=refuse)
    assert not marker.exists()
    assert len(requests) == 1 and requests[0].turn == 1
    assert requests[0].blocks == [CodeBlock(code=code.split("\n", 1)[1][:-4], language="python")]
    assert chat.turns[0].approved is False and chat.turns[0].result is None
    assert seen[1][-1]["content"] == REFUSED_REPLY
    md = [c.source for c in chat.notebook.cells if c.cell_type == "markdown"]
    assert any(REFUSED_REPLY in text for text in md)


def test_approval_granted_runs_the_code(shared_executor: Any) -> None:
    calls: list[Sequence[CodeBlock]] = []

    def allow(request: ApprovalRequest) -> bool:
        calls.append(request.blocks)
        return True

    model, _ = scripted(flows.FIB, flows.DONE)
    chat = run_chat("fib", model=model, executor=shared_executor, approve=allow)
    assert len(calls) == 1 and chat.turns[0].approved is True
    assert chat.turns[0].result is not None and chat.turns[0].result.output.strip() == "377"


def test_max_turns_stops_a_writer_that_never_terminates(shared_executor: Any) -> None:
    model, seen = scripted(*["```python\nprint('again')\n```"] * 5)
    chat = run_chat("loop", model=model, executor=shared_executor, max_turns=3)
    assert chat.stop_reason == "max_turns"
    assert len(chat.turns) == 3 and len(seen) == 3
    with pytest.raises(ValueError, match="max_turns"):
        run_chat("x", model=model, executor=shared_executor, max_turns=0)


def test_is_termination() -> None:
    assert is_termination("done. TERMINATE")
    assert is_termination("TERMINATE.\n")
    assert not is_termination("I will not TERMINATE yet, running more code")
    assert not is_termination("TERMINATED")


def test_async_loop_with_an_async_model(tmp_path: Path) -> None:
    replies = [flows.FIB, flows.DONE]

    async def model(messages: list[Message]) -> str:
        await asyncio.sleep(0)
        return replies.pop(0)

    async def main() -> str:
        async with AsyncCommandLineExecutor(work_dir=tmp_path, timeout=30) as executor:
            chat = await arun_chat("fib", model=model, executor=executor)
        result = chat.turns[0].result
        assert result is not None
        return result.output

    assert asyncio.run(main()).strip() == "377"


def test_default_executor_is_stateless_and_cleaned_up() -> None:
    model, seen = scripted(flows.FIB, flows.DONE)
    chat = run_chat("fib", model=model)
    assert seen[0][0]["content"] == STATELESS_SYSTEM_PROMPT
    result = chat.turns[0].result
    assert result is not None and result.code_file is not None
    assert not Path(result.code_file).parent.exists()  # its temporary work dir was removed


def test_displayed_plot_is_saved_and_sent(kind: str, tmp_path: Path) -> None:
    show = "```python\nimport matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()\n```"
    model, seen = scripted(show, flows.DONE)
    # A fresh executor: other tests switch the shared kernel's matplotlib to Agg.
    with sync_executor(kind, work_dir=tmp_path, timeout=60) as executor:
        chat = run_chat("show a plot", model=model, executor=executor, send_images=True)
    result = chat.turns[0].result
    assert result is not None and result.exit_code == 0
    content = seen[1][-1]["content"]
    # Both executors save the figure and name it (a stateless run's plt.show() saves it too),
    # so the model gets the text and the one image.
    saved = [p for p in result.files if p.suffix == ".png"]
    assert len(saved) == 1 and saved[0].name in (chat.turns[0].reply or "")
    assert isinstance(content, list) and len(content) == 2
