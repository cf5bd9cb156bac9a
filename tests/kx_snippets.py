"""The Python snippets of the README and of every docs page, each with what it needs to run.

A snippet runs as written, through kernelexec itself. An HTML comment on the line before its
fence says what it needs: ``<!-- readme-test: needs docker -->`` (a Docker engine),
``needs gvisor`` (that engine with the ``runsc`` runtime), ``needs sandbox`` (bubblewrap),
``needs languages`` (the R and Deno kernels), ``needs gateway`` (a Jupyter gateway: the gateway
tier runs it with ``$KERNELEXEC_GATEWAY_URL`` and ``$KERNELEXEC_GATEWAY_TOKEN`` set), or
``skip (why)`` for an illustration that cannot run anywhere (an example address, a cluster of
your own). A ``print(...)  # 6`` comment is the output
the snippet promises: its first word, when a value, must appear in what the snippet printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
NEEDS = ("", "needs docker", "needs gvisor", "needs sandbox", "needs gateway", "needs languages")

_FENCE = re.compile(
    r"(?:<!-- readme-test: (?P<note>[^>]*?) -->\n)?^```python\n(?P<code>.*?)\n```", re.S | re.M
)
_PROMISE = re.compile(r"^\s*print\(.*\)\s+#\s+(?P<first>\S+)", re.M)


@dataclass(frozen=True, kw_only=True)
class Snippet:
    page: str
    line: int
    note: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}-line-{self.line}"


def snippets() -> list[Snippet]:
    """Each distinct snippet once (the docs' home page repeats the README's), first place first."""
    found: list[Snippet] = []
    seen: set[str] = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match["code"] in seen:
                continue
            seen.add(match["code"])
            line = text[: match.start("code")].count("\n") + 1
            name = page.relative_to(ROOT).as_posix()
            found.append(
                Snippet(page=name, line=line, note=match["note"] or "", code=match["code"])
            )
    return found


def check_promises(code: str, stdout: str) -> None:
    """Each ``print(...)  # 6`` promise: the value it names is in what the snippet printed."""
    for promise in _PROMISE.finditer(code):
        expected = promise["first"]
        if expected[0].isdigit():  # a value, not a remark; `np.int64(6)` is not `6`
            shown = rf"(?<![\w.(]){re.escape(expected)}(?![\w)])"
            assert re.search(shown, stdout), (expected, stdout)
