"""What the back ends whose kernel runs elsewhere (a gateway, a cluster) share."""

from __future__ import annotations

import json
from collections.abc import Mapping


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
