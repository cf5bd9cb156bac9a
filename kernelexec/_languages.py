"""Languages other than Python: which kernelspec runs each, and what to install when it is missing.

A stateful session sends a block tagged ``r``, ``javascript`` or ``typescript`` to a kernel of
that language (IRkernel, Deno's built-in Jupyter kernel), started on first use in the same work
dir. ``languages=`` adds or changes entries (``{"julia": "julia-1.10"}``: any installed
kernelspec) or removes one (``{"r": None}``). Shell blocks stay ``%%bash`` cells of the Python
kernel (each a fresh ``bash``) unless ``languages={"bash": "bash"}`` names a kernel for them:
``bash_kernel``, whose variables and ``cd`` then persist from block to block.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

from ._errors import InvalidBlock
from ._extract import normalize_language

#: canonical language -> the kernelspec that runs it by default
DEFAULT_KERNELS: Mapping[str, str] = {"r": "ir", "javascript": "deno", "typescript": "deno"}

# What to install for a missing kernelspec, by its name (others get the generic hint).
_INSTALL = {
    "ir": (
        "the R kernel (IRkernel): `apt-get install r-cran-irkernel` on Debian/Ubuntu, or in R "
        "`install.packages('IRkernel'); IRkernel::installspec()`"
    ),
    "deno": (
        "Deno's Jupyter kernel: `pip install deno` (or kernelexec[languages]), then "
        "`deno jupyter --install`"
    ),
    "bash": "bash_kernel: `pip install bash_kernel && python -m bash_kernel.install --sys-prefix`",
}

# Languages a session runs itself: the Python kernel, and shell blocks as its %%bash cells.
_OWN = frozenset({"python"})


def language_kernels(languages: Mapping[str, str | None] | None) -> dict[str, str]:
    """The session's table, canonical language -> kernelspec: the defaults with ``languages``
    laid over them (a ``None`` or empty value removes a language). A key for Python is refused:
    Python blocks run in the session's own kernel."""
    table = dict(DEFAULT_KERNELS)
    for tag, kernel in (languages or {}).items():
        language = normalize_language(str(tag))
        if not language or language in _OWN:
            raise InvalidBlock(
                f"languages={{{tag!r}: ...}}: Python blocks run in the session's own kernel;"
                " name other languages only"
            )
        if kernel is not None and not isinstance(kernel, str):
            raise InvalidBlock(f"languages[{tag!r}] must be a kernelspec name, not {kernel!r}")
        if kernel:
            table[language] = kernel
        else:
            table.pop(language, None)
    return table


def install_hint(kernel: str) -> str:
    """What to install so that the kernelspec ``kernel`` exists."""
    return _INSTALL.get(
        kernel,
        f"a Jupyter kernel installed as the kernelspec {kernel!r} (`jupyter kernelspec list`)",
    )


def chdir_code(language: str, path: str) -> str | None:
    """Code that makes a kernel of ``language`` work in ``path`` (None: not known for it)."""
    quoted = json.dumps(path)  # a valid string literal in R and JavaScript alike
    return {
        "r": f"setwd({quoted})",
        "javascript": f"Deno.chdir({quoted})",
        "typescript": f"Deno.chdir({quoted})",
        "shell": f"cd {shlex.quote(path)}",
    }.get(language)


# IRkernel shows every value as text, HTML, Markdown and LaTeX: each saved as a file, and a
# line in the output an LLM reads. A session keeps R's own text and the images (plots).
_R_SETUP = (
    'options(jupyter.display_mimetypes = c("text/plain", "image/png", "image/jpeg",'
    ' "image/svg+xml"))'
)


def setup_code(language: str) -> str | None:
    """Code a kernel of ``language`` runs silently after each start (None: none)."""
    return _R_SETUP if language == "r" else None
