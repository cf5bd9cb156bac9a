"""Markdown message -> code blocks.

Fences follow CommonMark: a run of three or more backticks or tildes opens a block (indented by at
most three spaces); only a run of the same character, at least as long, closes it, so a longer
fence can hold shorter ones. An unclosed fence runs to the end of the message, as CommonMark says
(an LLM reply cut off mid-block still yields its code).

The info string's first word is the language. Aliases map to three canonical names: ``python``,
``shell`` and ``powershell``. Display-only languages (``text``, ``json``, ``output``...) are not
code to run and are dropped. An untagged block is Python when it compiles as Python; otherwise its
language is left empty and the executor reports it as not run.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterable
from typing import Any

from ._types import CodeBlock

LANGUAGE_ALIASES: dict[str, str] = {
    "python": "python",
    "py": "python",
    "python3": "python",
    "py3": "python",
    "ipython": "python",
    "ipython3": "python",
    "sh": "shell",
    "bash": "shell",
    "shell": "shell",
    "console": "shell",
    "zsh": "shell",
    "shellscript": "shell",
    "pwsh": "powershell",
    "powershell": "powershell",
    "ps1": "powershell",
    "ps": "powershell",
}

#: tags that mark text to show, not code to run
DISPLAY_ONLY = frozenset(
    {
        "text", "txt", "plaintext", "plain", "output", "out", "result", "log",
        "json", "jsonl", "yaml", "yml", "toml", "ini", "csv", "tsv", "xml", "html",
        "css", "svg", "markdown", "md", "diff", "patch", "mermaid", "math", "latex", "tex",
    }
)  # fmt: skip

# Only LF and CRLF end a line: str.splitlines() would also split code on form feeds, U+2028...
_LINE_END = re.compile(r"\r?\n")
_OPEN_RE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def normalize_language(tag: str) -> str:
    """Canonical language for an info-string tag: ``"py"`` -> ``"python"``; unknown tags kept
    lower-cased (so the executor can name them); an empty tag stays empty."""
    word = tag.strip().lstrip("{.").split(maxsplit=1)[0] if tag.strip() else ""
    word = word.rstrip("}").split(",")[0].lower()
    return LANGUAGE_ALIASES.get(word, word)


def looks_like_python(code: str) -> bool:
    """Whether an untagged block compiles as Python (IPython ``!``/``%`` lines excepted)."""
    lines = [ln for ln in code.splitlines() if not ln.lstrip().startswith(("!", "%"))]
    source = "\n".join(lines)
    if not source.strip():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for invalid escapes
            ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        # MemoryError / RecursionError: CPython's parser gives up on very deep nesting
        return False
    return True


def _fences(message: str) -> Iterable[tuple[str, str]]:
    """Yield (info string, content) for each fenced block in ``message``."""
    lines = _LINE_END.split(message)
    if lines[-1] == "":
        lines.pop()  # the message's final newline ends a line; it does not start one
    i = 0
    while i < len(lines):
        match = _OPEN_RE.match(lines[i])
        i += 1
        if match is None:
            continue
        fence, info, indent = match["fence"], match["info"].strip(), len(match["indent"])
        if fence[0] == "`" and "`" in info:
            continue  # CommonMark: a backtick fence's info string holds no backtick
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        while i < len(lines) and not close.match(lines[i]):
            line = lines[i]
            strip = min(indent, len(line) - len(line.lstrip(" ")))
            body.append(line[strip:])
            i += 1
        i += 1  # skip the closing fence (or step past the end)
        yield info, "\n".join(body)


def extract_code_blocks(message: str, *, keep_display_only: bool = False) -> list[CodeBlock]:
    """The fenced code blocks of a markdown ``message``, in order."""
    blocks: list[CodeBlock] = []
    for info, code in _fences(message or ""):
        language = normalize_language(info)
        if language in DISPLAY_ONLY and not keep_display_only:
            continue
        if not language:
            language = "python" if looks_like_python(code) else ""
        if not code.strip():
            continue
        blocks.append(CodeBlock(code=code, language=language))
    return blocks


class MarkdownCodeExtractor:
    """The ``code_extractor`` of every executor (AG2's ``CodeExtractor`` protocol).

    Accepts a string, or AG2/OpenAI-style content: a list of parts with ``{"type": "text"}``.
    """

    def extract_code_blocks(self, message: Any) -> list[CodeBlock]:
        return extract_code_blocks(_content_text(message))


def _content_text(message: Any) -> str:
    if message is None:
        return ""
    if isinstance(message, str):
        return message
    if isinstance(message, dict):
        return _content_text(message.get("content"))
    if isinstance(message, list):
        return "\n".join(_part_text(part) for part in message)
    return str(message)


def _part_text(part: Any) -> str:
    """The text of one content part; image and other non-text parts contribute nothing."""
    if isinstance(part, dict):
        text = part.get("text")
        return text if isinstance(text, str) else ""
    return part if isinstance(part, str) else ""
