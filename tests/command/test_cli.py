"""``kernelexec run`` as a user runs it: a real ``python -m kernelexec`` process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kernelexec


def kx(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelexec", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # Another executor may become the default: these tests are about the command executor.
    return kx("run", *args, "--executor", "command", stdin=stdin)


MESSAGE = """Here is the plan.

```python
print("from python")
```

Then:

```bash
echo "from bash"
```
"""


def test_markdown_message(tmp_path: Path) -> None:
    message = tmp_path / "message.md"
    message.write_text(MESSAGE)
    proc = run(str(message))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("── block 1 of 2 · python ──\nfrom python\n── exit 0 (ok)")
    assert "from bash\n" in proc.stdout


def test_message_from_stdin() -> None:
    proc = run("-", stdin=MESSAGE)
    assert proc.returncode == 0, proc.stderr
    assert "from python" in proc.stdout and "from bash" in proc.stdout


def test_message_without_code() -> None:
    proc = run("-", stdin="No code here, sorry.")
    assert proc.returncode == 0
    assert "No code blocks found" in proc.stdout


def test_python_file_and_exit_status(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("print('about to fail')\nraise SystemExit(7)\n")
    proc = run(str(script))
    assert proc.returncode == 7
    assert proc.stdout.startswith("── block 1 of 1 · python ──\nabout to fail\n── exit 7 (failed)")


def test_python_error_exits_1(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("1 / 0\n")
    proc = run(str(script))
    assert proc.returncode == 1
    assert "ZeroDivisionError" in proc.stdout


def test_shell_file(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text('echo "shell says $((6 * 7))"\nexit 3\n')
    proc = run(str(script))
    assert proc.returncode == 3
    assert "shell says 42" in proc.stdout


def test_work_dir_keeps_files(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = run("-", "--work-dir", str(work), stdin="```py\nopen('out.txt', 'w').write('hi')\n```")
    assert proc.returncode == 0, proc.stderr
    assert (work / "out.txt").read_text() == "hi"
    assert "saved: out.txt" in proc.stdout


def test_default_work_dir_keeps_files_the_result_names() -> None:
    proc = run("--json", "-", stdin="```py\nopen('out.txt', 'w').write('kept')\n```")
    assert proc.returncode == 0, proc.stderr
    [name] = json.loads(proc.stdout)["files"]
    path = Path(name)
    try:
        assert path.read_text() == "kept"
    finally:
        shutil.rmtree(path.parent)


def test_timeout() -> None:
    started = time.monotonic()
    proc = run("--timeout", "1", "-", stdin="```python\nwhile True:\n    pass\n```")
    assert time.monotonic() - started < 15
    assert proc.returncode == 124
    assert "── exit 124 (timed out)" in proc.stdout
    assert "longer than 1 s" in proc.stdout
    assert "Timeout" in proc.stdout


def test_json_output(tmp_path: Path) -> None:
    proc = run("--json", "--work-dir", str(tmp_path), "-", stdin="```py\nprint('j')\n```")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["exit_code"] == 0
    assert data["output"] == "j\n"
    assert data["code_file"].startswith(str(tmp_path))
    assert data["files"] == [] and data["timed_out"] is False


def test_json_exit_status_mirrors_result(tmp_path: Path) -> None:
    proc = run("--json", "--work-dir", str(tmp_path), "-", stdin="```sh\nexit 5\n```")
    assert proc.returncode == 5
    assert json.loads(proc.stdout)["exit_code"] == 5


def test_version() -> None:
    proc = kx("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"kernelexec {kernelexec.__version__}"


def test_unknown_executor_lists_valid_names() -> None:
    proc = kx("run", "-", "--executor", "nope", stdin="```py\nprint(1)\n```")
    assert proc.returncode != 0
    assert "unknown executor 'nope'" in proc.stderr
    assert "command" in proc.stderr.split("valid:", 1)[1]


def test_missing_file() -> None:
    proc = run("/no/such/message.md")
    assert proc.returncode == 2
    assert "no such file" in proc.stderr


@pytest.mark.parametrize("args", [[], ["run"]])
def test_usage_errors(args: list[str]) -> None:
    proc = kx(*args)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr


def test_upload_files_before_the_blocks(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n3,4\n")
    message = tmp_path / "message.md"
    message.write_text("```python\nprint(sum(1 for _ in open('data.csv')))\n```\n")
    work = tmp_path / "work"
    proc = run("--upload", str(data), str(message), "--work-dir", str(work))
    assert proc.returncode == 0, proc.stderr
    assert "\n3\n" in proc.stdout
    assert (work / "data.csv").read_text() == data.read_text()


def test_upload_of_a_missing_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    message = tmp_path / "message.md"
    message.write_text("```python\nopen('ran', 'w')\n```\n")
    work = tmp_path / "work"
    proc = run("--upload", str(tmp_path / "nope.csv"), str(message), "--work-dir", str(work))
    assert proc.returncode == 2
    assert "no such file to upload" in proc.stderr and "nope.csv" in proc.stderr
    assert not (work / "ran").exists()


def test_sandbox_flag_runs_the_block_without_network_or_host_writes(tmp_path: Path) -> None:
    from kernelexec import BackendUnavailable
    from kernelexec.backends._sandbox import check_sandbox

    try:
        check_sandbox()
    except BackendUnavailable as exc:  # CI installs bubblewrap and requires it
        if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
            raise
        pytest.skip(str(exc))
    message = tmp_path / "message.md"
    message.write_text(
        "```python\nimport socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), 2)\n"
        "except OSError as e:\n    print('offline:', e.strerror)\n"
        "try:\n    open('/etc/kx-cli', 'w')\n"
        "except OSError as e:\n    print('ro:', e.strerror)\n```\n"
    )
    proc = run(str(message), "--sandbox")
    assert proc.returncode == 0, proc.stderr
    assert "offline: Network is unreachable" in proc.stdout
    assert "ro: Read-only file system" in proc.stdout


def test_sandbox_flag_with_a_docker_executor_is_refused() -> None:
    proc = kx("run", "-", "--executor", "docker-kernel", "--sandbox", stdin="```python\n1\n```\n")
    assert proc.returncode == 2
    assert "--sandbox applies to the local back ends" in proc.stderr


def test_runtime_flag_with_a_local_executor_is_refused() -> None:
    proc = kx("run", "-", "--executor", "kernel", "--runtime", "runsc", stdin="```python\n1\n```\n")
    assert proc.returncode == 2
    assert "--runtime applies to the Docker back ends" in proc.stderr


def test_gc_without_a_docker_engine_sweeps_locally_and_succeeds(tmp_path: Path) -> None:
    """On a machine without Docker, ``kernelexec gc`` does the local part (cgroups), says that
    no container was checked and why, and exits 0: there is nothing left running to remove."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    gc = subprocess.run(
        [sys.executable, "-m", "kernelexec", "gc", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert gc.returncode == 0, gc.stderr
    assert "cgroup(s)" in gc.stdout
    assert "no containers checked" in gc.stderr and "no-engine.sock" in gc.stderr


PLOT = "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5]); plt.title('T'); plt.show()\n"


def test_no_charts_says_the_figure_as_its_image_alone(tmp_path: Path) -> None:
    # the flag is the executor's charts=False, whichever executor (the kernels': test_charts.py)
    code = tmp_path / "plot.py"
    code.write_text(PLOT)
    said = {}
    for flags in ([], ["--no-charts"]):
        proc = run(str(code), "--work-dir", str(tmp_path), *flags)
        assert proc.returncode == 0, proc.stderr
        said[bool(flags)] = proc.stdout
    assert '[chart: bar "T": x 2 categories (a, b), y 3-5]' in said[False]  # as shown live
    assert "chart:" not in said[True] and "saved: outputs/cell1-1.png" in said[True]
