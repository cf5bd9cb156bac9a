"""Other languages in a fork-server session: an R or JavaScript block starts its kernel beside the
forked Python one (a local kernel: an IRkernel cannot be forked from a Python server), in the
same folder, held as the forked kernel is, and ended with the session."""

from __future__ import annotations

from pathlib import Path

from kx_languages import gone, need_kernels, running

from kernelexec import make_executor
from kernelexec.backends import _containment

MIXED = """\
```python
_ = open("from_python.txt", "w").write("7")
```

```r
total <- as.numeric(readLines("from_python.txt", warn = FALSE)) * 2
system2("sleep", "4713", wait = FALSE)
```

```r
cat("r", total, "\\n")
```

```js
console.log("js", Number(Deno.readTextFileSync("from_python.txt")) * 3);
```
"""


def test_a_fork_kernel_session_runs_r_and_javascript_beside_it(tmp_path: Path) -> None:
    need_kernels("r", "javascript")
    with make_executor("fork-kernel", work_dir=tmp_path, timeout=60) as ex:
        assert {"r", "javascript", "typescript"} <= set(ex.supported_languages)
        result = ex.execute_message(MIXED)
        assert result.exit_code == 0, result.output
        assert [r.language for r in result.block_results] == ["python", "r", "r", "javascript"]
        lines = [line.strip() for line in result.output.splitlines() if line.strip()]
        assert lines == ["r 14", "js 21"]
        r_kernel = ex.aio._others["ir"].backend
        if _containment.mechanism().startswith("cgroup"):  # held in a cgroup of its own
            cgroup = Path(f"/proc/{r_kernel.pid}/cgroup").read_text()
            assert cgroup != Path("/proc/self/cgroup").read_text()
        assert running("sleep", "4713")
    # what the R block left running ended with the session, as the R kernel did
    assert gone(r_kernel.pid) and not running("sleep", "4713")
