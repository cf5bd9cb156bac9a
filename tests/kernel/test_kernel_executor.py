"""KernelExecutor against one real local IPython kernel, shared where state does not matter."""

from __future__ import annotations

import base64
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from kernelexec import KernelExecutor
from kernelexec._types import NbOutput


@pytest.fixture(scope="module")
def ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    work = tmp_path_factory.mktemp("kernel-work")
    # The executor drops PYTEST_CURRENT_TEST from the kernel's environment itself.
    executor = KernelExecutor(work_dir=work, timeout=30)
    with executor:
        yield executor


def assert_valid_outputs(outputs: list[NbOutput]) -> None:
    nb = new_notebook(cells=[new_code_cell("x", outputs=outputs, execution_count=1)])
    nbformat.validate(nbformat.from_dict(nb))


# -- Part 1: state ----------------------------------------------------------------------------
def test_state_persists_across_blocks(ex: KernelExecutor) -> None:
    assert ex.execute("import math\nvalue = math.factorial(5)").ok
    r = ex.execute("value + 1")
    assert (r.exit_code, r.output) == (0, "121")
    assert r.execution_count is not None


def test_history_is_kept_in_memory_not_in_the_users_profile(ex: KernelExecutor) -> None:
    """kernelexec's one change to ipykernel's defaults (README): no sqlite write per block, and
    agents' code does not land in the user's own IPython history."""
    ex.execute("remembered = 5")
    assert "remembered = 5" in ex.execute("%history -l 3").output
    assert ex.execute("get_ipython().history_manager.hist_file").output == "':memory:'"


def test_no_output_is_lost_across_many_quick_blocks(ex: KernelExecutor) -> None:
    """Each block's stream must reach the host before its idle status; a flush that did not
    wait for the iopub thread let the idle overtake the text (seen: about one block in 20
    returned '' with exit 0)."""
    for i in range(150):
        assert ex.execute(str(i)).output == str(i)
        assert ex.execute(f"print({i})").output == f"{i}\n", i


def test_dataframe_example_from_the_issue(ex: KernelExecutor) -> None:
    pd = pytest.importorskip("pandas")
    assert pd is not None
    ex.execute("import pandas as pd; df = pd.DataFrame({'a': [1, 2, 3]})")
    # numpy 2 reprs scalars as np.int64(6); print() shows what the issue's example means.
    assert ex.execute("print(df.a.sum())").output == "6\n"
    r = ex.execute("df.plot()")
    assert r.ok
    assert any(p.suffix == ".png" for p in r.files), r.files


def test_interrupt_stops_a_block_and_keeps_state(
    ex: KernelExecutor, interrupt_on_marker: Any
) -> None:
    ex.execute("kept = 'yes'")
    interrupter = interrupt_on_marker(ex, "looping")
    started = time.monotonic()
    r = ex.execute(
        "import time\nprint('looping', flush=True)\nfor _ in range(600): time.sleep(0.1)",
        timeout=60,
    )
    interrupter.join()
    assert time.monotonic() - started < 30
    assert r.exit_code == 1 and r.error is not None and r.error.ename == "KeyboardInterrupt"
    assert ex.execute("print(kept)").output == "yes\n"


# -- Part 2: messages -------------------------------------------------------------------------
def test_output_is_resolved_like_a_terminal_stdout_kept_as_written(ex: KernelExecutor) -> None:
    code = (
        "import sys, time\n"
        "for i in range(1, 6):\n"
        "    sys.stderr.write(f'\\rprogress {i}/5'); sys.stderr.flush(); time.sleep(0.05)\n"
        "sys.stderr.write('\\n'); sys.stderr.flush(); time.sleep(0.3); print('ab\\bc')"
    )
    r = ex.execute(code)
    assert r.output == "progress 5/5\nac\n"
    assert r.stderr == "".join(f"\rprogress {i}/5" for i in range(1, 6)) + "\n"
    assert r.stdout == "ab\bc\n"
    assert_valid_outputs(r.outputs)


def test_display_update_and_clear(ex: KernelExecutor) -> None:
    code = (
        "from IPython.display import display, clear_output\n"
        "h = display('step 0', display_id=True)\n"
        "h.update('step 2')\n"
        "print('gone'); clear_output(wait=True); print('after clear')\n"
    )
    r = ex.execute(code)
    assert r.ok
    assert r.output == "after clear\n"
    code = "h2 = display('a', display_id=True); display('b'); h2.update('a2')"
    r = ex.execute("from IPython.display import display\n" + code)
    assert r.output == "'a2'\n'b'"
    assert_valid_outputs(r.outputs)


# -- Part 3: rich outputs ---------------------------------------------------------------------
def test_matplotlib_figures_are_captured(ex: KernelExecutor) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3]); plt.show()\n"  # shown explicitly
        "plt.figure(); plt.bar([1], [2])\n"  # left open at the end of the block
    )
    r = ex.execute(code)
    pngs = [p for p in r.files if p.suffix == ".png"]
    assert len(pngs) == 2, r.files
    for p in pngs:
        assert p.read_bytes().startswith(b"\x89PNG")
        assert p.parent == ex.work_dir / "outputs"
    assert "saved to outputs/" in r.output  # on the chart's line: "[chart: ...; saved to ...]"
    assert "iVBOR" not in r.output
    # The image's text form (<Figure size 640x480 with 1 Axes>) is noise beside the saved file.
    assert "<Figure size" not in r.output, r.output
    assert any("<Figure size" in str(o.get("data", {})) for o in r.outputs)  # kept in outputs
    assert_valid_outputs(r.outputs)
    last = ex.execute("fig = plt.figure(); fig.gca().plot([1, 2]); fig")
    assert "<Figure size" not in last.output and "saved to outputs/" in last.output, last.output


def test_rich_mime_types_are_saved_with_deterministic_names(ex: KernelExecutor) -> None:
    code = (
        "from IPython.display import display, HTML, Markdown, Latex, JSON, SVG\n"
        "display(HTML('<b>bold</b>'))\n"
        "display(Markdown('# Title'))\n"
        "display(Latex('$x^2$'))\n"
        "display(JSON({'k': [1, 2]}))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))\n"
        "display({'application/vnd.plotly.v1+json': {'data': []}}, raw=True)\n"
        "display({'application/vnd.vegalite.v5+json': {'mark': 'bar'}}, raw=True)\n"
    )
    r = ex.execute(code)
    assert r.ok, r.output
    names = sorted(p.name.split("-", 1)[1] for p in r.files)
    assert names == [
        "1.html", "2.md", "3.tex", "4.json", "5.svg", "6.plotly.json", "7.vl.json"
    ]  # fmt: skip
    cell = {p.name.split("-", 1)[0] for p in r.files}
    assert len(cell) == 1 and cell.pop().startswith("cell")
    html = next(p for p in r.files if p.suffix == ".html")
    assert html.read_text() == "<b>bold</b>"
    assert_valid_outputs(r.outputs)


def test_image_bytes_round_trip(ex: KernelExecutor) -> None:
    raw = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    code = f"from IPython.display import Image, display\ndisplay(Image(data={raw!r}, format='png'))"
    r = ex.execute(code)
    (png,) = (p for p in r.files if p.suffix == ".png")
    assert png.read_bytes() == raw
    data = r.outputs[-1]["data"]["image/png"]
    assert base64.b64decode(data) == raw


# -- Part 4: errors are results ---------------------------------------------------------------
def test_exception_is_a_result(ex: KernelExecutor) -> None:
    r = ex.execute("def f():\n    raise ValueError('bad value')\nf()")
    assert r.exit_code == 1
    assert r.error is not None and (r.error.ename, r.error.evalue) == ("ValueError", "bad value")
    assert not any("\x1b" in line for line in r.error.traceback)  # plain, as JSON needs
    raw = next(o for o in r.outputs if o["output_type"] == "error")["traceback"]
    assert any("\x1b[" in line for line in raw)  # the notebook output keeps the colours
    assert "\x1b" not in r.output
    assert "ValueError: bad value" in r.output
    assert_valid_outputs(r.outputs)


def test_syntax_error_is_a_result(ex: KernelExecutor) -> None:
    r = ex.execute("def broken(:\n    pass")
    assert r.exit_code == 1
    assert r.error is not None and r.error.ename == "SyntaxError"
    assert ex.execute("1 + 1").output == "2"


def test_exception_inside_a_display_hook(ex: KernelExecutor) -> None:
    code = (
        "class Bad:\n"
        "    def _repr_html_(self):\n"
        "        raise RuntimeError('html hook broke')\n"
        "    def __repr__(self):\n"
        "        return 'Bad()'\n"
        "Bad()"
    )
    r = ex.execute(code)
    assert "html hook broke" in r.output
    assert "Bad()" in r.output
    code = (
        "class Worse:\n    def __repr__(self):\n        raise RuntimeError('repr broke')\nWorse()"
    )
    r = ex.execute(code)
    assert "repr broke" in r.output
    assert ex.execute("'still fine'").output == "'still fine'"


# -- Part 7: stdin ----------------------------------------------------------------------------
def test_input_without_callback_is_a_clear_error(ex: KernelExecutor) -> None:
    started = time.monotonic()
    r = ex.execute("name = input('Your name? ')")
    assert time.monotonic() - started < 10
    assert r.exit_code == 1
    assert r.error is not None and r.error.ename == "StdinNotImplementedError"


def test_input_callback_answers(tmp_path: Path) -> None:
    prompts: list[str] = []

    def answer(prompt: str) -> str:
        prompts.append(prompt)
        return "Ada"

    with KernelExecutor(work_dir=tmp_path, timeout=30, input=answer) as executor:
        r = executor.execute("name = input('Your name? ')\nprint('hello', name)")
        assert r.output.endswith("hello Ada\n")
        assert prompts == ["Your name? "]
        r = executor.execute("import getpass; secret = getpass.getpass('pw: '); len(secret)")
        assert r.output.endswith("3")


# -- Part 8: shell blocks, ! and %pip ---------------------------------------------------------
def test_shell_block_runs_in_the_kernel_cwd_and_env(ex: KernelExecutor) -> None:
    ex.execute("import os; os.environ['KX_MARK'] = 'from-kernel'")
    r = ex.execute('pwd; echo "$KX_MARK"; command -v python', "sh")
    lines = r.output.splitlines()
    assert r.ok
    assert Path(lines[0]).resolve() == ex.work_dir.resolve()
    assert lines[1] == "from-kernel"
    assert Path(lines[2]).parent == Path(sys.executable).parent  # the kernel's interpreter first


def test_shell_block_failure_is_exit_1(ex: KernelExecutor) -> None:
    r = ex.execute("echo partial; exit 3", "bash")
    assert r.exit_code == 1
    assert r.error is not None and r.error.evalue == "exit status 3"
    assert r.output.startswith("partial\n")
    assert "exit status 3" in r.output


def test_bang_and_pip_magic_in_python(ex: KernelExecutor) -> None:
    r = ex.execute("!echo from-bang")
    assert r.ok and "from-bang" in r.output
    r = ex.execute("%pip --version")
    assert r.ok and "pip" in r.output


# -- Part 9: streaming ------------------------------------------------------------------------
def test_on_output_streams_as_outputs_arrive(tmp_path: Path) -> None:
    arrivals: list[tuple[float, NbOutput]] = []
    with KernelExecutor(
        work_dir=tmp_path, timeout=30, on_output=lambda o: arrivals.append((time.monotonic(), o))
    ) as executor:
        started = time.monotonic()
        r = executor.execute(
            "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('last')"
        )
        ended = time.monotonic()
    assert r.ok
    texts = "".join(o.get("text", "") for _, o in arrivals)
    assert "first" in texts and "last" in texts
    first_at = next(t for t, o in arrivals if "first" in o.get("text", ""))
    assert first_at - started < ended - started - 1.0  # came before the block ended


# -- Part 10: work dir ------------------------------------------------------------------------
def test_files_created_are_listed(ex: KernelExecutor) -> None:
    r = ex.execute(
        "open('made.txt', 'w').write('hi')\n"
        "import os; os.makedirs('sub', exist_ok=True)\n"
        "open('sub/b.csv', 'w').write('1')"
    )
    assert {p.relative_to(ex.work_dir).as_posix() for p in r.files} == {"made.txt", "sub/b.csv"}


def test_filename_block_is_saved_and_run(ex: KernelExecutor) -> None:
    r = ex.execute("# filename: pkg/tool.py\nTOOL = 'ran'\nprint(TOOL)")
    assert r.output == "ran\n"
    saved = ex.work_dir / "pkg" / "tool.py"
    assert saved.read_text().endswith("print(TOOL)")
    assert r.code_file == str(saved)
    assert ex.execute("print(TOOL)").output == "ran\n"


# -- bad input --------------------------------------------------------------------------------
def test_non_utf8_bytes_on_stdout(ex: KernelExecutor) -> None:
    r = ex.execute(
        "import os, sys, time\nsys.stdout.flush()\n"
        "os.write(1, b'bad \\xff\\xfe bytes\\n'); time.sleep(0.5)\nprint('\\udcff ok')"
    )
    assert r.ok
    assert "bytes" in r.output and "ok" in r.output
    r.output.encode("utf-8")  # whatever came through is valid text


def test_ten_thousand_tiny_displays(ex: KernelExecutor) -> None:
    started = time.monotonic()
    r = ex.execute("from IPython.display import display\nfor i in range(10_000): display(i)")
    assert time.monotonic() - started < 60
    assert r.ok
    assert 0 < len(r.outputs) <= 10_000
    assert len(r.output) < ex.aio.options.output_limit + 500
    assert ex.execute("'alive'").output == "'alive'"


@pytest.mark.slow
def test_a_block_printing_100_mb_keeps_memory_bounded(ex: KernelExecutor) -> None:
    import tracemalloc

    # 1 MB at a time, a little apart: ipykernel sends what a block wrote in each 0.2 s as one
    # message, so this is 100 MB in messages of a few MB (a message is in memory whole).
    code = (
        "import sys, time\nline = 'z' * 1023 + '\\n'\n"
        "for _ in range(100):\n    sys.stdout.write(line * 1024); time.sleep(0.03)\n"
    )
    tracemalloc.start()
    try:
        r = ex.execute(code, timeout=120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.ok
    assert r.truncated
    assert "characters omitted" in r.output
    assert len(r.output) < ex.aio.options.output_limit + 1000
    assert all(len(o.get("text", "")) < ex.aio.options.output_limit + 200 for o in r.outputs)
    assert r.full_output_file is not None
    assert r.full_output_file.stat().st_size == 100 * 1024 * 1024
    # Holding the output would take over 100 MB; here only a few messages' worth is alive.
    assert peak < 60 * 1024 * 1024, peak


def test_a_child_that_keeps_printing_after_the_block(ex: KernelExecutor) -> None:
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import time\\nfor i in range(30): print(\"child\", i, flush=True); time.sleep(0.1)'])\n"
        "print('parent done')"
    )
    started = time.monotonic()
    r = ex.execute(code)
    assert time.monotonic() - started < 5
    assert r.ok and "parent done" in r.output
    r2 = ex.execute("print('next block')")
    assert r2.ok and "next block" in r2.output
    ex.execute("child.kill(); child.wait()")


def test_a_forked_child_does_not_hang_the_block(ex: KernelExecutor) -> None:
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    for i in range(20):\n"
        "        print('forked', i, flush=True); time.sleep(0.1)\n"
        "    os._exit(0)\n"
        "print('parent', flush=True)"
    )
    started = time.monotonic()
    r = ex.execute(code)
    assert time.monotonic() - started < 5
    assert "parent" in r.output
    assert ex.execute("os.waitpid(pid, 0)[0] == pid").output == "True"


def test_a_block_that_deletes_the_work_dir(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path / "w", timeout=30) as executor:
        r = executor.execute("import os, shutil\nshutil.rmtree(os.getcwd())")
        assert r.ok
        r = executor.execute("open('again.txt', 'w').write('x')\nimport os; print(os.getcwd())")
        assert r.ok, r.output
        assert (tmp_path / "w" / "again.txt").exists()
        assert [p.name for p in r.files] == ["again.txt"]


def test_async_executor_and_several_at_once(tmp_path: Path) -> None:
    import asyncio

    from kernelexec import AsyncKernelExecutor

    async def main() -> list[str]:
        async with (
            AsyncKernelExecutor(work_dir=tmp_path / "a", timeout=30) as a,
            AsyncKernelExecutor(work_dir=tmp_path / "b", timeout=30) as b,
        ):
            await a.execute("who = 'a'")
            await b.execute("who = 'b'")
            results = await asyncio.gather(a.execute("who"), b.execute("who"))
            return [r.output for r in results]

    assert asyncio.run(main()) == ["'a'", "'b'"]


def test_kernel_pid_is_that_of_a_child_of_ours(ex: KernelExecutor) -> None:
    pid = ex.backend.pid  # type: ignore[attr-defined]
    assert isinstance(pid, int) and pid != os.getpid()
    assert ex.execute("import os; os.getpid()").output == str(pid)


def test_complete_and_inspect_ask_the_kernel(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        ex.execute("import os\nkx_value_alpha = 1\nkx_value_beta = 2")
        ex.execute("def kx_sourced():\n    return 'source-marker'")
        assert ex.complete("kx_value_") == ["kx_value_alpha", "kx_value_beta"]
        assert "path" in ex.complete("os.pa") and ex.completion_start("os.pa") == 3
        assert ex.complete("zzz_nothing_") == []
        help_text = ex.inspect("len")
        assert "Return the number of items" in help_text and "\x1b[" not in help_text
        assert "source-marker" in ex.inspect("kx_sourced", detail_level=1)
        assert "source-marker" not in ex.inspect("kx_sourced")
        assert ex.inspect("kx_no_such_name") == ""


def test_question_mark_help_is_in_the_result(tmp_path: Path) -> None:
    with KernelExecutor(work_dir=tmp_path, timeout=30) as ex:
        r = ex.execute("len?")
        assert r.ok and "Return the number of items" in r.output
        assert [o["output_type"] for o in r.outputs] == ["display_data"]
