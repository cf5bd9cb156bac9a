"""Every workload through every executor row, floors and peers included (the README's figures).

    python benchmarks/run_all.py [--quick] [any other `kernelexec bench` option]

The same as ``kernelexec bench`` (files go to ``bench-results/`` unless ``--out`` says otherwise).
Rows that cannot run here (no Docker engine, image not built, a peer not installed) are listed as
unavailable with the reason; the rest run.
"""

from __future__ import annotations

import sys

from kernelexec.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
