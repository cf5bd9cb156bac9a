"""The result model: AG2/AutoGen field names, the reply format, JSON, combining block results."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kernelexec import CodeBlock, ErrorInfo, ExecutionResult
from kernelexec._executor import NO_BLOCKS_MESSAGE, combine_results, error_result


def _result(**changes: object) -> ExecutionResult:
    base = ExecutionResult(
        exit_code=0,
        output="hello\n",
        stdout="hello\n",
        files=[Path("/w/scatter.png"), Path("/w/data.csv")],
        code_file="/w/tmp_code_abc.py",
        duration_s=0.1234567,
    )
    return base.with_changes(**changes)


def test_ag2_autogen_field_names() -> None:
    result = _result()
    assert result.exit_code == 0
    assert result.exitcode == 0
    assert result.output == "hello\n"
    assert result.code_file == "/w/tmp_code_abc.py"
    assert result.output_files == ["/w/scatter.png", "/w/data.csv"]
    assert result.ok


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, "exitcode: 0 (execution succeeded)\nCode output: hello\n"),
        ({"exit_code": 1, "output": "boom"}, "exitcode: 1 (execution failed)\nCode output: boom"),
        (
            {"exit_code": 124, "timed_out": True, "output": "Timeout"},
            "exitcode: 124 (execution timed out)\nCode output: Timeout",
        ),
    ],
)
def test_to_reply(changes: dict[str, object], expected: str) -> None:
    assert _result(**changes).to_reply() == expected


def test_to_dict_is_json_serialisable() -> None:
    result = _result(
        exit_code=1,
        error=ErrorInfo("ValueError", "bad", ["Traceback...", "ValueError: bad"]),
        full_output_file=Path("/w/.kernelexec/output/block-1.txt"),
        outputs=[{"output_type": "stream", "name": "stdout", "text": "hello\n"}],
    )
    data = json.loads(json.dumps(result.to_dict()))
    assert data["exit_code"] == 1
    assert data["error"] == {
        "ename": "ValueError",
        "evalue": "bad",
        "traceback": ["Traceback...", "ValueError: bad"],
    }
    assert data["files"] == ["/w/scatter.png", "/w/data.csv"]
    assert data["full_output_file"] == "/w/.kernelexec/output/block-1.txt"
    assert data["duration_s"] == 0.123457
    assert data["outputs"][0]["text"] == "hello\n"
    assert {"output", "stdout", "stderr", "code_file", "timed_out", "truncated"} <= set(data)


def test_results_are_frozen() -> None:
    result = _result()
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.exit_code = 1  # type: ignore[misc]
    assert result.with_changes(exit_code=1).exit_code == 1
    assert result.exit_code == 0


def test_error_info_str() -> None:
    assert str(ErrorInfo("KeyError", "'x'")) == "KeyError: 'x'"
    assert str(ErrorInfo("SystemExit", "")) == "SystemExit"


def test_code_block_defaults_to_python() -> None:
    assert CodeBlock("print(1)") == CodeBlock(code="print(1)", language="python")


def test_rich_display_shows_reply_and_images() -> None:
    png = "iVBORw0KGgo="
    result = _result(outputs=[{"output_type": "display_data", "data": {"image/png": png}}])
    bundle = result._repr_mimebundle_()
    assert bundle["text/plain"] == result.to_reply()
    assert f"data:image/png;base64,{png}" in bundle["text/html"]
    assert "<pre>hello\n</pre>" in bundle["text/html"]


def test_html_escapes_output() -> None:
    assert "&lt;script&gt;" in _result(output="<script>")._repr_html_()


def test_combine_no_results_says_nothing_ran() -> None:
    combined = combine_results([])
    assert combined.exit_code == 0
    assert combined.output == NO_BLOCKS_MESSAGE


def test_combine_concatenates_in_order_and_last_exit_code_wins() -> None:
    first = _result(output="a\n", stdout="a\n", files=[Path("/w/a")], duration_s=1.0)
    failed = error_result("Block refused: nope", language="python")
    combined = combine_results([first, failed])
    assert combined.exit_code == 1
    assert combined.output == "a\n\nBlock refused: nope"
    assert combined.stdout == "a\n"
    assert combined.error is not None and combined.error.ename == "InvalidBlock"
    assert combined.files == [Path("/w/a")]
    assert combined.duration_s == 1.0
    assert combined.block_results == [first, failed]
    assert [o["output_type"] for o in combined.outputs] == ["error"]


def test_combine_single_result_is_that_result() -> None:
    only = _result()
    assert combine_results([only]) is only
