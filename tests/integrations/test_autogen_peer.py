"""The AutoGen adapter behaves as autogen-ext's own executors do (issue 14, 9-14; issue 19.3):
each behaviour is checked through the adapter, and where it is cheap, against the real peer
executor installed next to it."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kx_python import relative_python

pytest.importorskip("autogen_ext.code_executors.local", reason="the autogen extra, installed in CI")

from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock, CodeExecutor
from autogen_ext.code_executors.jupyter import JupyterCodeExecutor
from autogen_ext.code_executors.local import LocalCommandLineCodeExecutor

from kernelexec import ExecutionTimeout, ExecutorNotStarted, UnknownExecutor
from kernelexec._registry import EXECUTOR_NAMES
from kernelexec.integrations.autogen import KernelExecCodeExecutor

T = TypeVar("T")


def run(factory: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(factory())  # type: ignore[arg-type]


def py(code: str) -> list[CodeBlock]:
    return [CodeBlock(code=code, language="python")]


def local_peer(work_dir: Path, **kwargs: Any) -> LocalCommandLineCodeExecutor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "may execute code on the local machine"
        return LocalCommandLineCodeExecutor(work_dir=work_dir, **kwargs)


# -- 14.10: not started -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["command", "kernel"])
def test_executing_before_start_raises_runtime_error_as_the_peer(kind: str, tmp_path: Path) -> None:
    async def both() -> tuple[BaseException, BaseException]:
        peer = JupyterCodeExecutor(output_dir=tmp_path / "peer")
        with pytest.raises(RuntimeError) as peer_error:
            await peer.execute_code_blocks(py("print(1)"), CancellationToken())
        ours = KernelExecCodeExecutor(kind=kind, work_dir=tmp_path / "ours")
        with pytest.raises(RuntimeError) as our_error:
            await ours.execute_code_blocks(py("print(1)"), CancellationToken())
        await ours.stop()
        return peer_error.value, our_error.value

    _, ours = run(both)
    assert isinstance(ours, ExecutorNotStarted) and "start" in str(ours)


# -- 14.9: timeouts -----------------------------------------------------------------------------


@pytest.mark.slow
def test_kernel_timeout_raises_timeout_error_as_jupyter_code_executor(tmp_path: Path) -> None:
    code = py("import time\ntime.sleep(30)")

    async def both() -> tuple[type[BaseException], BaseException, str]:
        async with JupyterCodeExecutor(timeout=1, output_dir=tmp_path / "peer") as peer:
            with pytest.raises(TimeoutError) as peer_error:
                await peer.execute_code_blocks(code, CancellationToken())
        async with KernelExecCodeExecutor(kind="kernel", timeout=1, work_dir=tmp_path) as ours:
            with pytest.raises(TimeoutError) as our_error:
                await ours.execute_code_blocks(code, CancellationToken())
            after = await ours.execute_code_blocks(py("print('alive')"), CancellationToken())
        return peer_error.type, our_error.value, after.output

    peer_type, ours, after = run(both)
    assert issubclass(peer_type, TimeoutError)
    assert isinstance(ours, ExecutionTimeout) and "1 s" in str(ours)
    assert after == "alive\n"  # the executor is still usable


def test_command_timeout_is_exit_124_as_local_command_line_executor(tmp_path: Path) -> None:
    code = [CodeBlock(code="sleep 30", language="sh")]

    async def both() -> tuple[Any, Any]:
        peer = local_peer(tmp_path / "peer", timeout=1)
        await peer.start()
        peer_result = await peer.execute_code_blocks(code, CancellationToken())
        await peer.stop()
        async with KernelExecCodeExecutor(kind="command", timeout=1, work_dir=tmp_path) as ours:
            return peer_result, await ours.execute_code_blocks(code, CancellationToken())

    peer_result, ours = run(both)
    assert peer_result.exit_code == ours.exit_code == 124
    assert "Timeout" in peer_result.output and "Timeout" in ours.output


def test_raise_on_timeout_can_be_chosen(tmp_path: Path) -> None:
    async def go() -> None:
        async with KernelExecCodeExecutor(
            kind="command", timeout=1, work_dir=tmp_path, raise_on_timeout=True
        ) as ours:
            await ours.execute_code_blocks(py("import time\ntime.sleep(30)"), CancellationToken())

    with pytest.raises(ExecutionTimeout):
        run(go)


# -- 14.11: cancellation ends the block's processes at once ------------------------------------


async def cancel_when_started(adapter: KernelExecCodeExecutor, code: str) -> tuple[str, float]:
    """Run ``code`` (which prints STARTED first), cancel the token when STARTED is seen; return
    how the run ended and how long it took from the cancel."""
    token = CancellationToken()
    cancelled_at: list[float] = []

    def watch(output: dict[str, Any]) -> None:
        if "STARTED" in str(output.get("text", "")) and not cancelled_at:
            cancelled_at.append(time.monotonic())
            token.cancel()

    adapter.executor.on_output = watch
    try:
        result = await adapter.execute_code_blocks([CodeBlock(code=code, language="sh")], token)
        ended = f"finished: {result.output}"
    except asyncio.CancelledError:
        ended = "cancelled"
    finally:
        adapter.executor.on_output = None
    assert cancelled_at, "the block never printed STARTED"
    return ended, time.monotonic() - cancelled_at[0]


def _cancel_and_check(kind: str, tmp_path: Path) -> None:
    marker = tmp_path / "not-reached.txt"
    code = "echo STARTED\nsleep 3\ntouch not-reached.txt"
    if "command" in kind:
        # A process per block: a child it started in the background dies with it too. (A
        # kernel's interrupt ends the block's own process; what it detached lives on, as a
        # server started by an earlier cell must.)
        code = f"(sleep 3; touch not-reached.txt) &\n{code}"

    async def go() -> tuple[str, float, str]:
        async with KernelExecCodeExecutor(kind=kind, timeout=60, work_dir=tmp_path) as adapter:
            ended, took = await cancel_when_started(adapter, code)
            await asyncio.sleep(4)  # long enough for a surviving block to write the marker
            after = await adapter.execute_code_blocks(
                [CodeBlock(code="echo next", language="sh")], CancellationToken()
            )
            return ended, took, after.output

    ended, took, after = run(go)
    assert ended == "cancelled"
    assert took < 3, f"cancelling took {took:.1f} s"
    assert not marker.exists(), "the cancelled block's processes kept running"
    assert after.strip() == "next"


@pytest.mark.parametrize("kind", ["command", "kernel"])
def test_cancel_ends_the_block_and_returns_at_once(kind: str, tmp_path: Path) -> None:
    _cancel_and_check(kind, tmp_path)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["docker-command", "docker-kernel"])
def test_cancel_ends_the_block_in_docker(kind: str, tmp_path: Path, docker_ready: None) -> None:
    _cancel_and_check(kind, tmp_path)


# -- 14.8: a relative python= / virtualenv path is the caller's ------------------------------


@pytest.mark.parametrize("kind", ["command", "kernel"])
@pytest.mark.parametrize("form", ["interpreter", "virtualenv"])
def test_relative_python_is_resolved_against_the_callers_cwd(
    kind: str, form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relative = relative_python(form, tmp_path, monkeypatch)
    code = py("import sys\nprint(sys.prefix)")
    adapter = KernelExecCodeExecutor(kind=kind, python=relative, work_dir=tmp_path / "d" / "w")
    monkeypatch.chdir(tmp_path)  # a later cwd change does not matter either

    async def go() -> list[str]:
        outputs = []
        for _ in range(2):  # started, stopped and started again (the executor is rebuilt)
            async with adapter:
                result = await adapter.execute_code_blocks(code, CancellationToken())
                outputs.append(result.output)
                await adapter.restart()
                result = await adapter.execute_code_blocks(code, CancellationToken())
                outputs.append(result.output)
        return outputs

    assert [o.strip() for o in run(go)] == [sys.prefix] * 4
    loaded = CodeExecutor.load_component(adapter.dump_component())
    assert isinstance(loaded, KernelExecCodeExecutor)
    assert [o.strip() for o in run(lambda: _run_once(loaded, code))] == [sys.prefix]


async def _run_once(adapter: KernelExecCodeExecutor, code: list[CodeBlock]) -> list[str]:
    async with adapter:
        return [(await adapter.execute_code_blocks(code, CancellationToken())).output]


# -- 14.12 / 14.13: a traceback's text, one file per image, side by side with the peer --------


async def side_by_side(code: list[CodeBlock], tmp_path: Path) -> tuple[Any, Any]:
    async with JupyterCodeExecutor(output_dir=tmp_path / "peer") as peer:
        theirs = await peer.execute_code_blocks(code, CancellationToken())
    async with KernelExecCodeExecutor(kind="kernel", work_dir=tmp_path / "ours") as adapter:
        return theirs, await adapter.execute_code_blocks(code, CancellationToken())


@pytest.mark.slow
def test_traceback_text_as_jupyter_code_executor(tmp_path: Path) -> None:
    # Blank lines in the source and between frames, and colours: Jupyter's text, ANSI-free.
    code = py("def f():\n\n    raise ValueError('boom')\n\nprint('before')\nf()")
    theirs, ours = run(lambda: side_by_side(code, tmp_path))
    assert ours.exit_code == theirs.exit_code == 1
    dashes = "-" * 75
    traceback = ours.output[ours.output.index(dashes) :]
    assert traceback == theirs.output[theirs.output.index(dashes) :]
    assert "\x1b" not in ours.output and "ValueError: boom" in traceback
    assert "\n\nCell In[1], line 3, in f()" in traceback  # the blank line between frames
    assert "      2 \n      3     raise" in traceback  # the block's blank line, numbered
    # What differs: the peer joins outputs with a newline, so a blank line follows the
    # printed text; kernelexec starts the traceback on the next line (the README's table).
    assert theirs.output == f"before\n\n{traceback}"
    assert ours.output == f"before\n{traceback}"


@pytest.mark.slow
def test_an_image_displayed_once_is_one_file_as_jupyter_code_executor(tmp_path: Path) -> None:
    # PIL's image has png and jpeg forms: one file (the png), as the peer saves.
    code = py(
        "from PIL import Image\nfrom IPython.display import display\n"
        "display(Image.new('RGB', (4, 4), 'red'))\nprint('after')"
    )
    theirs, ours = run(lambda: side_by_side(code, tmp_path))
    assert ours.exit_code == theirs.exit_code == 0
    assert [Path(f).suffix for f in ours.output_files] == [".png"]
    assert [Path(f).suffix for f in theirs.output_files] == [".png"]
    assert Path(ours.output_files[0]).read_bytes() == Path(theirs.output_files[0]).read_bytes()
    # What differs: kernelexec drops an image's bare repr from the text (the README's table).
    bare_repr = "<PIL.Image.Image image mode=RGB size=4x4>"
    assert theirs.output == f"{bare_repr}\nafter\n"
    assert ours.output == "after\n"
    assert ours.result is not None  # every form stays in the outputs
    [shown] = [o for o in ours.result.outputs if o.get("output_type") == "display_data"]
    assert {"image/png", "image/jpeg", "text/plain"} <= set(shown["data"])


# -- 14.13: HTML to output_files, no extra text line ------------------------------------------


@pytest.mark.slow
def test_html_goes_to_output_files_without_a_line_as_jupyter_code_executor(
    tmp_path: Path,
) -> None:
    code = py("from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))")

    async def both() -> tuple[Any, Any]:
        async with JupyterCodeExecutor(output_dir=tmp_path / "peer") as peer:
            peer_result = await peer.execute_code_blocks(code, CancellationToken())
        async with KernelExecCodeExecutor(kind="kernel", work_dir=tmp_path / "ours") as ours:
            return peer_result, await ours.execute_code_blocks(code, CancellationToken())

    peer_result, ours = run(both)
    assert ours.output == peer_result.output  # the text/plain form only
    [html] = [f for f in ours.output_files if f.suffix == ".html"]
    assert "<b>bold</b>" in Path(html).read_text(encoding="utf-8")
    assert [Path(f).suffix for f in peer_result.output_files] == [".html"]


# -- 14.14: cleanup_temp_files, output_dir ------------------------------------------------------


def test_code_files_are_cleaned_up_as_local_command_line_executor(tmp_path: Path) -> None:
    code = py("print('hi')")

    async def both() -> tuple[Any, Any, Any]:
        peer = local_peer(tmp_path / "peer")
        await peer.start()
        peer_result = await peer.execute_code_blocks(code, CancellationToken())
        await peer.stop()
        async with KernelExecCodeExecutor(kind="command", work_dir=tmp_path / "a") as ours:
            cleaned = await ours.execute_code_blocks(code, CancellationToken())
            assert ours.cleanup_temp_files
        async with KernelExecCodeExecutor(
            kind="command", work_dir=tmp_path / "b", cleanup_temp_files=False
        ) as ours:
            kept = await ours.execute_code_blocks(code, CancellationToken())
        return peer_result, cleaned, kept

    peer_result, cleaned, kept = run(both)
    assert not Path(peer_result.code_file).exists()
    assert cleaned.output == "hi\n" and not Path(cleaned.code_file).exists()
    assert Path(kept.code_file).exists()


def test_a_failure_to_delete_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The block replaces its own code file by a folder: deleting the file then fails.
    code = py("import os\nos.remove(__file__)\nos.mkdir(__file__)\nprint('swapped')")

    async def go() -> Any:
        async with KernelExecCodeExecutor(kind="command", work_dir=tmp_path) as ours:
            return await ours.execute_code_blocks(code, CancellationToken())

    with caplog.at_level(logging.ERROR, logger="kernelexec.integrations.autogen"):
        result = run(go)
    assert result.exit_code == 0 and result.output == "swapped\n"
    assert Path(result.code_file).is_dir()
    assert any("Failed to delete" in r.getMessage() for r in caplog.records)


IMAGE = (
    "from PIL import Image\nfrom IPython.display import display\ndisplay(Image.new('RGB', (2, 2)))"
)


def test_output_dir_is_where_files_go_not_deprecated_as_jupyter_code_executor(
    tmp_path: Path,
) -> None:
    # autogen-ext 0.7.5: JupyterCodeExecutor's own argument, with no warning of its own.
    async def both() -> tuple[Any, Any, Any, Any]:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            peer = JupyterCodeExecutor(output_dir=tmp_path / "peer")
            alone = KernelExecCodeExecutor(kind="kernel", output_dir=tmp_path / "alone")
            inside = KernelExecCodeExecutor(
                kind="kernel", work_dir=tmp_path / "w", output_dir=tmp_path / "w" / "figs"
            )
            assert peer.output_dir == tmp_path / "peer"
            assert alone.output_dir == tmp_path / "alone"
            assert inside.output_dir == tmp_path / "w" / "figs"
        results: list[Any] = []
        for executor in (peer, alone, inside):
            async with executor:
                results.append(await executor.execute_code_blocks(py(IMAGE), CancellationToken()))
        return (*results, inside.dump_component().config)

    theirs, alone, inside, config = run(both)
    assert Path(theirs.output_files[0]).parent == tmp_path / "peer"
    assert Path(alone.output_files[0]).is_relative_to(tmp_path / "alone")
    assert Path(inside.output_files[0]).parent == tmp_path / "w" / "figs"
    assert config["options"] == {"outputs_dir": "figs"}
    with pytest.raises(ValueError, match="inside work_dir"):
        KernelExecCodeExecutor(kind="kernel", work_dir=tmp_path / "w", output_dir=tmp_path)


def test_current_directory_as_output_dir_warns_as_jupyter_code_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    peer = JupyterCodeExecutor(output_dir=".")
    ours = KernelExecCodeExecutor(kind="kernel", output_dir=".")
    for executor in (peer, ours):
        with pytest.warns(DeprecationWarning, match="current directory as output_dir"):
            assert executor.output_dir == Path(".")
    run(ours.stop)


def test_current_directory_as_work_dir_warns_as_autogen_ext(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.warns(DeprecationWarning, match="current directory as work_dir"):
        local_peer(Path("."))
    with pytest.warns(DeprecationWarning, match="current directory as work_dir"):
        ours = KernelExecCodeExecutor(kind="command", work_dir=".")
    assert ours.work_dir == Path(".")  # as given
    run(ours.stop)


# -- the README's table: pip quietened, first-line file names ---------------------------------

PIP = "pip install --no-index kxdemo-not-there"  # no network: fails fast, what ran is kept


def test_pip_install_is_quietened_as_local_command_line_executor(tmp_path: Path) -> None:
    code = [CodeBlock(code=f"{PIP}\necho after", language="sh")]

    async def both() -> tuple[Any, Any]:
        peer = local_peer(tmp_path / "peer", cleanup_temp_files=False)
        await peer.start()
        theirs = await peer.execute_code_blocks(code, CancellationToken())
        await peer.stop()
        async with KernelExecCodeExecutor(
            kind="command", work_dir=tmp_path / "ours", cleanup_temp_files=False
        ) as ours:
            return theirs, await ours.execute_code_blocks(code, CancellationToken())

    theirs, ours = run(both)
    ran = Path(ours.code_file).read_text()
    assert ran == Path(theirs.code_file).read_text()
    assert ran.startswith("pip install -qqq --no-index")
    assert code[0].code.startswith(PIP)  # the caller's block is left as it was


@pytest.mark.slow
def test_ipython_pip_lines_are_quietened_as_jupyter_code_executor(tmp_path: Path) -> None:
    code = py(f"!{PIP}\nprint('x')")

    async def both() -> tuple[Any, str]:
        async with JupyterCodeExecutor(output_dir=tmp_path / "peer") as peer:
            theirs = await peer.execute_code_blocks(code, CancellationToken())
        async with KernelExecCodeExecutor(kind="kernel", work_dir=tmp_path / "ours") as ours:
            await ours.execute_code_blocks(code, CancellationToken())
            return theirs, ours.executor.notebook.cells[-1].source  # what the kernel was given

    theirs, ran = run(both)
    assert ran.splitlines()[0] == f"!{PIP.replace('install', 'install -qqq')}"
    assert theirs.exit_code == 0


def test_only_filename_first_lines_name_the_file_as_local_command_line_executor(
    tmp_path: Path,
) -> None:
    # autogen-ext reads "# filename: x.py" only; "# test.py" is a comment (AG2 reads both).
    blocks = [
        CodeBlock(code="# filename: named.py\nprint('named')", language="python"),
        CodeBlock(code="# test.py\nprint('comment')", language="python"),
    ]

    async def names(executor: Any) -> list[str]:
        names = []
        async with executor:
            for block in blocks:
                result = await executor.execute_code_blocks([block], CancellationToken())
                assert result.exit_code == 0, result.output
                names.append(Path(result.code_file).name)
        return names

    theirs = run(lambda: names(local_peer(tmp_path / "peer", cleanup_temp_files=False)))
    ours = run(
        lambda: names(
            KernelExecCodeExecutor(
                kind="command", work_dir=tmp_path / "ours", cleanup_temp_files=False
            )
        )
    )
    assert ours[0] == theirs[0] == "named.py"
    assert theirs[1] != "test.py" and ours[1] != "test.py"


# -- 19.3: every registered name; configuration round trip --------------------------------------


def test_every_registered_name_is_accepted() -> None:
    for name in EXECUTOR_NAMES:
        # the names that cannot be built without saying where the kernel runs
        required = {
            "gateway": {"url": "http://127.0.0.1:9"},
            "provisioned-kernel": {"kernel_name": "x"},
        }
        options: dict[str, Any] = required.get(name, {})
        adapter = KernelExecCodeExecutor(kind=name, **options)
        assert adapter.dump_component().config["kind"] == name
        run(adapter.stop)
    with pytest.raises(UnknownExecutor, match="docker-kernel"):
        KernelExecCodeExecutor(kind="jupyter")


def test_options_round_trip_through_the_component(tmp_path: Path) -> None:
    adapter = KernelExecCodeExecutor(
        kind="docker-command", work_dir=tmp_path, timeout=9, image="kernelexec/python:latest"
    )
    model = adapter.dump_component()
    assert model.config["options"] == {"image": "kernelexec/python:latest"}
    loaded = CodeExecutor.load_component(model)
    assert isinstance(loaded, KernelExecCodeExecutor)
    assert loaded.dump_component().config == model.config
    assert loaded.executor.backend.options.image == "kernelexec/python:latest"  # type: ignore[attr-defined]
    run(adapter.stop)
    run(loaded.stop)


def test_work_dir_and_timeout_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    adapter = KernelExecCodeExecutor(kind="command", work_dir="rel", timeout=7)
    assert adapter.work_dir == Path("rel") and adapter.timeout == 7
    assert adapter.executor.work_dir == tmp_path / "rel"
    assert os.path.isdir("rel")
    run(adapter.stop)
