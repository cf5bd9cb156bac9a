"""Other languages on gateway kernels: an R or JavaScript block of a gateway session runs in a
kernel of that language's kernelspec on the same gateway (same folder); a kernelspec the
gateway does not list is a clear result naming it and what the gateway lists."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_servers import Gateway

from kernelexec import KernelExecutor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the kx_ helpers
from kx_languages import need_kernels

MIXED = """\
```python
_ = open("from_python.txt", "w").write("7")
```

```r
total <- as.numeric(readLines('from_python.txt', warn = FALSE)) * 2
```

```r
cat("r", total, "\\n")
```

```js
const n = Number(Deno.readTextFileSync("from_python.txt")) * 3;
console.log("js", n);
```
"""


@pytest.fixture(scope="module")
def ex(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    need_kernels("r", "javascript")
    work = tmp_path_factory.mktemp(f"{gateway.name}-languages")
    with KernelExecutor(gateway.backend(), work_dir=work, timeout=60) as executor:
        yield executor


def test_a_mixed_message_runs_each_language_on_the_gateway(ex: KernelExecutor) -> None:
    assert ex.supported_languages[:2] == ("python", "shell") and "r" in ex.supported_languages
    result = ex.execute_message(MIXED)
    assert result.exit_code == 0, result.output
    assert [r.language for r in result.block_results] == ["python", "r", "r", "javascript"]
    lines = [line.strip() for line in result.output.splitlines() if line.strip()]
    assert lines == ["r 14", "js 21"]
    # the R kernel is the gateway's (its kernel list has one more), working in the session's folder
    r_kernel = ex.aio._others["ir"].backend
    assert r_kernel.kernel_id not in (None, ex.aio.backend.kernel_id)  # type: ignore[attr-defined]
    assert ex.execute("cat(getwd())", "r").output == str(ex.work_dir)


def test_an_r_error_is_error_info_and_the_r_state_is_kept(ex: KernelExecutor) -> None:
    assert ex.execute("kept <- 'yes'", "r").ok
    failed = ex.execute("stop('no such table')", "r")
    assert failed.exit_code == 1 and failed.error is not None
    assert "no such table" in failed.error.evalue
    assert ex.execute("cat(kept)", "r").output == "yes"


def test_a_kernelspec_the_gateway_does_not_list_is_named(gateway: Gateway, tmp_path: Path) -> None:
    backend = gateway.backend()
    with KernelExecutor(
        backend, work_dir=tmp_path, timeout=30, languages={"cobol": "no-such-kernel"}
    ) as ex:
        result = ex.execute("DISPLAY 'HI'.", "cobol")
        assert result.not_run and result.error is not None
        assert result.error.ename == "KernelNotInstalled"
        assert f"no kernelspec named 'no-such-kernel' on the gateway {gateway.url}" in (
            result.output
        )
        assert "which lists: " in result.output and "python3" in result.output
        assert ex.execute("print('python still runs')").output == "python still runs\n"
