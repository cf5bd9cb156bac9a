"""The README's and the docs' snippets that need a gateway, run as written against each real
gateway server (Kernel Gateway, Enterprise Gateway): the snippet reads the address and token from
``$KERNELEXEC_GATEWAY_URL`` and ``$KERNELEXEC_GATEWAY_TOKEN``, as a reader's program would."""

from __future__ import annotations

from pathlib import Path

import pytest
from gateway_servers import Gateway
from kx_snippets import check_promises, snippets

from kernelexec import CommandLineExecutor

_GATEWAY_SNIPPETS = [pytest.param(s.code, id=s.id) for s in snippets() if s.note == "needs gateway"]


def test_the_docs_have_gateway_snippets() -> None:
    assert len(_GATEWAY_SNIPPETS) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("code", _GATEWAY_SNIPPETS)
def test_gateway_snippet_runs(code: str, gateway: Gateway, tmp_path: Path) -> None:
    env = {"KERNELEXEC_GATEWAY_URL": gateway.url, "KERNELEXEC_GATEWAY_TOKEN": gateway.token}
    with CommandLineExecutor(work_dir=tmp_path, timeout=300, env=env) as ex:
        result = ex.execute(code)
    assert result.exit_code == 0, result.output
    assert "http://gateway:8888" not in result.output  # the example address was not used
    check_promises(code, result.stdout)
