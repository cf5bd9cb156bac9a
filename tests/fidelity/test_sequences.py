"""Seeded random sequences of blocks, on every back end: each block ran exactly once, its result
holds exactly what it wrote, and nothing of it turns up in a neighbour's result (issue 31).

Each block writes a token of its own (``KX000123Q``: none is part of another) a known number of
times, to stdout, stderr, from a child process, as a partial line, next to a byte that is not
UTF-8, before failing or before running out of time; and appends the token to ``runs.txt`` in
the work dir as it starts (the count of runs, the same for kernels and command back ends).
Hypothesis draws the orders, derandomized (the same ones on every run: a failure reproduces);
the failing sequence is in the assertion message.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kx_fidelity import COMMANDS, KERNELS, params

_tokens = itertools.count(1)
TIMEOUT = 1.0


@dataclass(frozen=True)
class Kind:
    """A kind of block: its code (``{t}`` is its token), the language, and what it writes."""

    code: str
    language: str = "python"
    stdout: int = 1  # times the token is in stdout
    stderr: int = 0  # times the token is in stderr
    fails: bool = False
    times_out: bool = False


_COUNT = "_ = open('runs.txt', 'a').write('{t}\\n')\n"
KINDS = {
    "print": Kind(_COUNT + "print(*['{t}'] * 3, sep='\\n')", stdout=3),
    "stderr": Kind(_COUNT + "import sys\nprint('{t}', file=sys.stderr)", stdout=0, stderr=1),
    "partial": Kind(_COUNT + "import sys\nsys.stdout.write('{t}-no-newline')"),
    "binary": Kind(_COUNT + "import os, sys\nsys.stdout.flush()\n_ = os.write(1, b'{t}\\xff\\n')"),
    "child": Kind(
        _COUNT + "import subprocess\nsubprocess.run(['sh', '-c', 'echo {t}; echo {t} >&2'])",
        stderr=1,
    ),
    "fail": Kind(_COUNT + "print('{t}')\nraise ValueError('boom')", fails=True),
    "timeout": Kind(
        _COUNT + "import time\nprint('{t}', flush=True)\ntime.sleep(60)", times_out=True
    ),
    "shell": Kind("echo {t} >> runs.txt\necho {t}\necho {t} >&2", "shell", stderr=1),
}

# Every kind once per sequence, in an order drawn (each block has other neighbours each time;
# one timeout per sequence, which costs a second or more).
SEQUENCES = st.permutations(sorted(KINDS))
SETTINGS = settings(
    max_examples=2,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.generate],  # no shrinking: each example costs seconds of real blocks
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _check(ex: Any, kinds: list[str]) -> None:
    runs = ex.work_dir / "runs.txt"
    runs.unlink(missing_ok=True)
    tokens = [f"KX{next(_tokens):06d}Q" for _ in kinds]
    results = []
    for kind, token in zip(kinds, tokens, strict=True):
        spec = KINDS[kind]
        timeout = TIMEOUT if spec.times_out else 30
        results.append(ex.execute(spec.code.format(t=token), spec.language, timeout=timeout))
    where = f"sequence {kinds}"
    for i, (kind, token, r) in enumerate(zip(kinds, tokens, results, strict=True)):
        spec = KINDS[kind]
        at = f"{where}, block {i} ({kind}): {r.to_dict()}"
        assert not r.not_run and not r.kernel_died, at
        assert r.timed_out is spec.times_out, at
        assert r.ok is not (spec.fails or spec.times_out), at
        assert (r.stdout.count(token), r.stderr.count(token)) == (spec.stdout, spec.stderr), at
        assert r.output.count(token) >= spec.stdout + spec.stderr, at
        for other in tokens[:i] + tokens[i + 1 :]:
            assert other not in r.output + r.stdout + r.stderr, f"{other} leaked into {at}"
    ran = Counter(runs.read_text().split())
    assert ran == Counter(tokens), f"{where}: runs {dict(ran)}"


@pytest.mark.parametrize("backend", params(KERNELS + COMMANDS), indirect=True)
def test_random_sequences(ex: Any) -> None:
    @SETTINGS
    @given(SEQUENCES)
    def check(kinds: list[str]) -> None:
        _check(ex, kinds)

    check()
