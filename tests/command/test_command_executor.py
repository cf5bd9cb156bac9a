"""The stateless executor against real local processes (no kernel)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kx_close import check_stopped_by_close, close_during_block, host_processes_with, unique_seconds

from kernelexec import (
    AsyncCommandLineExecutor,
    BackendUnavailable,
    CodeBlock,
    CommandLineExecutor,
    ExecutorClosed,
)
from kernelexec._executor import NO_BLOCKS_MESSAGE
from kernelexec.backends.local_command import LocalCommand


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CommandLineExecutor]:
    """One executor for the tests whose work-dir contents do not matter."""
    with CommandLineExecutor(work_dir=tmp_path_factory.mktemp("shared"), timeout=30) as executor:
        yield executor


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[CommandLineExecutor]:
    """An executor with a work dir of its own, for tests that inspect it."""
    with CommandLineExecutor(work_dir=tmp_path / "work", timeout=30) as executor:
        yield executor


def _gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


def _wait_gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


# -- basics and the result model -----------------------------------------------------------------


def test_python_block(ex: CommandLineExecutor) -> None:
    result = ex.execute("print(1 + 1)")
    assert result.exit_code == 0
    assert result.output == "2\n"
    assert result.stdout == "2\n" and result.stderr == ""
    assert result.error is None and not result.timed_out and not result.truncated
    assert result.outputs == [{"output_type": "stream", "name": "stdout", "text": "2\n"}]
    assert result.to_reply() == "exitcode: 0 (execution succeeded)\nCode output: 2\n"
    data = json.loads(json.dumps(result.to_dict()))
    assert data["exit_code"] == 0 and data["code_file"] == result.code_file
    assert result.output_files == [] and result.duration_s > 0


def test_shell_block_and_its_exit_status(ex: CommandLineExecutor) -> None:
    result = ex.execute("echo out; echo err >&2; exit 3", "bash")
    assert result.exit_code == 3
    assert result.stdout == "out\n" and result.stderr == "err\n"
    assert "out\n" in result.output and "err\n" in result.output
    assert result.error is not None and result.error.ename == "NonZeroExit"
    assert result.to_reply().startswith("exitcode: 3 (execution failed)\nCode output: ")


def test_python_exception_is_a_result(ex: CommandLineExecutor) -> None:
    result = ex.execute("x = {}\nx['missing']")
    assert result.exit_code == 1
    assert result.error is not None
    assert (result.error.ename, result.error.evalue) == ("KeyError", "'missing'")
    assert "Traceback" in result.output
    assert result.outputs[-1]["output_type"] == "error"


def test_killed_by_signal(ex: CommandLineExecutor) -> None:
    result = ex.execute("kill -9 $$", "sh")
    assert result.exit_code == 128 + 9
    assert "signal SIGKILL" in result.output


def test_code_files_are_named_by_content_hash(fresh: CommandLineExecutor) -> None:
    code = "print('hash me')"
    first, again = fresh.execute(code), fresh.execute(code)
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    where = fresh.work_dir / ".kernelexec" / "code" / f"tmp_code_{digest}.py"
    assert first.code_file == again.code_file == str(where)
    assert Path(first.code_file).read_text() == code
    other = fresh.execute("echo hi", "sh")
    assert other.code_file is not None and other.code_file.endswith(".sh")
    assert other.code_file != first.code_file


def test_code_files_stay_out_of_the_work_dir_unless_asked(tmp_path: Path) -> None:
    """Unnamed blocks' code files live in kernelexec's own folder: the work dir holds only
    what the code made; ``code_dir="."`` puts them beside it, as AG2's executor does."""
    with CommandLineExecutor(work_dir=tmp_path / "native") as ex:
        r = ex.execute("open('made.txt', 'w').write('x')")
        assert sorted(p.name for p in ex.work_dir.iterdir()) == [".kernelexec", "made.txt"]
        assert r.files == [ex.work_dir / "made.txt"]
        assert "File" in ex.execute("raise ValueError('x')").output  # the traceback names a file
    with CommandLineExecutor(work_dir=tmp_path / "peer", code_dir=".") as ex:
        r = ex.execute("print(1)")
        assert r.code_file is not None and Path(r.code_file).parent == ex.work_dir


def test_cleanup_code_files(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path, cleanup_code_files=True) as ex:
        result = ex.execute("print('gone')")
        named = ex.execute("# filename: keep/me.py\nprint('kept')")
    assert result.output == "gone\n" and named.output == "kept\n"
    assert result.code_file is not None and not Path(result.code_file).exists()
    assert (tmp_path / "keep" / "me.py").exists()  # a block saved by name is the user's file


def test_default_work_dir_is_a_fresh_temp_dir_removed_on_close() -> None:
    with CommandLineExecutor() as a, CommandLineExecutor() as b:
        assert a.work_dir != b.work_dir
        assert a.work_dir.is_dir() and not any(a.work_dir.iterdir())
        a.execute("open('f.txt', 'w').write('x')")
        assert (a.work_dir / "f.txt").exists()
    assert not a.work_dir.exists() and not b.work_dir.exists()


def test_given_work_dir_is_created_and_kept(tmp_path: Path) -> None:
    work = tmp_path / "nested" / "run"
    with CommandLineExecutor(work_dir=work) as ex:
        assert ex.execute("import os; print(os.getcwd())").output.strip() == str(work)
    assert work.is_dir()


# -- interpreters -------------------------------------------------------------------------------


def test_python_from_a_virtualenv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    with CommandLineExecutor(python=venv, work_dir=tmp_path / "w") as ex:
        result = ex.execute("import sys; print(sys.prefix)")
    assert result.exit_code == 0, result.output
    assert Path(result.output.strip()) == venv
    with CommandLineExecutor(python=venv / "bin" / "python", work_dir=tmp_path / "w") as ex:
        assert Path(ex.execute("import sys; print(sys.prefix)").output.strip()) == venv


def test_missing_interpreter_is_an_infrastructure_error(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="not found"):
        CommandLineExecutor(python="/no/such/python")
    with pytest.raises(BackendUnavailable, match="no Python interpreter"):
        CommandLineExecutor(python=tmp_path)


# -- # filename: ---------------------------------------------------------------------------------


def test_filename_saves_under_that_name(fresh: CommandLineExecutor) -> None:
    code = "# filename: pkg/sub/tool.py\nimport pathlib\nprint(pathlib.Path(__file__).name)"
    result = fresh.execute(code)
    target = fresh.work_dir / "pkg" / "sub" / "tool.py"
    assert result.exit_code == 0 and result.output == "tool.py\n"
    assert target.read_text() == code
    assert result.code_file == str(target)
    assert result.files == []  # the code file itself is not an artifact


def test_other_first_line_comment_is_just_a_comment(fresh: CommandLineExecutor) -> None:
    result = fresh.execute("# tool.py\nprint('ok')")
    assert result.exit_code == 0
    assert not (fresh.work_dir / "tool.py").exists()


@pytest.mark.parametrize("name", ["../escape.py", "a/../../escape.py", "/tmp/kx-escape.py"])
def test_filename_outside_the_work_dir_is_refused(tmp_path: Path, name: str) -> None:
    work = tmp_path / "work"
    with CommandLineExecutor(work_dir=work) as ex:
        result = ex.execute(f"# filename: {name}\nopen('ran.txt', 'w').write('ran')")
    assert result.exit_code == 1
    assert result.output.startswith("Block refused: ")
    assert result.error is not None and result.error.ename == "InvalidBlock"
    assert _files(tmp_path) == {"work"}  # nothing written, nothing ran
    assert not Path("/tmp/kx-escape.py").exists()


def test_filename_through_a_symlink_pointing_outside_is_refused(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    outside.mkdir()
    with CommandLineExecutor(work_dir=work) as ex:
        (work / "link").symlink_to(outside, target_is_directory=True)
        (work / "file.py").symlink_to(outside / "file.py")
        via_dir = ex.execute("# filename: link/evil.py\nprint('ran')")
        via_file = ex.execute("# filename: file.py\nprint('ran')")
    for result in (via_dir, via_file):
        assert result.exit_code == 1 and "escapes the work dir" in result.output
        assert "ran" not in result.stdout
    assert list(outside.iterdir()) == []


def test_filename_naming_a_directory_is_refused(fresh: CommandLineExecutor) -> None:
    (fresh.work_dir / "data").mkdir()
    result = fresh.execute("# filename: data\nprint('ran')")
    assert result.exit_code == 1
    assert result.output.startswith("Block refused: cannot write data")
    assert (fresh.work_dir / "data").is_dir()


def test_code_with_a_lone_surrogate_still_runs(ex: CommandLineExecutor) -> None:
    result = ex.execute("print('a\ud800b')")
    assert result.exit_code == 0 and result.output == "a?b\n"


# -- languages -----------------------------------------------------------------------------------


def test_unsupported_language_runs_nothing(fresh: CommandLineExecutor) -> None:
    before = _files(fresh.work_dir)
    result = fresh.execute('File.write("ran.txt", "x")', "ruby")
    assert result.exit_code == 1
    assert result.output.startswith("unsupported language: ruby")
    assert result.code_file is None and result.files == []
    assert _files(fresh.work_dir) == before


@pytest.mark.parametrize("tag", ["pwsh", "powershell", "ps1"])
def test_powershell_when_installed_else_unsupported(ex: CommandLineExecutor, tag: str) -> None:
    result = ex.execute("Write-Output 'from pwsh'", tag)
    if shutil.which("pwsh"):
        assert result.exit_code == 0 and result.output == "from pwsh\n"
    else:
        assert "powershell" not in ex.supported_languages
        assert result.exit_code == 1
        assert result.output.startswith(f"unsupported language: {tag} (this executor runs: ")


def test_untagged_non_python_block_is_not_run(fresh: CommandLineExecutor) -> None:
    # (untagged command lines such as `ls -la && echo done` are shell: tests/unit/test_extract)
    result = fresh.execute_message("```\nSELECT name FROM users;\n```")
    assert result.exit_code == 1
    assert "no language tag and is not valid Python" in result.output
    assert _files(fresh.work_dir) == set()


# -- timeouts and stray processes --------------------------------------------------------------


def test_timeout_returns_on_time(ex: CommandLineExecutor) -> None:
    started = time.monotonic()
    result = ex.execute("print('started', flush=True)\nwhile True:\n    pass", timeout=1)
    assert time.monotonic() - started < 5
    assert result.exit_code == 124 and result.timed_out
    assert "Timeout" in result.output and result.output.startswith("started\n")
    assert result.to_reply().startswith("exitcode: 124 (execution timed out)")


_STUBBORN = """\
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
open("child.pid", "w").write(str(child.pid))
print("spawned", flush=True)
time.sleep(300)
"""


def test_timeout_kills_the_whole_group_even_sigterm_ignorers(fresh: CommandLineExecutor) -> None:
    started = time.monotonic()
    result = fresh.execute(_STUBBORN, timeout=2)
    assert time.monotonic() - started < 8
    assert result.exit_code == 124 and "spawned" in result.output
    child = int((fresh.work_dir / "child.pid").read_text())
    assert _wait_gone(child), f"child {child} survived the timeout"


def test_child_that_outlives_its_parent(fresh: CommandLineExecutor) -> None:
    code = (
        "import subprocess\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "print('parent done')\n"
    )
    started = time.monotonic()
    result = fresh.execute(code, timeout=60)
    assert time.monotonic() - started < 5  # not the 60 s timeout: we never wait for the child
    assert result.exit_code == 0 and result.output == "parent done\n"
    assert _wait_gone(int((fresh.work_dir / "child.pid").read_text()))


def test_background_shell_job_does_not_hold_the_block(fresh: CommandLineExecutor) -> None:
    started = time.monotonic()
    result = fresh.execute("sleep 300 &\necho $! > bg.pid\necho done", "bash", timeout=60)
    assert time.monotonic() - started < 5
    assert result.exit_code == 0 and result.output == "done\n"
    assert _wait_gone(int((fresh.work_dir / "bg.pid").read_text()))


def test_stdin_is_closed(ex: CommandLineExecutor) -> None:
    started = time.monotonic()
    result = ex.execute("name = input('name? ')\nprint(name)", timeout=30)
    assert time.monotonic() - started < 5
    assert result.exit_code == 1
    assert result.error is not None and result.error.ename == "EOFError"
    shell = ex.execute('read -r line; echo "status $?"', "bash", timeout=30)
    assert shell.output == "status 1\n"


# -- output ------------------------------------------------------------------------------------

_FLOOD_SCRIPT = """
import json, os, resource, sys
from kernelexec import CommandLineExecutor
with CommandLineExecutor(work_dir=sys.argv[1], timeout=120) as ex:
    ex.execute("print(1)")  # warm up: the first run's one-off allocations are not the flood's
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = ex.execute(
        "import sys\\nline = 'x' * 1023 + '\\\\n'\\n"
        "for _ in range(100 * 1024):\\n    sys.stdout.write(line)\\n"
        "print('THE END')"
    )
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({
        "growth_kb": after - before,
        "result": result.to_dict(),
    }))
"""


def test_flood_of_output_keeps_memory_bounded(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _FLOOD_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    report = json.loads(proc.stdout)
    result = report["result"]
    assert report["growth_kb"] < 30 * 1024, report["growth_kb"]  # 100 MB went through
    assert result["exit_code"] == 0 and result["truncated"] is True
    output = result["output"]
    assert len(output) < 21_000
    assert output.startswith("x" * 1000) and output.endswith("THE END\n")
    assert "[... 104837608 characters omitted; full output in " in output
    full = Path(result["full_output_file"])
    assert full.parent.parent.parent == tmp_path
    assert full.stat().st_size == 100 * 1024 * 1024 + len("THE END\n")


def test_output_merges_stdout_and_stderr_at_line_boundaries(ex: CommandLineExecutor) -> None:
    """A stderr line landed inside an unbuffered stdout line: "hierr\\n\\n" (issue 31.11)."""
    code = (
        "import sys, time\n"
        "sys.stdout.write('hi'); time.sleep(0.3)\n"
        "sys.stderr.write('err\\n'); time.sleep(0.3)\n"
        "sys.stdout.write(' there\\n'); sys.stdout.write('end')\n"
    )
    result = ex.execute(code)
    assert (result.stdout, result.stderr) == ("hi there\nend", "err\n")
    assert result.output == "err\nhi there\nend"


def test_binary_output_is_decoded_with_replacement(ex: CommandLineExecutor) -> None:
    code = (
        "import sys\n"
        "sys.stdout.buffer.write(b'ok \\xff\\xfe\\x00 caf\\xc3\\xa9\\n')\n"
        "sys.stderr.buffer.write(b'\\x80err\\n')\n"
    )
    result = ex.execute(code)
    assert result.exit_code == 0
    assert result.stdout == "ok \ufffd\ufffd\x00 café\n"
    assert result.stderr == "\ufffderr\n"


def test_streamed_outputs_reach_the_callback(tmp_path: Path) -> None:
    seen: list[dict[str, object]] = []
    with CommandLineExecutor(work_dir=tmp_path, on_output=seen.append) as ex:
        ex.execute("import sys; print('a'); print('b', file=sys.stderr)")
    assert "".join(str(o["text"]) for o in seen if o["name"] == "stdout") == "a\n"
    assert "".join(str(o["text"]) for o in seen if o["name"] == "stderr") == "b\n"


# -- artifacts ----------------------------------------------------------------------------------


def test_matplotlib_figure_is_listed(fresh: CommandLineExecutor) -> None:
    code = textwrap.dedent(
        """\
        import matplotlib.pyplot as plt
        plt.scatter([1, 2, 3], [3, 1, 2])
        plt.savefig("scatter.png")
        print("saved")
        """
    )
    result = fresh.execute(code, timeout=60)
    assert result.exit_code == 0, result.output
    png = fresh.work_dir / "scatter.png"
    # the figure still open at the end is shown too, as a notebook's inline backend shows it
    shown = fresh.work_dir / "outputs" / "cell1-1.png"
    assert sorted(result.files) == sorted([png, shown])
    assert png.read_bytes().startswith(b"\x89PNG") and shown.read_bytes().startswith(b"\x89PNG")


def test_created_and_modified_files_are_listed_but_not_untouched_ones(
    fresh: CommandLineExecutor,
) -> None:
    (fresh.work_dir / "data.txt").write_text("1\n")
    (fresh.work_dir / "same.txt").write_text("same\n")
    result = fresh.execute(
        "open('data.txt', 'a').write('2\\n')\n"
        "import os; os.makedirs('out', exist_ok=True)\n"
        "open('out/new.csv', 'w').write('a,b\\n')\n"
    )
    assert result.exit_code == 0, result.output
    assert sorted(result.files) == [fresh.work_dir / "data.txt", fresh.work_dir / "out" / "new.csv"]


def test_env_vars_per_executor(tmp_path: Path) -> None:
    with (
        CommandLineExecutor(work_dir=tmp_path / "a", env={"KX_GREETING": "hello"}) as with_env,
        CommandLineExecutor(work_dir=tmp_path / "b") as without,
    ):
        assert with_env.execute("echo $KX_GREETING", "sh").output == "hello\n"
        code = "import os; print(os.environ.get('KX_GREETING', 'unset'))"
        assert with_env.execute(code).output == "hello\n"
        assert without.execute(code).output == "unset\n"


# -- messages and lists of blocks ---------------------------------------------------------------


@pytest.mark.parametrize("message", ["", "Just prose, no code.", "```text\nnot code\n```"])
def test_message_without_code_runs_nothing(fresh: CommandLineExecutor, message: str) -> None:
    result = fresh.execute_message(message)
    assert result.exit_code == 0
    assert result.output == NO_BLOCKS_MESSAGE
    assert _files(fresh.work_dir) == set()
    assert fresh.execute_code_blocks([]).output == NO_BLOCKS_MESSAGE


def test_blocks_stop_at_the_first_failure(fresh: CommandLineExecutor) -> None:
    blocks = [
        CodeBlock("print('one')"),
        CodeBlock("echo two; exit 2", "sh"),
        CodeBlock("open('three.txt', 'w').write('ran')"),
    ]
    result = fresh.execute_code_blocks(blocks)
    assert result.exit_code == 2
    assert result.output == "one\n\ntwo\n"
    assert len(result.block_results) == 2
    assert not (fresh.work_dir / "three.txt").exists()


def test_message_blocks_run_in_order(ex: CommandLineExecutor) -> None:
    message = "First\n```python\nprint('a')\n```\nthen\n~~~bash\necho b\n~~~\n"
    result = ex.execute_message(message)
    assert result.exit_code == 0
    assert [r.output for r in result.block_results] == ["a\n", "b\n"]


def test_ag2_style_blocks_are_accepted(ex: CommandLineExecutor) -> None:
    class Ag2Block:  # AG2's CodeBlock is a pydantic model with .code and .language
        def __init__(self, code: str, language: str) -> None:
            self.code, self.language = code, language

    assert ex.execute_code_blocks([Ag2Block("print(7)", "py")]).output == "7\n"


# -- life cycle and the sync / async fronts -----------------------------------------------------


def test_closed_executor_raises(tmp_path: Path) -> None:
    ex = CommandLineExecutor(work_dir=tmp_path)
    ex.execute("pass")
    ex.close()
    ex.close()  # twice is fine
    assert ex.closed
    with pytest.raises(ExecutorClosed):
        ex.execute("print(1)")
    with pytest.raises(ExecutorClosed):
        ex.execute_message("```py\nprint(1)\n```")


@pytest.mark.parametrize("action", ["close", "restart"])
def test_close_from_another_thread_stops_the_running_block(tmp_path: Path, action: str) -> None:
    """close() waited for the running block to end (28.5 s of a 30 s block, issue 31.7)."""
    seconds = unique_seconds()
    took, result = close_during_block(CommandLineExecutor(work_dir=tmp_path), seconds, action)
    check_stopped_by_close(took, result, action)
    assert host_processes_with(f"sleep\0{seconds}") == []


def test_close_from_another_task_stops_the_running_block(tmp_path: Path) -> None:
    async def main() -> tuple[float, Any]:
        ex = AsyncCommandLineExecutor(work_dir=tmp_path)
        block = asyncio.ensure_future(ex.execute("import time; time.sleep(60)", timeout=90))
        await asyncio.sleep(1)
        started = time.monotonic()
        await ex.close()
        return time.monotonic() - started, await block

    took, result = asyncio.run(main())
    assert took < 15 and result.error is not None and result.error.ename == "Stopped", result


class _SlowStart(LocalCommand):
    """A local back end that takes a second to start (as a container does)."""

    async def start(self, work_dir: Path) -> None:
        await asyncio.sleep(1)


def test_close_while_the_back_end_starts_runs_nothing_and_says_so(tmp_path: Path) -> None:
    async def main() -> Any:
        ex = AsyncCommandLineExecutor(backend=_SlowStart(), work_dir=tmp_path)
        block = asyncio.ensure_future(ex.execute("open('ran', 'w').write('yes')"))
        await asyncio.sleep(0.3)  # the block waits for the back end's start
        await ex.close()
        return await block

    result = asyncio.run(main())
    assert result.error is not None and result.error.ename == "Stopped", result
    assert "before the block started; nothing of it ran" in result.output
    assert result.exit_code == 1 and not (tmp_path / "ran").exists()


def test_sync_api_inside_a_running_event_loop(tmp_path: Path) -> None:
    async def main() -> str:
        asyncio.get_running_loop()  # we really are inside a loop
        with CommandLineExecutor(work_dir=tmp_path) as ex:
            return ex.execute("print('inside')").output

    assert asyncio.run(main()) == "inside\n"


def test_async_twin(tmp_path: Path) -> None:
    async def main() -> list[str]:
        async with AsyncCommandLineExecutor(work_dir=tmp_path, timeout=10) as ex:
            one = await ex.execute("print(1)")
            blocks = await ex.execute_code_blocks([CodeBlock("echo 2", "sh")])
            message = await ex.execute_message("```py\nprint(3)\n```")
        with pytest.raises(ExecutorClosed):
            await ex.execute("print(4)")
        return [one.output, blocks.output, message.output]

    assert asyncio.run(main()) == ["1\n", "2\n", "3\n"]


FIGURES = (
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
    "plt.figure(); plt.bar([1], [2])\nprint('end')\n"  # never shown: saved when the block ends
)


def test_plt_show_saves_figures_as_the_stateful_executor_names_them(tmp_path: Path) -> None:
    # charts=False: the bare lines (the chart lines: tests/command/test_charts_command.py)
    with CommandLineExecutor(work_dir=tmp_path, charts=False) as ex:
        ex.execute("print('block one')")
        r = ex.execute(FIGURES)
    assert r.exit_code == 0, r.output
    assert r.output == (
        "[image/png saved to outputs/cell2-1.png]\nend\n[image/png saved to outputs/cell2-2.png]\n"
    )
    assert [p.relative_to(tmp_path).as_posix() for p in r.files] == [
        "outputs/cell2-1.png",
        "outputs/cell2-2.png",
    ]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in r.files)


def test_no_outputs_dir_no_figure_files(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path, outputs_dir=None) as ex:
        r = ex.execute(FIGURES + "import matplotlib; print(matplotlib.get_backend().lower())")
    assert r.exit_code == 0 and r.output == "end\nagg\n" and r.files == []


def test_a_block_that_does_not_compile_names_its_error(ex: CommandLineExecutor) -> None:
    # the interpreter prints no "Traceback" header for a file it cannot compile
    for code, ename in (
        ("def f(:\n  pass", "SyntaxError"),
        ("if 1:\nprint(1)", "IndentationError"),
    ):
        r = ex.execute(code)
        assert r.exit_code == 1 and r.error is not None and r.error.ename == ename, r.output
