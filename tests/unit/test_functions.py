"""The functions module source, stubs and prompt (issue 32.9): what the executors write to
``functions.py`` for ``from functions import add``, read from plain functions and from the
peers' ``FunctionWithRequirements`` objects by attribute."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from kernelexec import InvalidBlock
from kernelexec._functions import (
    PROMPT_TEMPLATE,
    check_module_name,
    describe_functions,
    format_functions_for_prompt,
    install_code,
    loader_code,
    module_source,
)


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
    """
    return a + b


@dataclass
class Requiring:  # the shape of AG2's and autogen-core's FunctionWithRequirements
    func: Any
    python_packages: list[str] = field(default_factory=list)
    global_imports: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class FromModule:
    module: str
    imports: tuple[Any, ...]


@dataclass(frozen=True)
class Alias:
    name: str
    alias: str


def load(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "functions.py", "exec"), namespace)
    return namespace


def test_plain_function_is_written_from_its_def_line() -> None:
    source = module_source(describe_functions([add]))
    assert source.startswith("def add(a: int, b: int) -> int:\n")
    assert load(source)["add"](2, 3) == 5


def test_nested_and_multi_line_decorated_functions_load() -> None:
    # The peers keep inspect's text as it is: a nested function stays indented and a decorator
    # spread over lines is cut after its first line; both make a module that fails to load.
    def decorate(**_: Any) -> Any:
        return lambda f: f

    @decorate(
        python_packages=[],
    )
    def twice(x: int) -> int:
        return 2 * x

    namespace = load(module_source(describe_functions([twice])))
    assert namespace["twice"](4) == 8


def test_requirements_imports_and_string_source() -> None:
    def root(x: float) -> float:
        return math.sqrt(x) + np.float64(0) + dd(int)["k"]  # type: ignore[name-defined] # noqa: F821

    specs = describe_functions(
        [
            Requiring(
                root,
                python_packages=["numpy>=1"],
                global_imports=["math", Alias("numpy", "np"), FromModule("collections", ("x",))],
            ),
            Requiring("def mul(a, b):\n    return a * b\n", global_imports=["math"]),
        ]
    )
    assert [s.name for s in specs] == ["root", "mul"]
    assert specs[0].packages == ("numpy>=1",)
    source = module_source(specs)
    head = source.split("\n\n", 1)[0]
    # Each import once, in order.
    assert head == "import math\nimport numpy as np\nfrom collections import x"
    assert "def mul(a, b):\n    return a * b\n" in source


def test_stub_and_prompt_read_as_the_peers_do() -> None:
    from string import Template

    [spec] = describe_functions([add])
    assert spec.stub.startswith('def add(a: int, b: int) -> int:\n    """Add two numbers.')
    assert spec.stub.endswith('"""\n    ...')
    prompt = format_functions_for_prompt([spec], "tools")
    expected = Template(PROMPT_TEMPLATE).substitute(module_name="tools", functions=spec.stub)
    assert prompt == expected and "`from tools import foo`" in prompt


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda x: x, id="lambda"),
        pytest.param(len, id="builtin"),
        pytest.param(42, id="not-a-function"),
        pytest.param(Requiring("x = 1\n"), id="string-without-def"),
        pytest.param(Requiring("def f(:\n"), id="string-not-python"),
        pytest.param(Requiring("def f(): pass\ndef g(): pass\n"), id="string-two-defs"),
    ],
)
def test_unusable_functions_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidBlock):  # a ValueError
        describe_functions([bad])


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(InvalidBlock, match="twice"):
        describe_functions([add, Requiring("def add(a, b):\n    return 0\n")])


@pytest.mark.parametrize("name", ["", "my-module", "1abc", "class", "a.b", "../x"])
def test_module_names_must_be_identifiers(name: str) -> None:
    with pytest.raises(InvalidBlock, match="identifier"):
        check_module_name(name)


def test_loader_binds_only_the_functions() -> None:
    code = loader_code("functions", ["add", "mul"])
    assert code.splitlines()[-1] == "from functions import add, mul"
    # Nothing but the functions is bound in a kernel's session.
    assert "\nimport " not in code and not code.startswith("import ")
    assert install_code([]) is None
    assert "'numpy', 'pandas'" in (install_code(["pandas", "numpy", "pandas"]) or "")
