"""``add_functions()`` on every kind of executor (issue 32.9): the functions are importable by
the code (``from functions import add``), from a named file in a sub-folder too, and in a
kernel they are also defined in the session; their packages' install runs in the code's own
interpreter. Local, sandboxed and Docker back ends, stateful and stateless."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kernelexec import InvalidBlock, make_executor

STATELESS = ["command", "sandboxed-command", "docker-command"]
STATEFUL = ["kernel", "fork-kernel", "sandboxed-kernel", "docker-kernel"]


def add(a: int, b: int) -> int:
    return a + b


class WithImports:  # the shape of the peers' FunctionWithRequirements
    func = "def root(x):\n    return math.sqrt(x)\n"
    global_imports = ("math",)
    python_packages = ()


@pytest.fixture
def ready(request: pytest.FixtureRequest, name: str) -> None:
    if name.startswith("docker"):
        request.getfixturevalue("docker_ready")
    elif name.startswith("sandboxed"):
        from kernelexec import BackendUnavailable
        from kernelexec.backends._sandbox import check_sandbox

        try:
            check_sandbox()
        except BackendUnavailable as exc:
            if os.environ.get("KERNELEXEC_REQUIRE_SANDBOX") == "1":
                raise
            pytest.skip(str(exc))


def run(executor: Any, code: str) -> tuple[int, str]:
    result = executor.execute(code)
    # The whole text on a failure (a tuple's diff shows only the first difference).
    assert result.exit_code == 0, f"{code!r} failed: {result.output}"
    return result.exit_code, result.output


@pytest.mark.usefixtures("ready")
@pytest.mark.parametrize("name", STATELESS + STATEFUL)
def test_functions_are_importable(name: str, tmp_path: Path) -> None:
    with make_executor(name, work_dir=tmp_path, timeout=60) as executor:
        loaded = executor.add_functions([add, WithImports()], module="tools")
        assert loaded.exit_code == 0, loaded.output
        assert run(executor, "from tools import add, root\nprint(add(2, 3), root(16))") == (
            0,
            "5 4.0\n",
        )
        # A named file in a sub-folder runs from there: the work dir is still on the path.
        named = "# filename: sub/use.py\nfrom tools import add\nprint(add(1, 1))"
        assert run(executor, named) == (0, "2\n")
        if name in STATEFUL:  # defined in the session too
            assert run(executor, "print(add(3, 3), root(9))") == (0, "6 3.0\n")
    assert (tmp_path / "tools.py").is_file()


def test_a_second_call_replaces_the_module_in_a_kernel(tmp_path: Path) -> None:
    def add(a: int, b: int) -> int:  # another add, of the same name
        return a - b

    with make_executor("kernel", work_dir=tmp_path) as executor:
        executor.add_functions([globals()["add"]])
        assert run(executor, "print(add(5, 3))") == (0, "8\n")
        executor.add_functions([add])
        assert run(
            executor, "from functions import add as again\nprint(add(5, 3), again(5, 3))"
        ) == (
            0,
            "2 2\n",
        )


def test_a_module_that_fails_to_load_is_a_failed_result(tmp_path: Path) -> None:
    class Broken:
        func = "def f():\n    return 1\n"
        global_imports = ("no_such_module_kx",)

    with make_executor("command", work_dir=tmp_path) as executor:
        result = executor.add_functions([Broken()])
        assert result.exit_code != 0 and "no_such_module_kx" in result.output
        with pytest.raises(InvalidBlock):
            executor.add_functions([add], module="not a name")
