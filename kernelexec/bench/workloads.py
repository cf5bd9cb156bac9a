"""The workloads: sequences of code blocks as an agent would send them.

Each workload has a stateless version (what an agent must write when nothing survives a block)
and a stateful one (what it writes against a kernel). ``{data}`` in a block stands for the data
file as the executing side sees it (a container sees the work dir at another path), and is
filled in by the session that runs the block.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .names import WORKLOAD_NAMES as WORKLOAD_NAMES

DATA_FILE = "bench-data.csv"
DEFAULT_ROWS = 1_000_000
QUICK_ROWS = 20_000


@dataclass(frozen=True, kw_only=True)
class Block:
    """One block; ``expect`` is a substring its output must contain (a check it really ran)."""

    code: str
    expect: str | None = None
    host_memory: bool = False  # also measure how much the bench's own peak RSS grew
    # the block prints ``SELF_TIME_TAG<seconds>``: what the code itself spent, timed inside it,
    # to which the host's whole time for the block is compared
    self_time: bool = False

    def render(self, data: str) -> str:
        return self.code.replace("{data}", data)


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    description: str
    stateless: tuple[Block, ...]
    stateful: tuple[Block, ...]
    needs: tuple[str, ...] = ()  # modules the executing interpreter must have
    data_rows: int = 0  # > 0: the blocks read a generated CSV of this many rows
    only: tuple[str, ...] | None = None  # the executor rows it runs on (None: every row)

    def blocks(self, stateful: bool) -> tuple[Block, ...]:
        return self.stateful if stateful else self.stateless


def trivial(quick: bool) -> Workload:
    blocks = tuple(Block(code="print(1)", expect="1") for _ in range(5 if quick else 20))
    return Workload(
        name="trivial",
        description="print(1), repeated: the round-trip cost of a block",
        stateless=blocks,
        stateful=blocks,
    )


# The first block builds a DataFrame: with pandas in a fork server's warm-up list, its time is
# the fork kernel's "first DataFrame block" target.
_IMPORT_BLOCKS = (
    "import numpy as np\nimport pandas as pd\n"
    "df = pd.DataFrame({'a': np.arange(10), 'b': np.arange(10) ** 2})\nprint(int(df.b.sum()))",
    "import numpy as np\nimport pandas as pd\nprint(int(np.arange(100).sum()))",
    "import numpy as np\nimport pandas as pd\n"
    "s = pd.Series(np.linspace(0, 1, 1000))\nprint(round(float(s.mean()), 3))",
    "import numpy as np\nimport pandas as pd\nprint(pd.__version__.count('.') > 0)",
)
_IMPORT_EXPECT = ("285", "4950", "0.5", "True")


def imports(quick: bool) -> Workload:
    count = 3 if quick else 12
    blocks = tuple(
        Block(code=_IMPORT_BLOCKS[i % 4], expect=_IMPORT_EXPECT[i % 4]) for i in range(count)
    )
    return Workload(
        name="imports",
        description="blocks using numpy and pandas (stateless pays the imports every block)",
        stateless=blocks,
        stateful=blocks,
        needs=("numpy", "pandas"),
    )


# The analysis session. A stateless block must redo everything it depends on: this prologue
# is what an agent writes at the top of every block when nothing survives.
_LOAD = "import pandas as pd\ndf = pd.read_csv({data!r})\n"
_CLEAN = (
    "df = df.dropna(subset=['value'])\n"
    "df = df[df['value'] >= 0]\n"
    "df['day'] = pd.to_datetime(df['date']).dt.day_name()\n"
)
_STEPS: tuple[tuple[str, str, str], ...] = (
    # (needs: "" | "load" | "clean", code, expect)
    ("", "import pandas as pd\nimport numpy as np\nprint('ready')", "ready"),
    ("", "df = pd.read_csv({data!r})\nprint(df.shape[1])", "5"),
    ("load", "print(int(df['value'].isna().sum()) >= 0)", "True"),
    ("load", _CLEAN + "print('clean', len(df) > 0)", "clean True"),
    (
        "clean",
        "by_cat = df.groupby('category')['value'].agg(['mean', 'count'])\nprint(len(by_cat))",
        "8",
    ),
    ("clean", "by_day = df.groupby('day')['value'].sum()\nprint(len(by_day))", "7"),
    (
        "clean",
        "pivot = df.pivot_table(index='category', columns='day', values='value',"
        " aggfunc='mean')\nprint(pivot.shape)",
        "(8, 7)",
    ),
    ("clean", "top = df.nlargest(5, 'value')[['category', 'value']]\nprint(len(top))", "5"),
    (
        "clean",
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "ax = df.groupby('category')['value'].mean().plot.bar()\n"
        "ax.figure.savefig('by_category.png')\nplt.close('all')\nprint('saved')",
        "saved",
    ),
    ("clean", "q = df['value'].quantile([0.25, 0.5, 0.75])\nprint(len(q))", "3"),
)


def _analysis_blocks(stateful: bool) -> tuple[Block, ...]:
    blocks = []
    for needs, code, expect in _STEPS:
        text = code
        if not stateful:
            # Every stateless block re-imports and re-reads what it uses.
            prologue = "import pandas as pd\nimport numpy as np\n"
            if needs in ("load", "clean"):
                prologue += _LOAD
            if needs == "clean":
                prologue += _CLEAN
            text = code if text.startswith("import pandas") else prologue + text
        blocks.append(Block(code=text.replace("{data!r}", "'{data}'"), expect=expect))
    return tuple(blocks)


def analysis(quick: bool, rows: int | None = None) -> Workload:
    return Workload(
        name="analysis",
        description="a 10-step pandas session over a generated CSV "
        "(stateless re-reads the data every block; stateful loads it once)",
        stateless=_analysis_blocks(stateful=False),
        stateful=_analysis_blocks(stateful=True),
        needs=("numpy", "pandas", "matplotlib"),
        data_rows=rows or (QUICK_ROWS if quick else DEFAULT_ROWS),
    )


# Outputs at wire speed (issue 17): many small rich outputs, then a flood of stdout. The last
# line is printed after the flood, so seeing it proves the block's end was collected too.
OUTPUT_DISPLAYS = 10_000
OUTPUT_STDOUT_MB = 100
OUTPUT_ROWS = ("jupyter-client", "kernel", "fork-kernel")
SELF_TIME_TAG = "self_s="


def display_code(n: int) -> str:
    """``n`` small HTML displays (the outputs workload's first block, and outputs_wire.py's)."""
    return (
        "from IPython.display import HTML, display\n"
        f"for i in range({n}):\n    display(HTML(f'<b>{{i}}</b>'))\n"
    )


def stdout_code(megabytes: int) -> str:
    """``megabytes`` MB of stdout in 1 MB writes of 100-character lines."""
    return (
        "import sys\nchunk = ('x' * 99 + '\\n') * 10_000\n"
        f"for _ in range({megabytes}):\n    sys.stdout.write(chunk)\n"
    )


def outputs(quick: bool) -> Workload:
    displays = OUTPUT_DISPLAYS // 10 if quick else OUTPUT_DISPLAYS
    megabytes = OUTPUT_STDOUT_MB // 10 if quick else OUTPUT_STDOUT_MB
    # The kernel's own cost (IPython's formatter, ipykernel's publisher), timed inside the block:
    # the host's time for the block is compared with it.
    show = (
        "import time as _kx_time\n_kx_t0 = _kx_time.perf_counter()\n"
        + display_code(displays)
        + f"print('shown', {displays}, '{SELF_TIME_TAG}%.6f' % "
        "(_kx_time.perf_counter() - _kx_t0))"
    )
    flood = stdout_code(megabytes) + f"print('wrote', {megabytes}, 'MB')"
    blocks = (
        Block(code=show, expect=f"shown {displays}", self_time=True),
        Block(code=flood, expect=f"wrote {megabytes} MB", host_memory=True),
    )
    return Workload(
        name="outputs",
        description=f"{displays:,} small HTML displays, then {megabytes} MB of stdout "
        "(collecting outputs: kernels only)",
        stateless=blocks,
        stateful=blocks,
        needs=("IPython",),
        only=OUTPUT_ROWS,
    )


_PLOT = (
    "import matplotlib.pyplot as plt\nimport numpy as np\n"
    "x = np.linspace(0, 10, 500)\nfig, ax = plt.subplots()\n"
    "ax.plot(x, np.sin(x * {i}))\nax.set_title('figure {i}')\n"
)


def plots(quick: bool) -> Workload:
    count = 2 if quick else 8
    # Stateless: no display to capture, so the agent saves the figure itself (MPLBACKEND=Agg).
    stateless = tuple(
        Block(
            code=_PLOT.replace("{i}", str(i + 1))
            + f"fig.savefig('figure{i + 1}.png')\nprint('figure {i + 1}')",
            expect=f"figure {i + 1}",
        )
        for i in range(count)
    )
    # Stateful: the kernel's inline backend captures the figure as display_data.
    stateful = tuple(
        Block(
            code=_PLOT.replace("{i}", str(i + 1)) + f"plt.show()\nprint('figure {i + 1}')",
            expect=f"figure {i + 1}",
        )
        for i in range(count)
    )
    return Workload(
        name="plots",
        description="one matplotlib figure per block (rich output capture cost)",
        stateless=stateless,
        stateful=stateful,
        needs=("numpy", "matplotlib"),
    )


def build_workloads(
    names: Sequence[str], *, quick: bool, rows: int | None = None
) -> list[Workload]:
    """The named workloads, in the order given; unknown names raise ``ValueError``."""
    unknown = [n for n in names if n not in WORKLOAD_NAMES]
    if unknown:
        raise ValueError(
            f"unknown workload(s): {', '.join(unknown)} (valid: {', '.join(WORKLOAD_NAMES)})"
        )
    makers = {"trivial": trivial, "imports": imports, "plots": plots, "outputs": outputs}
    return [analysis(quick, rows) if name == "analysis" else makers[name](quick) for name in names]


def generate_csv(path: Path, rows: int, *, seed: int = 5) -> Path:
    """Write the analysis data set (deterministic for a seed); reuse it if already there."""
    marker = path.with_suffix(f".{rows}-{seed}.ok")
    if path.exists() and marker.exists():
        return path
    rng = random.Random(seed)
    categories = [f"cat{i}" for i in range(8)]
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "date", "category", "value", "flag"])
        for i in range(rows):
            # About 2% missing and 1% negative values, so the cleaning step has work to do.
            draw = rng.random()
            value = "" if draw < 0.02 else f"{rng.gauss(100, 30) * (-1 if draw > 0.99 else 1):.3f}"
            day = 1 + i % 28
            writer.writerow([i, f"2024-02-{day:02d}", categories[i % 8], value, i % 2])
    os.replace(tmp, path)
    marker.touch()
    return path


def place_data(source: Path, work_dir: Path) -> Path:
    """Put the data file into a session's work dir: a hard link when possible, else a copy."""
    target = work_dir / DATA_FILE
    if target.exists():
        return target
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    return target
