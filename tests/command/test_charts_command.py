"""Charts as data from the stateless executors: the block's own process makes each figure's chart
document (the kernels' extractor, run by kernelexec's figure backend); the host reads it as enemy
data, within bounds, and says the figure's line as the kernels do."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelexec import BackendUnavailable, CommandLineExecutor, make_executor
from kernelexec._charts import CHART_MIME
from kernelexec.backends._sandbox import check_sandbox

pytestmark = pytest.mark.command

KINDS = ["command", "warm-command", "sandboxed-command"]
OPTIONS: dict[str, dict[str, Any]] = {"warm-command": {"warm_up": ("matplotlib.pyplot",)}}

# a bar chart shown, then a histogram left open at the block's end (saved by the backend's atexit)
FIGURES = (
    "import matplotlib.pyplot as plt\n"
    "print('before')\n"
    "plt.bar(['north', 'south', 'east'], [3, 5, 2]); plt.title('Sales'); plt.show()\n"
    "plt.hist([1, 2, 2, 3, 3, 3], bins=3)\n"
    "print('after')\n"
)


def _sandbox_missing() -> str | None:
    try:
        check_sandbox()
    except BackendUnavailable as exc:
        if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
            raise
        return str(exc)
    return None


@pytest.fixture(scope="module", params=KINDS)
def executor(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    kind = request.param
    if kind.startswith("sandboxed") and (why := _sandbox_missing()):
        pytest.skip(why)
    work = tmp_path_factory.mktemp(kind)
    with make_executor(kind, work_dir=work, timeout=120, **OPTIONS.get(kind, {})) as ex:
        yield ex


@pytest.fixture(scope="module")
def command(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CommandLineExecutor]:
    with CommandLineExecutor(work_dir=tmp_path_factory.mktemp("command"), timeout=60) as ex:
        yield ex


def _charts(result: Any) -> list[dict[str, Any]]:
    return [o for o in result.outputs if o["output_type"] == "display_data"]


def test_a_figure_gives_its_chart_document_and_line(executor: Any) -> None:
    r = executor.execute(FIGURES)
    assert r.ok, r.output
    n = r.output.split("outputs/cell")[1].split("-")[0]  # the block's cell number
    assert r.output.splitlines() == [
        "before",
        '[chart: bar "Sales": x 3 categories (north, south, east), y 2-5; '
        f"saved to outputs/cell{n}-1.png]",
        "after",
        "[chart: histogram: x 1-3 (3 bins, 6 values), y count 1-3; "
        f"saved to outputs/cell{n}-2.png]",
    ]
    bar, hist = _charts(r)
    assert bar["metadata"]["kernelexec"]["file"] == f"outputs/cell{n}-1.png"
    (series,) = bar["data"][CHART_MIME]["axes"][0]["series"]
    assert series["x"] == ["north", "south", "east"] and series["y"] == [3, 5, 2]
    (axes,) = hist["data"][CHART_MIME]["axes"]
    assert axes["type"] == "histogram" and axes["series"][0]["y"] == [1.0, 2.0, 3.0]
    # stdout keeps what the block printed; the documents are read once and removed
    assert f"[image/png saved to outputs/cell{n}-1.png]" in r.stdout
    assert list((Path(executor.work_dir) / "outputs").glob("*.json")) == []
    assert {p.name for p in r.files} == {f"cell{n}-1.png", f"cell{n}-2.png"}


def test_a_million_points_are_bounded_and_an_unknown_type_said(
    command: CommandLineExecutor,
) -> None:
    r = command.execute(
        "import matplotlib.pyplot as plt\n"
        "plt.plot(range(1_000_000)); plt.show()\n"
        "plt.fill_between([0, 1, 2], [0, 1, 0]); plt.show()\n"
    )
    assert r.ok, r.output
    line, unknown = (o["data"][CHART_MIME]["axes"][0] for o in _charts(r))
    assert line["series"][0]["count"] == 1_000_000 and len(line["series"][0]["y"]) <= 200
    assert "(1000000 points), y 0-1M;" in r.output
    assert unknown["type"] == "unknown"
    assert "chart: unknown: chart type not recognised (found " in (r.output)


def test_charts_false_gives_the_plain_line_and_writes_no_document(tmp_path: Path) -> None:
    with CommandLineExecutor(work_dir=tmp_path, charts=False) as ex:
        r = ex.execute("import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()")
    assert r.ok, r.output
    assert r.output == "[image/png saved to outputs/cell1-1.png]\n"
    assert _charts(r) == [] and list((tmp_path / "outputs").iterdir()) == [r.files[0]]


# The block writes its own "documents" where its figures' go and prints the figures' lines.
FORGED = """\
import json, os
prefix = os.environ['KERNELEXEC_FIGURE_PREFIX']
os.makedirs(os.path.dirname(prefix), exist_ok=True)
def forge(k, raw):
    if raw is not None:
        with open(f'{prefix}{k}.chart.json', 'w') as f:
            f.write(raw)
    print(f'[image/png saved to {prefix}{k}.png]')
forge(1, 'x' * (2 << 20))                        # past the size bound
forge(2, '[1, 2]')                               # not a document
forge(3, '[' * 100_000 + ']' * 100_000)          # nested past the parser's depth
os.symlink('/etc/passwd', f'{prefix}4.chart.json')  # a link: never followed
print(f'[image/png saved to {prefix}4.png]')
forge(5, None)                                   # no document at all
os.mkfifo(f'{prefix}7.chart.json')               # a FIFO: never opened (no hang)
print(f'[image/png saved to {prefix}7.png]')
forge(6, json.dumps({'axes': [{'type': 'line', 'title': 'a\\x1b[2J\\nb' + 'z' * 500,
                               'series': [{'count': 'many', 'y_range': [0, 'x']}]}]}))
"""


def test_forged_documents_are_refused_or_bounded_and_the_block_is_not_failed(
    command: CommandLineExecutor,
) -> None:
    outputs = Path(command.work_dir) / "outputs"
    before = set(outputs.iterdir()) if outputs.exists() else set()  # earlier tests' figures
    r = command.execute(FORGED)
    assert r.ok, r.output
    lines = r.output.splitlines()
    assert all(line.startswith("[image/png saved to ") for line in lines[:6]), lines
    (doc,) = _charts(r)  # the one of figure 6: a dict, read with every field type-checked
    assert lines[6].startswith('[chart: line "a ') and "\x1b" not in lines[6]
    assert len(lines[6]) < 200 and lines[6].endswith("-6.png]")
    assert doc["metadata"]["kernelexec"]["file"].endswith("-6.png")
    assert Path("/etc/passwd").exists()  # the link was unlinked, not its target
    assert set(outputs.iterdir()) == before  # every forged document removed


def test_documents_per_block_are_bounded(command: CommandLineExecutor) -> None:
    outputs = Path(command.work_dir) / "outputs"
    before = set(outputs.iterdir()) if outputs.exists() else set()  # earlier tests' figures
    r = command.execute(
        "import os\n"
        "prefix = os.environ['KERNELEXEC_FIGURE_PREFIX']\n"
        "os.makedirs(os.path.dirname(prefix), exist_ok=True)\n"
        "for k in range(1, 101):\n"
        "    open(f'{prefix}{k}.chart.json', 'w').write('{\"axes\": []}')\n"
        "    print(f'[image/png saved to {prefix}{k}.png]')\n"
    )
    assert r.ok, r.output
    assert len(_charts(r)) == 64
    assert r.output.count("[chart: no axes; saved to") == 64
    assert r.output.count("[image/png saved to") == 36
    assert set(outputs.iterdir()) == before


def test_the_chart_is_shown_live_in_its_place(tmp_path: Path) -> None:
    shown: list[dict[str, Any]] = []
    with CommandLineExecutor(work_dir=tmp_path, on_output=shown.append) as ex:
        r = ex.execute(
            "import matplotlib.pyplot as plt\n"
            "print('before', flush=True); plt.plot([1, 2]); plt.show(); print('after')"
        )
    assert r.ok, r.output
    kinds: list[tuple[str, str]] = []
    for o in shown:  # stream text as one piece between displays (it comes in any chunks)
        if o["output_type"] == "stream" and kinds and kinds[-1][0] == "stream":
            kinds[-1] = ("stream", kinds[-1][1] + o["text"])
        else:
            kinds.append((o["output_type"], o.get("text") or o["data"]["text/plain"]))
    assert kinds == [
        ("stream", "before\n"),
        ("display_data", "chart: line: x (2 points), y 1-2"),
        ("stream", "after\n"),
    ]
