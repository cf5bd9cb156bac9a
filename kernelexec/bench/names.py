"""The names ``kernelexec bench`` accepts, kept apart from the modules that use them.

Building the command line's parser (``kernelexec --help``) reads these and nothing else: the
rows, workloads, tables and charts (asyncio, rich, matplotlib, jupyter_client) are imported only
when the benchmark runs. ``executors.SPECS`` and ``workloads`` must list the same names in the
same order (a unit test checks it).
"""

from __future__ import annotations

from .. import DockerOptions

#: the workloads, in table order
WORKLOAD_NAMES: tuple[str, ...] = ("trivial", "imports", "analysis", "plots", "outputs")

#: the executor rows, in table order: floors, kernelexec's executors, the peers
EXECUTOR_NAMES: tuple[str, ...] = (
    "subprocess",
    "jupyter-client",
    "docker-exec",
    "docker-run",
    "command",
    "warm-command",
    "kernel",
    "fork-kernel",
    "sandboxed-command",
    "sandboxed-kernel",
    "docker-command",
    "docker-kernel",
    "gvisor-command",
    "gvisor-kernel",
    "pool",
    "ag2-command",
    "ag2-jupyter",
    "autogen-command",
    "autogen-jupyter",
)

#: group names ``--executors`` also accepts -> the rows' ``group``
GROUPS: dict[str, str] = {"floors": "floor", "kernelexec": "kernelexec", "peers": "peer"}

#: the image the Docker rows run in: kernelexec's own default
DEFAULT_IMAGE: str = DockerOptions.image
