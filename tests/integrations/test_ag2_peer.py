"""The AG2 adapter behaves as AG2's own executors do (issue 14, 1-7; issue 19.3): each
behaviour is checked through the adapter, and where it is cheap, against the real AG2 executor
installed next to it."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from kx_python import relative_python

pytest.importorskip("autogen.coding", reason="the ag2 extra is installed in CI (.ci/extras.sh)")

from autogen.coding import CodeBlock, LocalCommandLineCodeExecutor, MarkdownCodeExtractor

from kernelexec import KernelExecError, UnknownExecutor
from kernelexec._registry import EXECUTOR_NAMES
from kernelexec.integrations.ag2 import AG2CodeExecutor

from . import _fixtures as flows
from .test_ag2 import ag2_chat

KINDS = ["command", "kernel"]


@pytest.fixture(params=KINDS)
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with AG2CodeExecutor(kind=request.param, work_dir=tmp_path / "ours", timeout=60) as a:
        yield a


def peer(tmp_path: Path, **kwargs: Any) -> LocalCommandLineCodeExecutor:
    return LocalCommandLineCodeExecutor(work_dir=tmp_path / "peer", timeout=60, **kwargs)


# -- 14.1 / 14.2: extraction --------------------------------------------------------------------

MESSAGE = "Run:\n```bash\necho one\n```\n```sh\necho two\n```\n```python\nprint(3)\n```\n"


def test_language_tags_are_kept_as_written_as_ag2(adapter: AG2CodeExecutor) -> None:
    ours = adapter.code_extractor.extract_code_blocks(MESSAGE)
    theirs = MarkdownCodeExtractor().extract_code_blocks(MESSAGE)
    assert [(b.code, b.language) for b in ours] == [(b.code, b.language) for b in theirs]
    assert [b.language for b in ours] == ["bash", "sh", "python"]
    result = adapter.execute_code_blocks(ours)
    assert result.exit_code == 0 and result.output.split() == ["one", "two", "3"]


def test_untagged_command_lines_are_sh_as_ag2(adapter: AG2CodeExecutor) -> None:
    message = "```\npython -c 'print(6 * 7)'\n```\n```\nprint('py')\n```"
    ours = adapter.code_extractor.extract_code_blocks(message)
    theirs = MarkdownCodeExtractor().extract_code_blocks(message)
    assert [b.language for b in ours] == [b.language for b in theirs] == ["sh", "python"]
    result = adapter.execute_code_blocks(ours)
    assert result.exit_code == 0 and result.output.split() == ["42", "py"]


def test_fences_in_numbered_steps_are_extracted_and_run(adapter: AG2CodeExecutor) -> None:
    message = (
        "1. First:\n    ```python\n    x = 6 * 7\n    print(x)\n    ```\n"
        "2. Then:\n    ```bash\n    echo done\n    ```\n"
    )
    blocks = adapter.code_extractor.extract_code_blocks(message)
    assert [(b.code, b.language) for b in blocks] == [
        ("x = 6 * 7\nprint(x)", "python"),
        ("echo done", "bash"),
    ]
    result = adapter.execute_code_blocks(blocks)
    assert result.exit_code == 0 and result.output.split() == ["42", "done"]


# -- 14.3: execution policies ------------------------------------------------------------------


def test_html_and_javascript_are_saved_not_run_as_ag2(
    adapter: AG2CodeExecutor, tmp_path: Path
) -> None:
    blocks = [
        CodeBlock(code="<h1>hello</h1>", language="html"),
        CodeBlock(code="console.log('x')", language="javascript"),
    ]
    theirs = peer(tmp_path).execute_code_blocks(blocks)
    ours = adapter.execute_code_blocks(blocks)
    assert ours.exit_code == theirs.exit_code == 0
    saved = [line for line in ours.output.splitlines() if line]
    assert len(saved) == 2 and all(line.startswith("Code saved to ") for line in saved)
    assert all(line.startswith("Code saved to ") for line in theirs.output.splitlines() if line)
    html = Path(saved[0].removeprefix("Code saved to "))
    assert html.suffix == ".html" and html.read_text() == "<h1>hello</h1>"
    assert html.parent == adapter.executor.work_dir.resolve()
    assert ours.code_file == str(html)


HTML_MESSAGE = (
    "Here is the page and its style:\n```html\n<h1>hello</h1>\n```\n"
    "```css\nh1 { color: red; }\n```\n"
)


def test_html_and_css_in_a_message_are_saved_in_a_chat_as_ag2(
    adapter: AG2CodeExecutor, tmp_path: Path
) -> None:
    # The whole path: the agent extracts the blocks with the executor's extractor (kernelexec's
    # native extraction drops html and css as display-only), then the executor saves them.
    theirs = ag2_chat(peer(tmp_path), "a page", HTML_MESSAGE, flows.DONE)
    ours = ag2_chat(adapter, "a page", HTML_MESSAGE, flows.DONE)

    def files(heard: list[str]) -> list[Path]:
        return [Path(p) for p in re.findall(r"Code saved to (\S+)", heard[0])]

    def shape(heard: list[str], work_dir: Path) -> str:
        text = heard[0].replace(str(work_dir.resolve()), "WORK")
        return re.sub(r"tmp_code_\w+\.", "tmp_code_HASH.", text)

    expected = (
        "exitcode: 0 (execution succeeded)\nCode output: "
        "Code saved to WORK/tmp_code_HASH.html\nCode saved to WORK/tmp_code_HASH.css\n"
    )
    assert shape(theirs, tmp_path / "peer") == expected
    if not adapter.stateful:  # a kernel joins blocks' outputs with a newline, as AG2's IPython
        assert shape(ours, adapter.executor.work_dir) == expected
    assert len(files(ours)) == 2
    contents = ["<h1>hello</h1>", "h1 { color: red; }"]
    assert [f.read_text() for f in files(ours)] == [f.read_text() for f in files(theirs)]
    assert [f.read_text() for f in files(ours)] == contents
    assert all(f.parent == adapter.executor.work_dir.resolve() for f in files(ours))


def test_only_the_policies_languages_among_display_ones_are_kept(tmp_path: Path) -> None:
    message = "```html\n<p>x</p>\n```\n```json\n{}\n```\n```text\nplain\n```\n"
    with AG2CodeExecutor(kind="command", work_dir=tmp_path) as adapter:
        assert [b.language for b in adapter.code_extractor.extract_code_blocks(message)] == ["html"]
        adapter.execution_policies["json"] = False  # a language given a policy is kept too
        kept = adapter.code_extractor.extract_code_blocks(message)
    assert [b.language for b in kept] == ["html", "json"]
    assert [b.language for b in MarkdownCodeExtractor().extract_code_blocks(message)] == [
        "html",
        "json",
        "text",
    ]  # AG2 keeps them all, then fails on the first it cannot run ("unknown language")


def test_execution_policies_override_per_language(tmp_path: Path) -> None:
    with AG2CodeExecutor(
        kind="command", work_dir=tmp_path, execution_policies={"python": False}
    ) as adapter:
        result = adapter.execute_code_blocks(
            [CodeBlock(code="# out.py\nopen('ran.txt', 'w')", language="python")]
        )
        assert adapter.execution_policies["html"] is False
    assert result.exit_code == 0 and result.output == f"Code saved to {tmp_path / 'out.py'}\n"
    assert (tmp_path / "out.py").exists() and not (tmp_path / "ran.txt").exists()


# -- 14.4: AG2's first-line file names ---------------------------------------------------------


def test_first_line_file_name_is_honoured_as_ag2(tmp_path: Path) -> None:
    block = [CodeBlock(code="# test.py\nprint('from test.py')", language="python")]
    theirs = peer(tmp_path).execute_code_blocks(block)
    with AG2CodeExecutor(kind="command", work_dir=tmp_path / "ours") as adapter:
        ours = adapter.execute_code_blocks(block)
    assert ours.exit_code == theirs.exit_code == 0
    assert ours.output == theirs.output == "from test.py\n"
    assert theirs.code_file is not None and ours.code_file is not None
    assert Path(theirs.code_file).name == Path(ours.code_file).name == "test.py"
    assert (tmp_path / "ours" / "test.py").exists()


def test_first_line_file_name_stays_inside_the_work_dir(tmp_path: Path) -> None:
    block = [CodeBlock(code="# ../escape.py\nprint('no')", language="python")]
    theirs = peer(tmp_path).execute_code_blocks(block)
    with AG2CodeExecutor(kind="command", work_dir=tmp_path / "ours") as adapter:
        ours = adapter.execute_code_blocks(block)
    assert ours.exit_code == theirs.exit_code == 1
    assert "escapes the work dir" in ours.output
    assert not (tmp_path / "escape.py").exists()


# -- 14.5: timeout and work_dir ----------------------------------------------------------------


def test_timeout_and_work_dir_as_given_as_ag2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    theirs = LocalCommandLineCodeExecutor(work_dir="coding", timeout=7)
    with AG2CodeExecutor(kind="command", work_dir="coding", timeout=7) as ours:
        assert ours.work_dir == theirs.work_dir == Path("coding")
        assert ours.timeout == theirs.timeout == 7
        result = ours.execute_code_blocks(
            [CodeBlock(code="import os; print(os.getcwd())", language="python")]
        )
    assert result.output.strip() == str(tmp_path / "coding")


# -- 14.8: a relative python= / virtualenv path is the caller's ------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["interpreter", "virtualenv"])
def test_relative_python_is_resolved_against_the_callers_cwd(
    kind: str, form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relative = relative_python(form, tmp_path, monkeypatch)
    block = [CodeBlock(code="import sys\nprint(sys.prefix)", language="python")]
    (tmp_path / "deep").mkdir()  # AG2 makes the work dir, not its parents (issue 32.2)
    with AG2CodeExecutor(kind=kind, python=relative, work_dir=tmp_path / "deep" / "work") as ours:
        monkeypatch.chdir(tmp_path)  # a later cwd change does not matter either
        result = ours.execute_code_blocks(block)
        ours.restart()
        again = ours.execute_code_blocks(block)
    assert result.exit_code == again.exit_code == 0, (result.output, again.output)
    assert result.output.strip() == again.output.strip() == sys.prefix


# -- 14.6: pip quietened -----------------------------------------------------------------------


def test_pip_install_is_quietened_as_ag2(tmp_path: Path) -> None:
    # No network: the install fails fast, but what ran is in the code file either way.
    code = "pip install --no-index kxdemo-not-there\necho after"
    block = [CodeBlock(code=code, language="sh")]
    theirs = peer(tmp_path).execute_code_blocks(block)
    with AG2CodeExecutor(kind="command", work_dir=tmp_path / "ours") as adapter:
        ours = adapter.execute_code_blocks(block)
    assert ours.code_file is not None and theirs.code_file is not None
    ran = Path(ours.code_file).read_text()
    assert ran == Path(theirs.code_file).read_text()
    assert ran.startswith("pip install -qqq --no-index")


def test_ipython_pip_lines_are_quietened(tmp_path: Path) -> None:
    install = "pip install --no-index kxdemo-not-there"
    code = f"!{install}\n%{install}\nprint('x')"
    with AG2CodeExecutor(kind="kernel", work_dir=tmp_path) as adapter:
        result = adapter.execute_code_blocks([CodeBlock(code=code, language="python")])
        ran = adapter.executor.notebook.cells[-1].source  # what the kernel was given
    assert result.exit_code == 0 and result.output.strip().endswith("x")
    assert ran.splitlines()[:2] == [
        "!pip install -qqq --no-index kxdemo-not-there",
        "%pip install -qqq --no-index kxdemo-not-there",
    ]


# -- 14.7: IPython ! lines in a shell block, stateful executor ----------------------------------


def test_bang_lines_in_a_bash_block_run_in_the_kernel(tmp_path: Path) -> None:
    with AG2CodeExecutor(kind="kernel", work_dir=tmp_path) as adapter:
        result = adapter.execute_code_blocks(
            [CodeBlock(code="!echo from-bang\n!echo second", language="bash")]
        )
        plain = adapter.execute_code_blocks([CodeBlock(code="echo plain", language="bash")])
    assert result.exit_code == 0 and result.output.split() == ["from-bang", "second"]
    assert plain.exit_code == 0 and plain.output.strip() == "plain"  # plain bash still runs


# -- 19.3: every registered name -----------------------------------------------------------------


def test_every_registered_name_is_accepted() -> None:
    for name in EXECUTOR_NAMES:
        # the names that cannot be built without saying where the kernel runs
        required = {
            "gateway": {"url": "http://127.0.0.1:9"},
            "provisioned-kernel": {"kernel_name": "x"},
        }
        options: dict[str, Any] = required.get(name, {})
        adapter = AG2CodeExecutor(kind=name, **options)
        assert adapter.executor.aio.kind in ("kernel", "command")
        adapter.close()
    with pytest.raises(UnknownExecutor, match="docker-command"):
        AG2CodeExecutor(kind="jupyter")


def test_a_chat_through_the_adapter_with_numbered_steps(adapter: AG2CodeExecutor) -> None:
    steps = "Steps:\n\n1. compute:\n    " + flows.FIB.split("\n", 1)[1].replace("\n", "\n    ")
    heard = ag2_chat(adapter, "fib 14", steps, flows.DONE)
    assert heard == ["exitcode: 0 (execution succeeded)\nCode output: 377\n"]


# -- issue 32.2 / 32.3 / 32.5: work dir, class policies, dangerous commands ----------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_work_dir_parent_is_file_not_found_as_ag2(kind: str, tmp_path: Path) -> None:
    """AG2 makes the work dir itself (``mkdir(exist_ok=True)``) and refuses a missing parent;
    kernelexec made the whole chain (``/invalid/directory`` at the root)."""
    missing = tmp_path / "no" / "such"
    with pytest.raises(FileNotFoundError):
        LocalCommandLineCodeExecutor(work_dir=missing)
    with pytest.raises(FileNotFoundError, match="does not exist") as caught:
        AG2CodeExecutor(kind=kind, work_dir=missing)
    assert isinstance(caught.value, KernelExecError)
    assert not (tmp_path / "no").exists()
    # One level is made by both.
    LocalCommandLineCodeExecutor(work_dir=tmp_path / "peer")
    with AG2CodeExecutor(kind=kind, work_dir=tmp_path / "ours") as ours:
        assert ours.work_dir == tmp_path / "ours"
    assert (tmp_path / "peer").is_dir() and (tmp_path / "ours").is_dir()


def test_default_execution_policy_is_a_class_attribute_as_ag2() -> None:
    from autogen.coding import DockerCommandLineCodeExecutor as DockerPeer

    from kernelexec.integrations.ag2 import DockerCommandLineCodeExecutor

    assert AG2CodeExecutor.DEFAULT_EXECUTION_POLICY == (
        LocalCommandLineCodeExecutor.DEFAULT_EXECUTION_POLICY
    )
    assert DockerCommandLineCodeExecutor.DEFAULT_EXECUTION_POLICY == (
        DockerPeer.DEFAULT_EXECUTION_POLICY
    )


# Each line matches one of AG2's patterns; ``exit 0`` comes first, so nothing dangerous would
# run even if the block were not refused; ``ran.txt`` tells whether the block started at all.
DANGEROUS = [
    "rm -rf ./gone",
    "mv ./missing /dev/null",
    "dd if=/dev/null of=/dev/null count=0",
    "f() { echo x > /dev/sdq1; }",
    ":(){ :|:& };:",
]


@pytest.mark.parametrize("command", DANGEROUS)
@pytest.mark.parametrize("tag", ["bash", "sh", "shell"])
def test_dangerous_commands_are_refused_as_ag2(command: str, tag: str, tmp_path: Path) -> None:
    code = f"touch ran.txt; exit 0\n{command}\n"
    before = CodeBlock(code="echo first > first.txt", language="sh")
    block = CodeBlock(code=code, language=tag)
    peer_error = ours_error = None
    try:
        peer(tmp_path).execute_code_blocks([before, block])
    except ValueError as exc:
        peer_error = str(exc)
    with AG2CodeExecutor(kind="command", work_dir=tmp_path / "ours", timeout=60) as adapter:
        with pytest.raises(ValueError) as caught:
            adapter.execute_code_blocks([before, block])
        ours_error = str(caught.value)
        assert isinstance(caught.value, KernelExecError)
    assert peer_error is not None and ours_error == peer_error
    assert ours_error.startswith("Potentially dangerous command detected: ")
    for side in ("peer", "ours"):  # the block before ran; the refused one did not start
        assert (tmp_path / side / "first.txt").exists()
        assert not (tmp_path / side / "ran.txt").exists()


def test_only_the_local_command_kind_sanitizes_by_default(tmp_path: Path) -> None:
    """AG2's IPython and Docker executors do not check: neither does the adapter on a kernel
    (a container's own isolation is the guard); ``sanitize=`` chooses either way."""
    block = CodeBlock(code="exit 0\nrm -rf ./gone", language="bash")
    with AG2CodeExecutor(kind="kernel", work_dir=tmp_path / "k", timeout=60) as kernel:
        assert kernel.execute_code_blocks([block]).exit_code == 0
    with AG2CodeExecutor(kind="command", work_dir=tmp_path / "c", sanitize=False) as command:
        assert command.execute_code_blocks([block]).exit_code == 0


# -- issue 32.4: fences indented four spaces or more ---------------------------------------------

OVER_INDENTED = (
    "Steps:\n\n1. Compute:\n\n"
    "        ```python\n        x = 6 * 7\n\n        print(x)\n        ```\n"
    "2. Report:\n         ```bash\n         echo done\n         ```\n"
    "3. Top level, four spaces:\n\n    ```sh\n    echo top\n    ```\n"
)


@pytest.mark.parametrize("kind", KINDS)
def test_over_indented_fences_are_found_as_ag2_finds_them(kind: str, tmp_path: Path) -> None:
    """AG2's regular expression finds these fences; CommonMark reads them as indented code
    (kernelexec found none: the agent replied '' and ran nothing). The adapter finds the same
    blocks, each line without the fence's indent (AG2 keeps it: its Python fails to compile)."""
    import textwrap

    theirs = MarkdownCodeExtractor().extract_code_blocks(OVER_INDENTED)
    with AG2CodeExecutor(kind=kind, work_dir=tmp_path / "ours", timeout=60) as adapter:
        ours = adapter.code_extractor.extract_code_blocks(OVER_INDENTED)
        assert (
            [b.language for b in ours] == [b.language for b in theirs] == ["python", "bash", "sh"]
        )
        assert [b.code for b in ours] == [textwrap.dedent(b.code) for b in theirs]
        result = adapter.execute_code_blocks(ours)
        assert result.exit_code == 0 and result.output.split() == ["42", "done", "top"]
    # The same reply through a chat: the executor agent runs them.
    with AG2CodeExecutor(kind=kind, work_dir=tmp_path / "chat", timeout=60) as adapter:
        heard = ag2_chat(adapter, "compute", OVER_INDENTED, flows.DONE)
    assert heard[0].startswith("exitcode: 0 (execution succeeded)")
    assert heard[0].split()[-3:] == ["42", "done", "top"]
