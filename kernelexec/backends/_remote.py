"""What the back ends whose kernel runs elsewhere (a gateway, a cluster) share."""

from __future__ import annotations

import json
from collections.abc import Mapping

from .._errors import ForkUnsupported


def setup_code(cwd: str | None, env: Mapping[str, str]) -> str:
    """Code run silently after each (re)start: the work dir and env, whatever the server allows.

    Servers and provisioners filter the env of a start request (only ``KERNEL_*`` and an
    allow-list pass, or the launcher rewrites it), and only some honour ``KERNEL_WORKING_DIR``;
    setting both from inside the kernel works on all.
    """
    lines = ["import os as _kx_os"]
    if env:
        lines.append(f"_kx_os.environ.update({json.dumps(dict(env))})")
    if cwd:  # on a remote machine the dir may not exist yet: make it (files stay there)
        lines.append(f"_kx_os.makedirs({cwd!r}, exist_ok=True)")
        lines.append(f"_kx_os.chdir({cwd!r})")
    lines.append("del _kx_os")
    return "\n".join(lines)


def refuse_shared_fork(kind: str, folder: object, option: str = "working_dir") -> None:
    """A fork through a durable snapshot is a second kernel: with a fixed folder (``option``)
    both would work in it (the fork's restore would empty the parent's files), so refuse."""
    if folder is not None:
        raise ForkUnsupported(
            f"this {kind} back end works in the fixed folder {folder}: a fork would share"
            f" it with this session; fork a session made with {option}=None (each kernel in"
            " its executor's own work dir)"
        )
