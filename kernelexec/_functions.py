"""Functions handed to executed code as an importable module (``from functions import add``).

AG2's and autogen-ext's command-line executors take ``functions=[...]``: the functions' source is
written to ``<module>.py`` in the work dir, their packages installed, and the module loaded once
to check it; ``format_functions_for_prompt()`` tells the LLM what it may import. This module turns
the functions into that source, the stubs and the loading code, for every executor
(``AsyncExecutor.add_functions``) and the framework adapters.

A function is a plain function, or an object with ``func`` (a function, or its source as a
string) and, optionally, ``python_packages`` and ``global_imports``: AG2's and autogen-core's
``FunctionWithRequirements`` / ``FunctionWithRequirementsStr`` and their ``with_requirements``
decorator, read by attribute so no framework is imported here.

Unlike the peers (they keep the source as ``inspect`` gives it), the source is cut at the
``def`` line and dedented: a function defined inside another function, or behind a decorator
spread over several lines, makes a module that loads.
"""

from __future__ import annotations

import ast
import inspect
import keyword
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any

from ._errors import InvalidBlock

__all__ = [
    "DEFAULT_MODULE",
    "PROMPT_TEMPLATE",
    "FunctionSpec",
    "check_module_name",
    "describe_functions",
    "format_functions_for_prompt",
    "install_code",
    "loader_code",
    "module_source",
]

DEFAULT_MODULE = "functions"

#: the peers' template (AG2 and autogen-ext word it alike), so a prompt reads the same after the
#: import line is swapped; ``$module_name`` and ``$functions`` are filled in
PROMPT_TEMPLATE = """You have access to the following user defined functions. They can be \
accessed from the module called `$module_name` by their function names.

For example, if there was a function called `foo` you could import it by writing \
`from $module_name import foo`

$functions"""


@dataclass(frozen=True, kw_only=True)
class FunctionSpec:
    """One function as the module holds it."""

    name: str
    source: str  # from the ``def`` line, dedented
    stub: str  # signature and docstring, the body ``...``
    imports: tuple[str, ...]  # import lines the source needs (``global_imports``)
    packages: tuple[str, ...]  # pip requirements (``python_packages``)


def check_module_name(module: str) -> str:
    """``module`` if it can be imported by name (it becomes ``<module>.py`` in the work dir)."""
    if not module.isidentifier() or keyword.iskeyword(module):
        raise InvalidBlock(f"Module name must be a valid Python identifier: {module!r}")
    return module


def describe_functions(functions: Sequence[Any]) -> list[FunctionSpec]:
    """The functions as the module will hold them; an unusable one raises ``InvalidBlock``."""
    specs = [_describe(func) for func in functions]
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise InvalidBlock(f"functions= names a function twice: {names}")
    return specs


def module_source(specs: Sequence[FunctionSpec]) -> str:
    """The module's text: every import the functions need (once each), then the functions."""
    imports = dict.fromkeys(line for spec in specs for line in spec.imports)
    parts = ["\n".join(imports), *(spec.source for spec in specs)]
    return "\n\n".join(parts).lstrip("\n")


def format_functions_for_prompt(
    specs: Sequence[FunctionSpec],
    module: str = DEFAULT_MODULE,
    prompt_template: str = PROMPT_TEMPLATE,
) -> str:
    """The functions as stubs for an LLM's prompt (``$module_name``, ``$functions``)."""
    return Template(prompt_template).substitute(
        module_name=module, functions="\n\n".join(spec.stub for spec in specs)
    )


def loader_code(module: str, names: Sequence[str]) -> str:
    """Python that (re)loads ``module`` and binds ``names``: in a kernel the functions are then
    defined in the session too; in a process it checks the module loads. Nothing else is bound
    (the helpers are reached through ``__import__``), and a module loaded before is read afresh."""
    lines = [
        '__import__("importlib").invalidate_caches()',
        f'__import__("sys").modules.pop({module!r}, None)',
    ]
    lines.append(f"from {module} import {', '.join(names)}" if names else f"import {module}")
    return "\n".join(lines) + "\n"


def install_code(packages: Sequence[str]) -> str | None:
    """Python that pip-installs ``packages`` into the interpreter the code runs in (None: none
    asked for); a failure ends it with an error, so the result's exit code says so."""
    wanted = sorted(set(packages))
    if not wanted:
        return None
    argv = ["-m", "pip", "install", "-qqq", *wanted]
    return f'__import__("subprocess").run([__import__("sys").executable, *{argv!r}], check=True)\n'


def _describe(func: Any) -> FunctionSpec:
    inner = getattr(func, "func", func)
    imports = tuple(_import_line(item) for item in getattr(func, "global_imports", ()) or ())
    packages = tuple(str(p) for p in getattr(func, "python_packages", ()) or ())
    if isinstance(inner, str):
        text = textwrap.dedent(inner)
        node = _only_function(text, what="the source given")
    elif inspect.isfunction(inner):
        text = _source_of(inner)
        node = _only_function(text, what=repr(inner))
        if node.name != inner.__name__:  # a lambda, or a function renamed after its def
            raise InvalidBlock(f"functions=: {inner!r} is not defined by a def of its own name")
    else:
        raise InvalidBlock(f"functions= takes functions (or their source), not {func!r}")
    return FunctionSpec(
        name=node.name,
        source=_from_def(text, node),
        stub=_stub(node),
        imports=imports,
        packages=packages,
    )


def _source_of(func: Callable[..., Any]) -> str:
    try:
        return textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise InvalidBlock(f"functions=: the source of {func!r} cannot be read: {exc}") from exc


def _only_function(text: str, *, what: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise InvalidBlock(f"functions=: {what} is not valid Python: {exc}") from exc
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if len(defs) != 1:
        raise InvalidBlock(f"functions=: {what} must hold exactly one function")
    return defs[0]


def _from_def(text: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The text from the ``def`` line on: decorators (``@with_requirements(...)``) dropped,
    whatever lines they span."""
    lines = text.splitlines()
    end = node.end_lineno or len(lines)
    return "\n".join(lines[node.lineno - 1 : end]).rstrip() + "\n"


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The signature as the source writes it (the peers print ``inspect.signature``, which
    quotes every annotation under ``from __future__ import annotations``), then the peers'
    layout: the docstring dedented, quoted and indented, the body ``...``. Read from the
    text, so nothing the caller gave is run on the host."""
    returns = "" if node.returns is None else f" -> {ast.unparse(node.returns)}"
    stub = f"def {node.name}({ast.unparse(node.args)}){returns}:\n"
    doc = ast.get_docstring(node, clean=False)
    if doc:
        stub += textwrap.indent('"""' + textwrap.dedent(doc) + '"""', "    ") + "\n"
    return stub + "    ..."


def _import_line(item: Any) -> str:
    """An import line from a name (``"numpy"``), an alias (``name``, ``alias``) or a from-import
    (``module``, ``imports``), as the peers' ``Import`` types hold them."""
    if isinstance(item, str):
        return f"import {item}"
    if hasattr(item, "module") and hasattr(item, "imports"):
        names = ", ".join(_alias(name) for name in item.imports)
        return f"from {item.module} import {names}"
    if hasattr(item, "alias"):
        return f"import {_alias(item)}"
    raise InvalidBlock(f"functions=: not an import: {item!r}")


def _alias(item: Any) -> str:
    return item if isinstance(item, str) else f"{item.name} as {item.alias}"
