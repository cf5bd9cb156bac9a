"""Every Python snippet in the README runs as written, through kernelexec itself.

A snippet preceded by ``<!-- readme-test: needs docker -->`` runs where a Docker engine answers
(and must, under ``KERNELEXEC_REQUIRE_DOCKER=1``), ``needs gvisor`` where that engine also has the
``runsc`` runtime (and must, under ``KERNELEXEC_REQUIRE_GVISOR=1``);
``<!-- readme-test: skip (why) -->`` marks an
illustration that cannot run anywhere (an example address). A ``print(...)  # 6`` comment is the
output the snippet promises: its first word must appear in what the snippet printed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kernelexec import CommandLineExecutor

README = Path(__file__).resolve().parents[2] / "README.md"
_FENCE = re.compile(
    r"(?:<!-- readme-test: (?P<note>[^>]*?) -->\n)?```python\n(?P<code>.*?)\n```", re.S
)
_PROMISE = re.compile(r"^\s*print\(.*\)\s+#\s+(?P<first>\S+)", re.M)


def _snippets() -> list[pytest.ParameterSet]:
    text = README.read_text(encoding="utf-8")
    out = []
    for match in _FENCE.finditer(text):
        line = text[: match.start("code")].count("\n") + 1
        note = match["note"] or ""
        marks = [pytest.mark.skip(reason=note)] if note.startswith("skip") else []
        out.append(pytest.param(match["code"], note, id=f"README-line-{line}", marks=marks))
    return out


def _docker_answers() -> bool:
    from kernelexec.backends._docker import make_client
    from kernelexec.backends._docker_options import DockerOptions

    try:
        make_client(DockerOptions()).close()
    except Exception:
        return False
    return True


def _gvisor_answers() -> bool:
    from kernelexec.backends._docker import make_client
    from kernelexec.backends._docker_options import DockerOptions

    try:
        client = make_client(DockerOptions())
    except Exception:
        return False
    try:
        return "runsc" in (client.info().get("Runtimes") or {})
    finally:
        client.close()


def test_the_readme_has_python_snippets() -> None:
    assert len(_snippets()) >= 5


@pytest.mark.slow
@pytest.mark.parametrize(("code", "note"), _snippets())
def test_readme_snippet_runs(code: str, note: str, tmp_path: Path) -> None:
    if note == "needs docker" and not _docker_answers():
        if os.environ.get("KERNELEXEC_REQUIRE_DOCKER") == "1":
            pytest.fail("this README snippet needs Docker and no engine answers")
        pytest.skip("needs a Docker engine")
    if note == "needs gvisor" and not _gvisor_answers():
        if os.environ.get("KERNELEXEC_REQUIRE_GVISOR") == "1":
            pytest.fail("this README snippet needs gVisor (runsc) and the engine has none")
        pytest.skip("needs the runsc runtime (gVisor) registered with a Docker engine")
    with CommandLineExecutor(work_dir=tmp_path, timeout=300) as ex:
        result = ex.execute(code)
    assert result.exit_code == 0, result.output
    for promise in _PROMISE.finditer(code):
        expected = promise["first"]
        if expected[0].isdigit():  # a value, not a remark; `np.int64(6)` is not `6`
            shown = rf"(?<![\w.(]){re.escape(expected)}(?![\w)])"
            assert re.search(shown, result.stdout), (expected, result.stdout)
