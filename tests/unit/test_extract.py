"""Markdown -> code blocks: fences, nesting, language aliases, inference, AG2-style content."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelexec import CodeBlock, MarkdownCodeExtractor, extract_code_blocks, normalize_language
from kernelexec._extract import (
    DISPLAY_ONLY,
    LANGUAGE_ALIASES,
    looks_like_python,
    looks_like_shell,
)

# -- fences -------------------------------------------------------------------------------------


def test_backtick_and_tilde_fences() -> None:
    message = "Run this:\n```python\nprint(1)\n```\nand this:\n~~~bash\necho hi\n~~~\ndone."
    assert extract_code_blocks(message) == [
        CodeBlock(code="print(1)", language="python"),
        CodeBlock(code="echo hi", language="shell"),
    ]


def test_longer_fence_holds_shorter_fences() -> None:
    message = "````python\nreadme = '''\n```sh\nls\n```\n'''\n````\n"
    [block] = extract_code_blocks(message)
    assert block.language == "python"
    assert block.code == "readme = '''\n```sh\nls\n```\n'''"


def test_fence_closes_only_with_same_character() -> None:
    message = "~~~python\nx = 1\n```\ny = 2\n~~~"
    [block] = extract_code_blocks(message)
    assert block.code == "x = 1\n```\ny = 2"


def test_closing_fence_may_be_longer_but_not_shorter() -> None:
    message = "````sh\necho a\n```\necho b\n``````\n"
    [block] = extract_code_blocks(message)
    assert block.code == "echo a\n```\necho b"


def test_unclosed_fence_runs_to_end_of_message() -> None:
    assert extract_code_blocks("text\n```py\nprint(1)\nprint(2)\n") == [
        CodeBlock(code="print(1)\nprint(2)", language="python")
    ]


def test_indented_fence_strips_its_indent_from_the_body() -> None:
    message = "1. step\n   ```python\n   if True:\n       print(1)\n   ```\n"
    [block] = extract_code_blocks(message)
    assert block.code == "if True:\n    print(1)"


def test_four_space_indented_fence_is_a_fence_unlike_commonmark() -> None:
    """CommonMark reads it as an indented code block holding the fence; LLMs mean code."""
    assert extract_code_blocks("    ```python\n    print(1)\n    ```\n") == [
        CodeBlock(code="print(1)", language="python")
    ]
    # Plain indented code (no fence in it) is still not a block to run.
    assert extract_code_blocks("    x = 1\n    print(x)\n") == []


def test_too_deeply_indented_fences_in_list_items_are_found() -> None:
    """Issue 32.4: a list item's fence indented past its content (a paragraph's continuation
    or an indented code block in CommonMark), with blank lines and nesting in the code."""
    message = (
        "1. First:\n\n        ```python\n        if True:\n            x = 6 * 7\n\n"
        "        print(x)\n        ```\n"
        "2. Then:\n         ```bash\n         echo done\n         ```\n"
        "3. And a fine one:\n   ```sh\n   echo fine\n   ```\n"
    )
    assert extract_code_blocks(message, canonical=False) == [
        CodeBlock(code="if True:\n    x = 6 * 7\n\nprint(x)", language="python"),
        CodeBlock(code="echo done", language="bash"),
        CodeBlock(code="echo fine", language="sh"),
    ]


def test_an_indented_fence_closes_at_any_indent_and_parsing_goes_on_after_it() -> None:
    message = "Text:\n    ```python\n    x = 1\n```\nmore\n```sh\necho 2\n```\n    ```py\n    y"
    assert extract_code_blocks(message) == [
        CodeBlock(code="x = 1", language="python"),
        CodeBlock(code="echo 2", language="shell"),
        CodeBlock(code="y", language="python"),  # unclosed: to the end, as a fence is
    ]


def test_several_indented_fences_in_one_paragraph_are_all_found() -> None:
    message = "Do:\n    ```python\n    x = 1\n    ```\n    ```sh\n    echo 2\n    ```\nthen"
    assert extract_code_blocks(message) == [
        CodeBlock(code="x = 1", language="python"),
        CodeBlock(code="echo 2", language="shell"),
    ]


def test_many_indented_fences_take_linear_time() -> None:
    """Each over-indented fence is read once: a long reply of them is not a quadratic parse
    (this took about half a minute for 1000 fences when each one re-parsed the rest)."""
    import time

    steps = "".join(f"step {i}:\n    ```python\n    x = {i}\n    ```\n" for i in range(1000))
    started = time.perf_counter()
    blocks = extract_code_blocks(steps)
    assert [b.code for b in blocks] == [f"x = {i}" for i in range(1000)]
    assert time.perf_counter() - started < 10  # about 0.1 s; generous for a loaded machine


def test_an_indented_fence_keeps_the_bodys_tabs_past_its_indent() -> None:
    assert extract_code_blocks("    ```python\n    \tx = 1\n      y\n    ```") == [
        CodeBlock(code="\tx = 1\n  y", language="python")
    ]


def test_fences_inside_list_items_are_extracted() -> None:
    # As LLMs write numbered steps: the fence indented 4 spaces under "1." (and 8 when nested).
    message = (
        "Steps:\n\n1. Install it:\n    ```bash\n    pip install x\n    ```\n"
        "2. Then run:\n    ```python\n    if True:\n        print(1)\n    ```\n"
        "   - nested:\n\n        ```sh\n        echo deep\n        ```\n"
    )
    assert extract_code_blocks(message) == [
        CodeBlock(code="pip install x", language="shell"),
        CodeBlock(code="if True:\n    print(1)", language="python"),
        CodeBlock(code="echo deep", language="shell"),
    ]


def test_fences_inside_block_quotes_are_extracted() -> None:
    message = "> Try:\n> ```python\n> x = 1\n>\n> print(x)\n> ```\n> > ```sh\n> > ls\n> > ```"
    assert extract_code_blocks(message) == [
        CodeBlock(code="x = 1\n\nprint(x)", language="python"),
        CodeBlock(code="ls", language="shell"),
    ]


def test_fence_right_after_an_html_line_is_a_fence() -> None:
    message = "<details>\n```python\nprint(1)\n```\n</details>"
    assert extract_code_blocks(message) == [CodeBlock(code="print(1)", language="python")]


def test_nul_and_lone_cr_stay_in_the_code() -> None:
    [block] = extract_code_blocks("```python\nx = 'a\x00b'\ry = 1\r\n```\r\n")
    assert block.code == "x = 'a\x00b'\ry = 1"


def test_tags_kept_as_written_when_not_canonical() -> None:
    message = "```bash\nls\n```\n```sh\nls\n```\n```Python3 title\nx\n```\n```json\n{}\n```"
    blocks = extract_code_blocks(message, canonical=False)
    assert [b.language for b in blocks] == ["bash", "sh", "Python3"]
    # untagged blocks are still inferred
    assert extract_code_blocks("```\nprint(1)\n```", canonical=False)[0].language == "python"


def test_backtick_in_info_string_is_not_a_fence() -> None:
    # CommonMark: "``` a`b" is inline code, not an opening fence; the next fence opens instead.
    message = "``` a`b\nprint(0)\n```python\nx = 1\n```"
    assert extract_code_blocks(message) == [CodeBlock(code="x = 1", language="python")]


def test_tilde_fence_info_string_may_hold_backticks() -> None:
    assert extract_code_blocks("~~~python `x`\ny = 2\n~~~") == [
        CodeBlock(code="y = 2", language="python")
    ]


def test_crlf_line_endings() -> None:
    message = "hi\r\n```python\r\nx = 1\r\nprint(x)\r\n```\r\n"
    assert extract_code_blocks(message) == [CodeBlock(code="x = 1\nprint(x)", language="python")]


def test_form_feed_in_code_is_not_a_line_break() -> None:
    [block] = extract_code_blocks("```python\nx = 1\x0c# page\n```")
    assert block.code == "x = 1\x0c# page"


def test_empty_and_blank_blocks_are_skipped() -> None:
    assert extract_code_blocks("```python\n```\n```sh\n   \n\n```") == []


def test_empty_message() -> None:
    assert extract_code_blocks("") == []
    assert extract_code_blocks("just prose, no code") == []


# -- languages ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("python", "python"),
        ("py", "python"),
        ("python3", "python"),
        ("ipython", "python"),
        ("Python", "python"),
        ("sh", "shell"),
        ("bash", "shell"),
        ("shell", "shell"),
        ("console", "shell"),
        ("zsh", "shell"),
        ("pwsh", "powershell"),
        ("powershell", "powershell"),
        ("ps1", "powershell"),
        ("python title='x.py'", "python"),
        ("{.python}", "python"),
        ("ruby", "ruby"),
        ("", ""),
    ],
)
def test_normalize_language(tag: str, expected: str) -> None:
    assert normalize_language(tag) == expected


def test_alias_in_fence_is_canonicalised() -> None:
    blocks = extract_code_blocks("```ipython\nx=1\n```\n```zsh\nls\n```\n```ps1\ndir\n```")
    assert [b.language for b in blocks] == ["python", "shell", "powershell"]


def test_unknown_language_is_kept_for_the_executor_to_name() -> None:
    assert extract_code_blocks("```Ruby\nputs 1\n```") == [
        CodeBlock(code="puts 1", language="ruby")
    ]


@pytest.mark.parametrize("tag", ["text", "json", "output", "yaml", "diff", "markdown"])
def test_display_only_blocks_are_dropped(tag: str) -> None:
    message = f'```{tag}\n{{"a": 1}}\n```\n```python\nprint(1)\n```'
    assert extract_code_blocks(message) == [CodeBlock(code="print(1)", language="python")]
    kept = extract_code_blocks(message, keep_display_only=True)
    assert [b.language for b in kept] == [tag, "python"]


def test_untagged_python_is_inferred() -> None:
    [block] = extract_code_blocks("```\nimport math\nprint(math.pi)\n```")
    assert block.language == "python"


def test_untagged_with_ipython_magics_is_python() -> None:
    [block] = extract_code_blocks("```\n%matplotlib inline\nx = 1\n```")
    assert block.language == "python"


def test_untagged_non_python_is_left_without_language() -> None:
    [block] = extract_code_blocks("```\nSELECT name FROM users;\n```")
    assert block == CodeBlock(code="SELECT name FROM users;", language="")


@pytest.mark.parametrize(
    "code",
    [
        "ls -la | head -2",  # valid Python (names and operators): IPython's automagic ran it
        "ls -la | grep foo && echo done",
        "pip install pandas",
        "cd /tmp\nls",
        "# the data\nwc -l data.csv\nhead -5 data.csv",
        "python -m pip install \\\n    pandas",
        "#!/bin/bash\nset -e\nmake all",
        'find . -name "*.py" | xargs wc -l',
    ],
)
def test_untagged_command_lines_are_shell(code: str) -> None:
    """One detector for every executor: a kernel and a command executor run it alike."""
    assert looks_like_shell(code)
    [block] = extract_code_blocks(f"```\n{code}\n```")
    assert block.language == "shell"


@pytest.mark.parametrize(
    "code",
    [
        *("df", "ls", "x = 1", "print(1)", "date - start", "test = 1", "total / n", "sort(x)"),
        *("import os\nls -la", "head = df.head(5)\nhead", "echo(1)", "cat"),
    ],
)
def test_python_that_shares_a_word_with_a_command_stays_python(code: str) -> None:
    assert not looks_like_shell(code)
    [block] = extract_code_blocks(f"```\n{code}\n```")
    assert block.language == ("python" if looks_like_python(code) else "")


@pytest.mark.parametrize(
    "source", ["-" * 100_000 + "1", "(" * 1000, "1+" * 200_000 + "1", "a\x00b", "!pip x"]
)
def test_looks_like_python_never_raises(source: str) -> None:
    assert looks_like_python(source) is False


# -- AG2 / OpenAI-style content ------------------------------------------------------------------


def test_list_content_parts() -> None:
    content = [
        {"type": "text", "text": "First:\n```python\nprint(1)\n```"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "```sh\necho 2\n```"},
        {"type": "text", "text": None},
    ]
    assert MarkdownCodeExtractor().extract_code_blocks(content) == [
        CodeBlock(code="print(1)", language="python"),
        CodeBlock(code="echo 2", language="shell"),
    ]


def test_message_dict_and_none() -> None:
    extractor = MarkdownCodeExtractor()
    assert extractor.extract_code_blocks({"role": "assistant", "content": "```py\nx\n```"}) == [
        CodeBlock(code="x", language="python")
    ]
    assert extractor.extract_code_blocks(None) == []
    assert extractor.extract_code_blocks({"content": None}) == []


# -- properties ---------------------------------------------------------------------------------

_FENCE_LIKE = re.compile(r"^\s*(```|~~~)")
# A prose line that opens a list item or a block quote: a fence after it would be inside that
# container (and its closing fence, less indented, outside): not what the generators mean.
_CONTAINER_LIKE = re.compile(r"^\s*([-+*]|\d{1,9}[.)])(\s|$)|^\s*>")
_line_chars = st.characters(exclude_characters="\r\n", exclude_categories=["Cs"])


def _defuse(line: str) -> str:
    """Make a generated line unable to open or close a fence, or to open a container."""
    return "x" + line if _FENCE_LIKE.match(line) or _CONTAINER_LIKE.match(line) else line


_lines = st.text(_line_chars, max_size=40).map(_defuse)
_bodies = st.lists(_lines, min_size=1, max_size=6).map(
    lambda lines: "\n".join(lines) if "".join(lines).strip() else "\n".join([*lines, "pass"])
)
_prose = st.lists(_lines, max_size=3).map("\n".join)
_tags = st.sampled_from(sorted(LANGUAGE_ALIASES))


@st.composite
def _fence_pair(draw: st.DrawFn, min_len: int = 3) -> tuple[str, str, str]:
    """(indent, opening fence, closing fence): same character, closing at least as long."""
    char = draw(st.sampled_from("`~"))
    length = draw(st.integers(min_len, min_len + 4))
    indent = " " * draw(st.integers(0, 3))
    closing = " " * draw(st.integers(0, 3)) + char * draw(st.integers(length, length + 3))
    return indent, char * length, closing + " " * draw(st.integers(0, 2))


def _render(indent: str, fence: str, tag: str, body: str, closing: str) -> str:
    indented = "\n".join(indent + line if line else line for line in body.split("\n"))
    return f"{indent}{fence}{tag}\n{indented}\n{closing}"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(_bodies, _tags, _fence_pair(), _prose), max_size=5),
    _prose,
    st.lists(st.sampled_from(sorted(DISPLAY_ONLY)), max_size=5),
)
def test_rendered_blocks_extract_back_exactly(
    specs: list[tuple[str, str, tuple[str, str, str], str]],
    lead: str,
    display_tags: list[str],
) -> None:
    parts, expected = [lead], []
    for i, (body, tag, (indent, fence, closing), prose) in enumerate(specs):
        parts.append(_render(indent, fence, tag, body, closing))
        if i < len(display_tags):  # a display-only block in between: never extracted
            parts.append(_render("", "```", display_tags[i], "shown, not run", "```"))
        parts.append(prose)
        expected.append(CodeBlock(code=body, language=LANGUAGE_ALIASES[tag]))
    assert extract_code_blocks("\n".join(parts)) == expected


@st.composite
def _nested(draw: st.DrawFn) -> tuple[str, str]:
    """A message whose one block holds shorter same-character fences and other-character ones."""
    indent, fence, closing = draw(_fence_pair(min_len=4))
    char, other = fence[0], "~" if fence[0] == "`" else "`"
    inner = st.one_of(
        _lines,
        st.integers(3, len(fence) - 1).map(lambda n: char * n),
        st.integers(3, len(fence) - 1).map(lambda n: char * n + "python"),
        st.integers(3, 9).map(lambda n: other * n),
    )
    lines = draw(st.lists(inner, min_size=1, max_size=8))
    body = "\n".join([*lines, "x = 1"])
    return _render(indent, fence, "python", body, closing), body


@settings(max_examples=100, deadline=None)
@given(_nested(), _prose)
def test_nested_shorter_fences_stay_in_the_body(nested: tuple[str, str], prose: str) -> None:
    message, body = nested
    assert extract_code_blocks(f"{prose}\n{message}\n{prose}") == [
        CodeBlock(code=body, language="python")
    ]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text: str) -> None:
    for block in extract_code_blocks(text):
        assert block.code.strip()
        assert block.language not in DISPLAY_ONLY


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.text(), st.none(), st.integers(), st.dictionaries(st.text(), st.text())))
)
def test_extractor_never_raises_on_odd_content(parts: list[object]) -> None:
    MarkdownCodeExtractor().extract_code_blocks(parts)


@st.composite
def _container(draw: st.DrawFn) -> tuple[str, str]:
    """A list item or block quote prefix for a fence: (first line prefix, continuation)."""
    kind = draw(st.sampled_from(["-", "*", "1.", "10)", ">"]))
    if kind == ">":
        return "> ", "> "
    marker = kind + " " * draw(st.integers(1, 4))  # 5 spaces would make indented code
    return marker, " " * len(marker)


@settings(max_examples=100, deadline=None)
@given(_bodies, _tags, _container(), _prose)
def test_blocks_in_lists_and_quotes_extract_back_exactly(
    body: str, tag: str, container: tuple[str, str], prose: str
) -> None:
    first, rest = container
    lines = [f"```{tag}", *body.split("\n"), "```"]
    rendered = "\n".join([first + lines[0], *(rest + line for line in lines[1:])])
    message = f"{prose}\n\n{rendered}\n\n{prose}"
    assert extract_code_blocks(message) == [CodeBlock(code=body, language=LANGUAGE_ALIASES[tag])]


@settings(max_examples=100, deadline=None)
@given(_bodies, _tags, st.integers(4, 9), _prose, st.booleans())
def test_over_indented_blocks_extract_back_exactly(
    body: str, tag: str, indent: int, prose: str, blank: bool
) -> None:
    """Issue 32.4: a fence indented four spaces or more, right after prose (a paragraph's
    continuation in CommonMark) or after a blank line (an indented code block)."""
    rendered = _render(" " * indent, "```", tag, body, " " * indent + "```")
    gap = "\n\n" if blank else "\n"
    message = f"{prose}{gap}{rendered}\n\n{prose}"
    assert extract_code_blocks(message) == [CodeBlock(code=body, language=LANGUAGE_ALIASES[tag])]
