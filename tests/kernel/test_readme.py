"""Every Python snippet in the README and the docs runs as written, through kernelexec itself.

What a snippet needs is said on the line before its fence (see ``kx_snippets``): those needing
Docker, gVisor or bubblewrap run here (and must, under ``KERNELEXEC_REQUIRE_*=1``); those needing
a gateway run in the gateway tier (``tests/gateway/test_doc_snippets.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kx_languages import need_kernels
from kx_sandbox import sandbox_unavailable
from kx_snippets import NEEDS, check_promises, snippets

from kernelexec import CommandLineExecutor


def _snippets() -> list[pytest.ParameterSet]:
    out = []
    for snippet in snippets():
        if snippet.note == "needs gateway":
            continue  # the gateway tier runs it
        marks = [pytest.mark.skip(reason=snippet.note)] if snippet.note.startswith("skip") else []
        out.append(pytest.param(snippet.code, snippet.note, id=snippet.id, marks=marks))
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


def test_the_readme_and_docs_have_python_snippets() -> None:
    assert len(_snippets()) >= 15


def test_every_snippet_says_what_it_needs_in_words_this_suite_knows() -> None:
    unknown = [s.id for s in snippets() if s.note not in NEEDS and not s.note.startswith("skip")]
    assert not unknown, f"snippets with a note no tier runs: {unknown}"


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
    if note == "needs sandbox" and (reason := sandbox_unavailable()):
        pytest.skip(reason)
    if note == "needs languages":
        need_kernels("r", "javascript")
    with CommandLineExecutor(work_dir=tmp_path, timeout=300) as ex:
        result = ex.execute(code)
    assert result.exit_code == 0, result.output
    check_promises(code, result.stdout)
