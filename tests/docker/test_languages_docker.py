"""R, Deno and bash kernels in a docker-kernel session (issue 36): they run in the SAME container
as the session's Python kernel, from the image ``kernelexec image build --offline --languages
r,js,bash`` makes (``kernelexec/python:langs``), under runc and under gVisor.

One session per runtime is shared by the tests whose state does not matter (its kernels start
once); the tests that kill kernels or need another image make their own.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from kx_docker_helpers import containers_of, processes, require_runtime
from kx_languages import (
    TIMEOUT_FIELDS,
    check_errors_are_error_info,
    check_flood_is_held_to_the_budget,
    check_notebook_cells_have_their_languages,
    check_r_stdin_is_answered,
    check_timeout_keeps_state,
    timeout_cases,
)

from kernelexec import DockerKernel, KernelExecutor
from kernelexec.backends._docker_options import LANGUAGES_IMAGE

MIXED = """\
```python
with open("data.csv", "w") as f:
    f.write("v\\n3\\n1\\n4\\n")
```

```r
d <- read.csv("data.csv")
total <- sum(d$v)
writeLines(as.character(total), "total.txt")
cat(total, getwd(), system("id -u", intern = TRUE), "\\n")
```

```js
const total = Number(Deno.readTextFileSync("total.txt").trim());
console.log("js", total * 2, Deno.cwd());
```

```ts
const tripled: number = total * 3;
console.log("ts", tripled);
```

```bash
TOTAL=$(cat total.txt)
```

```bash
echo "bash $TOTAL $(id -u)"
```

```r
cat("r again", total)
```
"""


@pytest.fixture(scope="module")
def langs_image(docker_client: docker.DockerClient) -> str:
    try:
        docker_client.images.get(LANGUAGES_IMAGE)
    except docker.errors.ImageNotFound:
        why = f"{LANGUAGES_IMAGE} missing: `kernelexec image build --offline --languages r,js,bash`"
        if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return LANGUAGES_IMAGE


def _session(image: str, folder: Path, **options: object) -> KernelExecutor:
    return KernelExecutor(
        backend=DockerKernel(image=image, **options),  # type: ignore[arg-type]
        work_dir=folder / "work",
        timeout=60,
        languages={"bash": "bash"},
        notebook_path=folder / "session.ipynb",
    )


@pytest.fixture(scope="module")
def ex(langs_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelExecutor]:
    with _session(langs_image, tmp_path_factory.mktemp("langs-docker")) as executor:
        yield executor


def test_a_mixed_message_runs_each_language_in_the_session_container(ex: KernelExecutor) -> None:
    result = ex.execute_message(MIXED)
    outputs = [r.output.strip() for r in result.block_results]
    assert [r.exit_code for r in result.block_results] == [0] * 7, outputs
    # Each language keeps its own state; all see the one work dir (/workspace), as uid 1000.
    assert outputs[1] == "8 /workspace 1000"
    assert outputs[2:4] == ["js 16 /workspace", "ts 24"]
    assert outputs[5] == "bash 8 1000" and outputs[6] == "r again 8"
    # The kernels are processes of the session's one container, not containers of their own.
    backend = ex.aio.backend
    assert isinstance(backend, DockerKernel)
    running = " ".join(processes(backend.container))
    assert "IRkernel::main()" in running and "deno jupyter" in running and "bash_kernel" in running
    client = backend.container.client
    assert len(containers_of(client, backend.session)) == 1


def test_rich_outputs_and_errors(ex: KernelExecutor) -> None:
    plot = ex.execute("plot(1:10, main = 'ten')", "r")
    pngs = [p for p in plot.files if p.suffix == ".png"]
    assert plot.exit_code == 0 and len(pngs) == 1
    assert pngs[0].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert f"[image/png saved to outputs/{pngs[0].name}]" in plot.output
    check_errors_are_error_info(ex)


@pytest.mark.parametrize(TIMEOUT_FIELDS, timeout_cases("system('sleep 300')", "sleep 300"))
def test_a_timeout_interrupts_the_block_and_keeps_the_state(
    ex: KernelExecutor, language: str, setup: str, stuck: str, check: str, expected: str
) -> None:
    check_timeout_keeps_state(ex, language, setup, stuck, check, expected)
    # What the block started in the container is gone (the container's reaper).
    backend = ex.aio.backend
    assert isinstance(backend, DockerKernel)
    assert not [p for p in processes(backend.container) if p.startswith("sleep 300")]


def test_a_flood_is_held_to_the_output_budget(ex: KernelExecutor) -> None:
    check_flood_is_held_to_the_budget(ex)


def test_an_r_block_that_reads_stdin_is_answered(ex: KernelExecutor) -> None:
    check_r_stdin_is_answered(ex)


def test_the_session_notebook_has_each_cell_with_its_language(ex: KernelExecutor) -> None:
    check_notebook_cells_have_their_languages(ex)


def test_death_is_noticed_and_a_python_restart_ends_the_other_kernels(ex: KernelExecutor) -> None:
    # Last of the shared session's tests: it restarts the session.
    assert ex.execute("x <- 1", "r").exit_code == 0
    died = ex.execute("tools::pskill(Sys.getpid(), 9)", "r")
    assert died.kernel_died and died.state_lost and died.error is not None
    assert "killed by signal SIGKILL" in died.output
    assert ex.execute("exists('x')", "r").output == "[1] FALSE"  # a fresh R kernel
    r_backend = ex.aio._others["ir"].backend
    sockets = r_backend._sockets  # type: ignore[attr-defined]
    assert sockets is not None and sockets.is_dir()
    ex.restart()  # a new container: the R kernel went with the old one, and its sockets
    assert not ex.aio._others and not sockets.exists()


def test_an_image_without_r_says_which_image_to_build(tmp_path: Path) -> None:
    with _session("kernelexec/python:latest", tmp_path) as ex:
        started = time.monotonic()
        result = ex.execute("cat(1)", "r")
        assert time.monotonic() - started < 20
        assert result.not_run and result.error is not None
        assert result.error.ename == "KernelNotInstalled"
        assert "kernelexec image build --offline --languages r" in result.output
        assert LANGUAGES_IMAGE in result.output
        assert ex.execute("print('python still runs')").output == "python still runs\n"


def test_a_kernel_that_dies_at_start_is_a_clear_result(langs_image: str, tmp_path: Path) -> None:
    # A kernelspec in the work dir (JUPYTER_PATH in the container) whose program exits at once.
    spec = tmp_path / "work" / "kernels" / "kernels" / "dies"
    spec.mkdir(parents=True)
    argv = ["sh", "-c", "echo 'no licence for this kernel' >&2; exit 3", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "x"}))
    with KernelExecutor(
        backend=DockerKernel(image=langs_image),
        work_dir=tmp_path / "work",
        timeout=30,
        startup_timeout=20,
        languages={"x": "dies"},
        env={"JUPYTER_PATH": "/workspace/kernels"},
    ) as ex:
        started = time.monotonic()
        result = ex.execute("anything", "x")
        assert time.monotonic() - started < 25
        assert result.not_run and result.error is not None
        assert result.error.ename == "KernelStartFailed"
        assert "exit status 3" in result.output and "no licence" in result.output
        assert ex.execute("print(2)").output == "2\n"


@pytest.mark.gvisor
def test_r_deno_and_bash_under_gvisor(
    langs_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    require_runtime(docker_client, "runsc")
    # gVisor's ptrace platform counts the sandbox's own threads against pids_limit: with R,
    # Deno and bash beside Python the default 256 was hit (the sandbox died, status 2).
    with _session(langs_image, tmp_path, runtime="runsc", pids_limit=1024) as ex:
        # R and Deno (bash_kernel's start under gVisor is the slowest: the runc tests have it)
        result = ex.execute_message(MIXED.split("```bash")[0])
        outputs = [r.output.strip() for r in result.block_results]
        assert outputs[1:] == ["8 /workspace 1000", "js 16 /workspace", "ts 24"], outputs
        stuck = ex.execute("Sys.sleep(300)", "r", timeout=2)
        assert (stuck.timed_out, stuck.state_lost) == (True, False)
        assert ex.execute("cat(total)", "r").output == "8"
        died = ex.execute("tools::pskill(Sys.getpid(), 9)", "r")
        assert died.kernel_died and "killed by signal SIGKILL" in died.output
        assert ex.execute("exists('total')", "r").output == "[1] FALSE"


def test_a_second_build_of_the_languages_image_is_skipped(langs_image: str) -> None:
    from kernelexec._image import build_language_image

    said: list[str] = []
    started = time.monotonic()
    result = build_language_image(["r", "js", "bash"], tag=langs_image, progress=said.append)
    assert result.skipped and time.monotonic() - started < 30, said
    assert "up to date" in said[-1]


def test_an_unknown_language_for_the_image_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kernelexec.cli import main

    assert main(["image", "build", "--offline", "--languages", "r,cobol"]) == 2
    assert "no image recipe for the language 'cobol'" in capsys.readouterr().err
