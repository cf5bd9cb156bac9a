"""A writer/executor conversation without any agent framework.

A *writer* (a model: any callable from chat messages to text) proposes code; the *executor*
(any kernelexec executor) runs the fenced blocks of each reply and answers with
``exitcode: ... / Code output: ...``, until the writer ends a reply with ``TERMINATE`` or
``max_turns`` replies were made. An approval hook may refuse a run (nothing runs, the writer is
told); the transcript is kept as a notebook::

    from kernelexec import CommandLineExecutor
    from kernelexec.agent import OpenAIChatModel, run_chat

    model = OpenAIChatModel("llama3.1", base_url="http://localhost:11434/v1")  # e.g. Ollama
    with CommandLineExecutor() as executor:
        chat = run_chat("What is the 14th Fibonacci number?", model=model, executor=executor)
    print(chat.summary)

Messages are OpenAI-style dicts (``{"role": ..., "content": ...}``): the writer is
``assistant``, the executor ``user``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import nbformat.v4
from nbformat import NotebookNode

from ._command import CommandLineExecutor
from ._executor import AsyncExecutor, SyncExecutor
from ._extract import extract_code_blocks
from ._session import META_KEY, session_cell, write_notebook
from ._types import CodeBlock, ExecutionResult

Message = dict[str, Any]
ModelReply = str | Awaitable[str]
Model = Callable[[list[Message]], ModelReply]
"""A writer: called with the conversation so far, returns the next reply (or an awaitable)."""

StopReason = Literal["terminate", "max_turns"]

# nbformat's builders are untyped; name their types once.
new_markdown_cell: Callable[..., NotebookNode] = nbformat.v4.new_markdown_cell
new_notebook: Callable[..., NotebookNode] = nbformat.v4.new_notebook

TERMINATE = "TERMINATE"

STATEFUL_SYSTEM_PROMPT = """\
You are a helpful assistant that solves tasks by writing code. The user runs every fenced code
block in your reply, in order, and answers with its exit code and output.
- Write Python in ```python blocks and shell commands in ```sh blocks.
- Python runs in one persistent IPython kernel: variables, functions and imports from earlier
  blocks are still there. Do not re-import modules or recompute values you already have; build on
  them.
- Plots and images you display are saved as image files and named in the reply. To keep a file,
  save it in the current directory under the name the task asks for.
- If a module is missing, install it with a ```sh block (pip install NAME), then carry on.
- If a block fails, read the error and send corrected code.
- When the task is done, give the answer and end your reply with TERMINATE."""

STATELESS_SYSTEM_PROMPT = """\
You are a helpful assistant that solves tasks by writing code. The user runs every fenced code
block in your reply, in order, and answers with its exit code and output.
- Write Python in ```python blocks and shell commands in ```sh blocks.
- Every block runs in a new process: nothing is kept between blocks. Each block must be complete:
  import what it uses and recompute or reload what it needs. Pass results between blocks through
  files in the current directory.
- Plots shown with plt.show() are saved as image files and named in the reply; to keep one under
  a name, save it with plt.savefig("name.png") in the current directory. New files are named in
  the reply.
- If a module is missing, install it with a ```sh block (pip install NAME), then carry on.
- If a block fails, read the error and send corrected code.
- When the task is done, give the answer and end your reply with TERMINATE."""

NO_CODE_REPLY = (
    "No code blocks found in your message, so nothing was run. Put code in fenced ```python or "
    "```sh blocks, or end your reply with TERMINATE if the task is done."
)
REFUSED_REPLY = (
    "Execution refused: the code was not approved, so nothing was run. Propose a different "
    "approach, or end your reply with TERMINATE."
)


@dataclass(frozen=True, kw_only=True)
class ApprovalRequest:
    """What an approval hook is shown before code runs."""

    blocks: list[CodeBlock]
    message: str
    turn: int


ApprovalHook = Callable[[ApprovalRequest], bool | Awaitable[bool]]
"""Called before each execution; False refuses it (no code runs)."""


@dataclass(frozen=True, kw_only=True)
class ChatTurn:
    """One writer reply and what the executor did with it."""

    writer: str
    blocks: list[CodeBlock] = field(default_factory=list)
    result: ExecutionResult | None = None
    reply: str | None = None  # the executor's answer; None when the chat ended here
    approved: bool | None = None  # None: no code, so nothing to approve


TurnCallback = Callable[[ChatTurn], None]
"""Called after each turn (e.g. to print the conversation as it goes)."""


@dataclass(frozen=True, kw_only=True)
class ChatResult:
    """A finished conversation."""

    task: str
    messages: list[Message]
    turns: list[ChatTurn]
    stop_reason: StopReason
    notebook: NotebookNode
    notebook_path: Path | None = None

    @property
    def summary(self) -> str:
        """The writer's last reply without the termination word."""
        if not self.turns:
            return ""
        return _strip_terminate(self.turns[-1].writer)

    @property
    def results(self) -> list[ExecutionResult]:
        return [t.result for t in self.turns if t.result is not None]


def system_prompt_for(kind: str) -> str:
    """The system prompt that suits an executor kind (``"kernel"`` is stateful)."""
    return STATEFUL_SYSTEM_PROMPT if kind == "kernel" else STATELESS_SYSTEM_PROMPT


def is_termination(message: str, word: str = TERMINATE) -> bool:
    """Whether ``message`` ends with the termination word (trailing punctuation allowed)."""
    return re.search(rf"\b{re.escape(word)}\W*\Z", message.strip()) is not None


def _strip_terminate(message: str, word: str = TERMINATE) -> str:
    return re.sub(rf"\s*\b{re.escape(word)}\W*\Z", "", message.strip())


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _Chat:
    """The state of one conversation; ``run`` drives it to the end."""

    def __init__(
        self,
        task: str,
        *,
        model: Model,
        executor: AsyncExecutor,
        max_turns: int,
        approve: ApprovalHook | None,
        system_prompt: str | None,
        send_images: bool,
        notebook_path: Path | None,
        termination: str,
        on_turn: TurnCallback | None,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.task = task
        self.model = model
        self.executor = executor
        self.max_turns = max_turns
        self.approve = approve
        self.send_images = send_images
        self.notebook_path = notebook_path
        self.termination = termination
        self.on_turn = on_turn
        prompt = system_prompt if system_prompt is not None else system_prompt_for(executor.kind)
        self.messages: list[Message] = [
            {"role": "system", "content": prompt},
            {"role": "user", "content": task},
        ]
        self.turns: list[ChatTurn] = []
        self.nb = new_notebook(
            metadata={
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                "language_info": {"name": "python"},
                META_KEY: {"executor": executor.kind, "system_prompt": prompt},
            }
        )
        self._cells = 0
        self._add_markdown(f"**Task**\n\n{task}")

    async def run(self) -> ChatResult:
        stop: StopReason = "max_turns"
        for number in range(1, self.max_turns + 1):
            # A sync model (an HTTP client) must not block the executor's event loop.
            writer = str(await _maybe_await(await asyncio.to_thread(self.model, self.messages)))
            self.messages.append({"role": "assistant", "content": writer})
            self._add_markdown(f"**Writer** (turn {number})\n\n{writer}")
            done = is_termination(writer, self.termination)
            blocks = extract_code_blocks(writer)
            if done and not blocks:
                self._record(ChatTurn(writer=writer))
                stop = "terminate"
                break
            self._record(await self._answer(writer, blocks, number))
            if done:  # code sent with the last word still runs, so its output is recorded
                stop = "terminate"
                break
        self._save()
        return ChatResult(
            task=self.task,
            messages=self.messages,
            turns=self.turns,
            stop_reason=stop,
            notebook=self.nb,
            notebook_path=self.notebook_path,
        )

    async def _answer(self, writer: str, blocks: list[CodeBlock], number: int) -> ChatTurn:
        if not blocks:
            return self._reply(ChatTurn(writer=writer, reply=NO_CODE_REPLY))
        if self.approve is not None:
            request = ApprovalRequest(blocks=blocks, message=writer, turn=number)
            verdict = await _maybe_await(await asyncio.to_thread(self.approve, request))
            if not verdict:
                turn = ChatTurn(writer=writer, blocks=blocks, reply=REFUSED_REPLY, approved=False)
                return self._reply(turn)
        result = await self.executor.execute_code_blocks(blocks)
        self._add_code_cells(blocks, result)
        reply = _reply_text(result, self.executor.work_dir)
        turn = ChatTurn(writer=writer, blocks=blocks, result=result, reply=reply, approved=True)
        return self._reply(turn)

    def _record(self, turn: ChatTurn) -> None:
        self.turns.append(turn)
        if self.on_turn is not None:
            self.on_turn(turn)

    def _reply(self, turn: ChatTurn) -> ChatTurn:
        assert turn.reply is not None
        content: Any = turn.reply
        if self.send_images and turn.result is not None:
            images = turn.result.image_parts()
            if images:
                content = [{"type": "text", "text": turn.reply}, *images]
        self.messages.append({"role": "user", "content": content})
        if turn.result is None:  # code cells show what ran; say in words what did not
            self._add_markdown(f"**Executor**\n\n{turn.reply}")
        self._save()
        return turn

    def _add_markdown(self, text: str) -> None:
        self.nb.cells.append(new_markdown_cell(text))

    def _add_code_cells(self, blocks: Sequence[CodeBlock], result: ExecutionResult) -> None:
        # One result per block that ran; blocks after a failure did not run and get no cell.
        per_block = result.block_results or [result]
        for block, block_result in zip(blocks, per_block, strict=False):
            self._cells += 1
            language = block_result.language or block.language
            self.nb.cells.append(
                session_cell(
                    block.code,
                    language,
                    block_result,
                    executor=self.executor.kind,
                    count=self._cells,
                )
            )

    def _save(self) -> None:
        if self.notebook_path is not None:
            write_notebook(self.nb, self.notebook_path)


def _reply_text(result: ExecutionResult, work_dir: Path) -> str:
    text = result.to_reply()
    if result.files:
        names = []
        for path in result.files:
            try:
                names.append(str(path.relative_to(work_dir)))
            except ValueError:
                names.append(str(path))
        text += "\nFiles: " + ", ".join(names)
    return text


async def arun_chat(
    task: str,
    *,
    model: Model,
    executor: AsyncExecutor,
    max_turns: int = 10,
    approve: ApprovalHook | None = None,
    system_prompt: str | None = None,
    send_images: bool = False,
    notebook_path: str | os.PathLike[str] | None = None,
    termination: str = TERMINATE,
    on_turn: TurnCallback | None = None,
) -> ChatResult:
    """Run the writer/executor conversation on ``executor`` (an async executor).

    ``send_images`` sends the images a block saved along with the reply, as content parts with
    data URLs (for vision models). ``notebook_path`` is rewritten after every turn.
    """
    chat = _Chat(
        task,
        model=model,
        executor=executor,
        max_turns=max_turns,
        approve=approve,
        system_prompt=system_prompt,
        send_images=send_images,
        notebook_path=None if notebook_path is None else Path(notebook_path).absolute(),
        termination=termination,
        on_turn=on_turn,
    )
    return await chat.run()


def run_chat(
    task: str,
    *,
    model: Model,
    executor: SyncExecutor[Any] | None = None,
    max_turns: int = 10,
    approve: ApprovalHook | None = None,
    system_prompt: str | None = None,
    send_images: bool = False,
    notebook_path: str | os.PathLike[str] | None = None,
    termination: str = TERMINATE,
    on_turn: TurnCallback | None = None,
) -> ChatResult:
    """Synchronous ``arun_chat``; without an executor a stateless one is made and closed."""
    if executor is None:
        with CommandLineExecutor() as own:
            return run_chat(
                task,
                model=model,
                executor=own,
                max_turns=max_turns,
                approve=approve,
                system_prompt=system_prompt,
                send_images=send_images,
                notebook_path=notebook_path,
                termination=termination,
                on_turn=on_turn,
            )
    # The conversation runs on the executor's own event-loop thread, next to its core.
    return executor.run(
        arun_chat,
        task,
        model=model,
        executor=executor.aio,
        max_turns=max_turns,
        approve=approve,
        system_prompt=system_prompt,
        send_images=send_images,
        notebook_path=notebook_path,
        termination=termination,
        on_turn=on_turn,
    )


class OpenAIChatModel:
    """A writer backed by any OpenAI-compatible chat completions server.

    ``base_url`` selects the server (OpenAI by default; e.g. ``http://localhost:11434/v1`` for
    Ollama, ``http://HOST:8000/v1`` for vLLM). The API key comes from ``api_key`` or the
    ``OPENAI_API_KEY`` environment variable, read when the model is built; local servers that
    want none get a placeholder. Needs ``pip install 'kernelexec[openai]'``.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        **params: Any,
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ImportError(
                "OpenAIChatModel needs the openai package: pip install 'kernelexec[openai]'"
            ) from exc
        key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
        self.model = model
        self.params = params
        self._client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout)

    def __call__(self, messages: list[Message]) -> str:
        response = self._client.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            **self.params,
        )
        return response.choices[0].message.content or ""

    def close(self) -> None:
        self._client.close()


def ask_on_terminal(request: ApprovalRequest) -> bool:
    """An approval hook for a person at a terminal: shows the code, asks y/N.

    End of input (no terminal) counts as a refusal.
    """
    print(f"\n--- code proposed in turn {request.turn} ---")
    for block in request.blocks:
        print(f"```{block.language}\n{block.code}\n```")
    try:
        answer = input("Run this code? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}


__all__ = [
    "NO_CODE_REPLY",
    "REFUSED_REPLY",
    "STATEFUL_SYSTEM_PROMPT",
    "STATELESS_SYSTEM_PROMPT",
    "TERMINATE",
    "ApprovalHook",
    "ApprovalRequest",
    "ChatResult",
    "ChatTurn",
    "Message",
    "Model",
    "OpenAIChatModel",
    "TurnCallback",
    "arun_chat",
    "ask_on_terminal",
    "is_termination",
    "run_chat",
    "system_prompt_for",
]
