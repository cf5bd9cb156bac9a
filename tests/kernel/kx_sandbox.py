"""Whether the bubblewrap sandbox can run here (a module of its own: tests/kernel is not a
package, and ``conftest`` is not importable by name when several exist)."""

from __future__ import annotations

import os


def sandbox_unavailable() -> str | None:
    """Why the sandbox cannot run here (None when it can). With ``KERNELEXEC_REQUIRE_SANDBOX=1``
    (set by CI) a missing sandbox fails instead of skipping."""
    from kernelexec import BackendUnavailable
    from kernelexec.backends._sandbox import check_sandbox

    try:
        check_sandbox()
    except BackendUnavailable as exc:
        if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
            raise
        return str(exc)
    return None
