"""A guard-rail against shell commands that wreck the machine they run on (not a sandbox).

The patterns are AG2's (``LocalCommandLineCodeExecutor.sanitize_command``): ``rm -rf``, ``mv``
to ``/dev/null``, ``dd``, writes to a raw disk (``/dev/sdX``) and the classic fork bomb. They
catch an LLM's careless command, nothing more: ``rm -r -f``, ``python -c "shutil.rmtree(...)"``
or a base64-decoded script all get through. The isolation is the executor's (a container, a
bubblewrap sandbox); this check only spares a local executor's host an obvious mistake.
"""

from __future__ import annotations

import re

# (pattern, AG2's message), in AG2's order: the first match names the refusal.
DANGEROUS_COMMANDS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), message)
    for pattern, message in (
        (r"\brm\s+-rf\b", "Use of 'rm -rf' command is not allowed."),
        (r"\bmv\b.*?\s+/dev/null", "Moving files to /dev/null is not allowed."),
        (r"\bdd\b", "Use of 'dd' command is not allowed."),
        (r">\s*/dev/sd[a-z][1-9]?", "Overwriting disk blocks directly is not allowed."),
        (r":\(\)\{\s*:\|\:&\s*\};:", "Fork bombs are not allowed."),
    )
)

#: the prefix of every refusal's text, as AG2 words it
REFUSAL = "Potentially dangerous command detected: "

# IPython cell magics whose body is a shell script.
_SHELL_CELL = re.compile(r"^\s*%%(?:bash|sh|script\s+(?:ba)?sh)\b")


def dangerous_command(code: str) -> str | None:
    """Why the shell script ``code`` is refused (AG2's message), or None."""
    for pattern, message in DANGEROUS_COMMANDS:
        if pattern.search(code):
            return message
    return None


def shell_part(code: str, language: str) -> str:
    """The shell commands a block runs: all of a shell block; in Python (an IPython kernel)
    its ``!command`` lines, and the body of a ``%%bash`` / ``%%sh`` cell."""
    if language == "shell":
        return code
    if language != "python":
        return ""
    lines = code.split("\n")
    if lines and _SHELL_CELL.match(lines[0]):
        return "\n".join(lines[1:])
    return "\n".join(ln.lstrip()[1:] for ln in lines if ln.lstrip().startswith("!"))
