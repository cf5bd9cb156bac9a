"""The random block sequences of the fidelity tier, as plain functions (no fixtures), so that the
gateway and cluster tiers run the same ones: ``check_sequences(ex, interrupts=...)``.

Each block writes a token of its own (``KX000123Q``: none is part of another) a known number of
times, to stdout, stderr, from a child process, as a partial line, next to a byte that is not
UTF-8, before failing, before running out of time or before being interrupted; and appends the
token to ``runs.txt`` in the kernel's working directory as it starts (the count of runs, the
same for kernels and command back ends; read back through the files API, so a kernel on another
machine counts too). Hypothesis draws the orders, derandomized (the same ones on every run: a
failure reproduces); the failing sequence is in the assertion message.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

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
    interrupted: bool = False  # interrupted with ``interrupt()`` once its token is out


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
    # Interrupted mid-block from another thread, as a user's "stop" button does; what it
    # printed before stays its own, and the block after it runs.
    "interrupt": Kind(
        _COUNT + "import time\nprint('{t}', flush=True)\ntime.sleep(60)", interrupted=True
    ),
    "shell": Kind("echo {t} >> runs.txt\necho {t}\necho {t} >&2", "shell", stderr=1),
}

SETTINGS = settings(
    max_examples=2,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.generate],  # no shrinking: each example costs seconds of real blocks
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _run(ex: Any, kind: str, token: str) -> Any:
    spec = KINDS[kind]
    timeout = TIMEOUT if spec.times_out else 30
    if not spec.interrupted:
        return ex.execute(spec.code.format(t=token), spec.language, timeout=timeout)
    seen = threading.Event()

    def watch(output: dict[str, Any]) -> None:
        if output.get("output_type") == "stream" and token in str(output.get("text", "")):
            seen.set()

    def interrupt() -> None:
        if seen.wait(timeout):
            ex.interrupt()

    ex.aio.on_output = watch
    stopper = threading.Thread(target=interrupt, daemon=True)
    stopper.start()
    try:
        return ex.execute(spec.code.format(t=token), spec.language, timeout=timeout)
    finally:
        ex.aio.on_output = None
        seen.set()  # a block that never printed its token: the thread ends (and interrupts
        stopper.join(timeout)  # nothing: the block is over)


def check(ex: Any, kinds: list[str]) -> None:
    """Run ``kinds`` in order on ``ex``; each ran once, and holds its own output, all of it."""
    tokens = [f"KX{next(_tokens):06d}Q" for _ in kinds]
    results = [_run(ex, kind, token) for kind, token in zip(kinds, tokens, strict=True)]
    where = f"sequence {kinds}"
    for i, (kind, token, r) in enumerate(zip(kinds, tokens, results, strict=True)):
        spec = KINDS[kind]
        at = f"{where}, block {i} ({kind}): {r.to_dict()}"
        assert not r.not_run and not r.kernel_died, at
        assert r.timed_out is spec.times_out, at
        assert r.ok is not (spec.fails or spec.times_out or spec.interrupted), at
        if spec.interrupted:
            assert r.error is not None and r.error.ename == "KeyboardInterrupt", at
        assert (r.stdout.count(token), r.stderr.count(token)) == (spec.stdout, spec.stderr), at
        assert r.output.count(token) >= spec.stdout + spec.stderr, at
        for other in tokens[:i] + tokens[i + 1 :]:
            assert other not in r.output + r.stdout + r.stderr, f"{other} leaked into {at}"
    ran = Counter(t for t in ex.read_file("runs.txt").decode().split() if t in tokens)
    assert ran == Counter(tokens), f"{where}: runs {dict(ran)}"


def check_sequences(ex: Any, *, interrupts: bool) -> None:
    """Every kind once per sequence (each block has other neighbours each time), in orders
    drawn by hypothesis; ``interrupts``: the executor has ``interrupt()`` (kernels)."""
    kinds = sorted(k for k in KINDS if interrupts or not KINDS[k].interrupted)

    @SETTINGS
    @given(st.permutations(kinds))
    def run(order: list[str]) -> None:
        check(ex, order)

    run()
