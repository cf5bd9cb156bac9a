"""Markdown message -> code blocks.

Code blocks are found as a CommonMark parser finds them (markdown-it-py): fences of three or more
backticks or tildes, closed only by a run of the same character at least as long (so a longer
fence can hold shorter ones), inside list items and block quotes too, as LLMs write numbered
steps. An unclosed fence runs to the end of its container, as CommonMark says (an LLM reply cut
off mid-block still yields its code). Raw HTML is read as text, so a fence right after a
``<details>`` line is still a fence.

One deliberate difference from CommonMark: a fence indented by four spaces or more (relative
to its container) is still a fence. CommonMark reads it as an indented code block (or, after a
prose line, as more of that paragraph), whose text is the fence itself; LLMs write such fences
inside list items with too deep an indent, and AG2's extractor (a regular expression) finds
them. Such a fence runs to the next fence line of the same character at least as long, at any
indent (to the end of the message when there is none), and each of its lines loses up to the
opening fence's indent, as a fence's body does.

The info string's first word is the language. Aliases map to canonical names: ``python``,
``shell``, ``powershell``, ``r``, ``javascript`` and ``typescript`` (``canonical=False`` keeps the
tag as written, for frameworks that dispatch on it). Display-only languages (``text``, ``json``,
``output``...) are not code to run and are dropped. An untagged block is shell when it reads as
command lines (``looks_like_shell``: ``ls -la | head -2`` is valid Python too, but no one means it
as Python), else Python when it compiles as Python; otherwise its language is left empty and the
executor reports it as not run. Every executor gets its blocks from here, so an untagged block
runs the same way on a kernel (no IPython automagic guessing) and on a command executor.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._types import CodeBlock

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

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
    # kernels of their own in a stateful session (``_languages``), interpreters on a command one
    "r": "r",
    "javascript": "javascript",
    "js": "javascript",
    "node": "javascript",
    "typescript": "typescript",
    "ts": "typescript",
}

#: tags that mark text to show, not code to run
DISPLAY_ONLY = frozenset(
    {
        "text", "txt", "plaintext", "plain", "output", "out", "result", "log",
        "json", "jsonl", "yaml", "yml", "toml", "ini", "csv", "tsv", "xml", "html",
        "css", "svg", "markdown", "md", "diff", "patch", "mermaid", "math", "latex", "tex",
    }
)  # fmt: skip


def normalize_language(tag: str) -> str:
    """Canonical language for an info-string tag: ``"py"`` -> ``"python"``; unknown tags kept
    lower-cased (so the executor can name them); an empty tag stays empty."""
    word = _tag_word(tag).lower()
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


# Commands an agent writes untagged; a line must start with one of them to read as shell.
_COMMANDS = frozenset(
    {
        "apt", "apt-get", "awk", "bash", "cat", "cd", "chmod", "conda", "cp", "curl", "cut",
        "date", "df", "diff", "du", "echo", "env", "export", "file", "find", "free", "git",
        "grep", "gunzip", "gzip", "head", "hostname", "id", "jq", "kill", "less", "ln", "ls",
        "make", "mkdir", "mv", "nproc", "npm", "pip", "pip3", "printf", "ps", "pwd", "python",
        "python3", "rm", "rmdir", "sed", "sh", "sleep", "sort", "stat", "tail", "tar", "tee",
        "touch", "tr", "uname", "uniq", "unzip", "uv", "wc", "wget", "which", "whoami", "xargs",
        "zip",
    }
)  # fmt: skip
_SHEBANG = re.compile(r"#!\s*\S*/(?:env\s+)?(?:ba|da|z|k)?sh\b")
# in valid Python, what only a command line has: a flag (-la, -2), a path argument (/tmp),
# a pipe or a redirect
_COMMAND_MARK = re.compile(r"\s-{1,2}[A-Za-z0-9]|\s\.{0,2}/\w|\||>")
# the nodes of ``ls -la | head -2`` read as Python: names, numbers and operators, no more
_OPERATOR_NODES = (
    ast.Module, ast.Expr, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Constant,
    ast.operator, ast.unaryop, ast.cmpop, ast.expr_context,
)  # fmt: skip


def looks_like_shell(code: str) -> bool:
    """Whether an untagged block is shell: a ``#!`` line naming a shell, or every line
    (comments and blank lines aside) a command line: a common command with arguments that is
    not Python, or is Python only by accident (``ls -la | head -2``: names and operators, with
    a flag or a pipe). A bare word (``df``) alone stays Python: it is as often a variable."""
    lines = [line.strip() for line in code.replace("\\\n", " ").splitlines()]
    significant = [line for line in lines if line and not line.startswith("#")]
    first = next((line for line in lines if line), "")
    if _SHEBANG.match(first):
        return True
    with_arguments = [line for line in significant if line not in _COMMANDS]
    # bare words (``ls``, ``pwd``) count among command lines, never alone
    return bool(with_arguments) and all(_command_line(line) for line in with_arguments)


def _command_line(line: str) -> bool:
    word, _, rest = line.partition(" ")
    if word not in _COMMANDS or not rest.strip():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(line)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return True  # not Python: a command with its arguments
    only_operators = all(isinstance(node, _OPERATOR_NODES) for node in ast.walk(tree))
    return only_operators and _COMMAND_MARK.search(line) is not None


@functools.cache
def _parser() -> MarkdownIt:
    # CommonMark block rules only: inline parsing is not needed to find fences, and raw HTML off
    # so an HTML line does not swallow the fence after it. Imported here: start-up time.
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).disable("inline")


def _protect(message: str) -> tuple[str, dict[str, str]]:
    """Stand-ins for what the parser would rewrite: only LF and CRLF end a line (a lone CR, a
    form feed or U+2028 stays in the code) and NUL is kept, not replaced by U+FFFD."""
    if "\x00" not in message and "\r" not in message.replace("\r\n", ""):
        return message, {}
    used = set(message)
    free = (chr(c) for c in range(0xE000, 0xF900) if chr(c) not in used)
    swaps: dict[str, str] = {}
    for char in ("\x00", "\r"):
        if char in used:
            swaps[char] = next(free)
    message = message.replace("\r\n", "\n")
    for char, stand_in in swaps.items():
        message = message.replace(char, stand_in)
    return message, {stand_in: char for char, stand_in in swaps.items()}


# An opening fence line at any indent: (indent, fence run, info string).
_OPENING = re.compile(r"^([ \t]*)(`{3,}|~{3,})(.*)$")


# Parses afresh after an over-indented fence whose lines CommonMark read as another fence:
# each costs a parse of the rest of the message, so a message crafted to need many would
# take quadratic time; past this many, such a fence's rest is read as CommonMark reads it.
_MAX_REPARSES = 16


def _fences(message: str) -> Iterable[tuple[str, str]]:
    """Yield (info string, content) for each fenced block in ``message``."""
    text, restore = _protect(message)
    lines = text.split("\n")
    found: list[tuple[str, str]] = []
    start: int | None = 0
    reparses = 0
    while start is not None:
        start = _fences_from(lines, start, found, resync=reparses < _MAX_REPARSES)
        reparses += 1
    for info, code in found:
        for stand_in, char in restore.items():
            info, code = info.replace(stand_in, char), code.replace(stand_in, char)
        yield info, code


def _fences_from(
    lines: list[str], start: int, found: list[tuple[str, str]], *, resync: bool
) -> int | None:
    """Add the fences of ``lines[start:]`` to ``found``: CommonMark's, and the over-indented
    ones (see the module's docstring) in its paragraphs and indented code blocks. Returns the
    line to parse afresh from when CommonMark read an over-indented fence's closing line as the
    start of a fence of its own (None: done)."""
    consumed = start  # lines before this one are read (an over-indented fence's included)
    for token in _parser().parse("\n".join(lines[start:])):
        if not token.map:
            continue
        first, end = start + token.map[0], start + token.map[1]
        if token.type == "fence":
            if first >= consumed:
                code = token.content
                found.append((token.info.strip(), code[:-1] if code.endswith("\n") else code))
            elif end > consumed and resync:
                return consumed
        elif token.type in ("paragraph_open", "code_block") and end > consumed:
            at = max(first, consumed)
            while (over := _indented_fence(lines, at, end)) is not None:
                info, code, at = over
                found.append((info, code))
                consumed = at
    return None


def _indent_width(space: str) -> int:
    return len(space.expandtabs(4))


def _indented_fence(lines: list[str], start: int, end: int) -> tuple[str, str, int] | None:
    """The first fence opened in ``lines[start:end]`` (a paragraph or an indented code block,
    where CommonMark sees none: it is indented four spaces or more): (info, code, the line
    after it)."""
    for number in range(start, end):
        match = _OPENING.match(lines[number])
        if match is None or (match.group(2)[0] == "`" and "`" in match.group(3)):
            continue
        indent, fence = _indent_width(match.group(1)), match.group(2)
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        after = len(lines)
        for later in range(number + 1, len(lines)):
            if closing.match(lines[later]):
                after = later + 1
                break
            body.append(_dedent(lines[later], indent))
        return match.group(3).strip(), "\n".join(body), after
    return None


def _dedent(line: str, width: int) -> str:
    """``line`` without up to ``width`` columns of its leading white space (a tab that goes
    past ``width`` leaves the rest of its columns as spaces, as CommonMark does)."""
    column = index = 0
    while index < len(line) and column < width and line[index] in " \t":
        column = column + 1 if line[index] == " " else (column // 4 + 1) * 4
        index += 1
    return " " * max(column - width, 0) + line[index:]


def _tag_word(tag: str) -> str:
    """The info string's first word as written: ``"{.Python}"`` -> ``"Python"``."""
    word = tag.strip().lstrip("{.").split(maxsplit=1)[0] if tag.strip() else ""
    return word.rstrip("}").split(",")[0]


def extract_code_blocks(
    message: str, *, keep_display_only: bool = False, canonical: bool = True
) -> list[CodeBlock]:
    """The fenced code blocks of a markdown ``message``, in order.

    ``canonical=False`` keeps each tag as written (``bash`` stays ``bash``) instead of mapping it
    to kernelexec's canonical name; an untagged block is still inferred.
    """
    blocks: list[CodeBlock] = []
    for info, code in _fences(message or ""):
        language = normalize_language(info)
        if language in DISPLAY_ONLY and not keep_display_only:
            continue
        if not code.strip():
            continue
        if not language:
            language = _untagged_language(code)
        elif not canonical:
            language = _tag_word(info)
        blocks.append(CodeBlock(code=code, language=language))
    return blocks


def _untagged_language(code: str) -> str:
    """The one detector for untagged blocks, whichever executor runs them."""
    if looks_like_shell(code):
        return "shell"
    return "python" if looks_like_python(code) else ""


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
