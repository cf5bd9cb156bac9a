"""A griffe extension for the API reference: doctest examples in docstrings shown as code.

kernelexec's docstrings carry ``>>>`` examples without a section heading; markdown reads ``>>>``
as three nested quotes. This puts each run of ``>>>`` / ``...`` lines and the output after them
in a ``pycon`` fence, in the docs only (the docstrings stay as they are).
"""

from __future__ import annotations

from typing import Any

import griffe


def _fence(text: str) -> str:
    out: list[str] = []
    in_example = False
    for line in text.splitlines():
        starts = line.lstrip().startswith(">>>")
        if starts and not in_example:
            out.append("```pycon")
            in_example = True
        elif in_example and not line.strip():
            out.append("```")
            in_example = False
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = _fence(obj.docstring.value)
