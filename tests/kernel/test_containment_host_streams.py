"""A local kernel's own stdout and stderr never reach the host process's (issue 13.7)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelexec import KernelExecutor, KernelStartFailed

_HOST = textwrap.dedent(
    """
    from kernelexec import KernelExecutor

    code = '''
    import os, subprocess, sys
    os.write(1, b"LE" b"AK-FD1\\\\n")
    os.write(2, b"LE" b"AK-FD2\\\\n")
    child = "import sys; print('LE' 'AK-CHILD-OUT'); sys.stderr.write('LE' 'AK-CHILD-ERR')"
    subprocess.run([sys.executable, "-c", child])
    print("LE" "AK-PRINT")
    '''
    with KernelExecutor(timeout=60) as ex:
        result = ex.execute(code)
    words = ("FD1", "CHILD-OUT", "CHILD-ERR", "PRINT")
    seen = sorted(w for w in words if "LEAK-" + w in result.output)
    print("RESULT", result.exit_code, ",".join(seen))
    """
)


def test_kernel_output_reaches_the_result_but_never_the_hosts_streams() -> None:
    host = subprocess.run(
        [sys.executable, "-c", _HOST], capture_output=True, text=True, timeout=120, check=False
    )
    assert host.returncode == 0, host.stderr
    # The result has what the kernel captures (print, and fd 1/2 which ipykernel captures)...
    assert "RESULT 0 " in host.stdout, host.stdout
    assert "PRINT" in host.stdout.split("RESULT 0 ", 1)[1]
    # ...and nothing the kernel or its children wrote reaches the host's own stdout or stderr.
    assert "LEAK-" not in host.stdout, host.stdout
    assert "LEAK-" not in host.stderr, host.stderr


def test_a_kernel_that_dies_at_start_says_what_it_wrote_to_stderr(tmp_path: Path) -> None:
    """Its stderr no longer reaches the host's, so the error carries its last line instead."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\n'  # the ipykernel check
        "echo 'boom: no kernel today' >&2\n"
        "exit 3\n"
    )
    fake.chmod(0o755)
    with (
        pytest.raises(KernelStartFailed, match=r"exit status 3\): boom: no kernel today"),
        KernelExecutor(python=str(fake), work_dir=tmp_path / "work"),
    ):
        pass
