"""Builders the integration tests share: a tiny wheel, a throwaway venv, the scripted flows."""

from __future__ import annotations

import base64
import hashlib
import site
import subprocess
import sys
import zipfile
from pathlib import Path

DEMO_PACKAGE = "kxdemo_pkg"
DEMO_WHEEL = f"{DEMO_PACKAGE}-0.1-py3-none-any.whl"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_demo_wheel(folder: Path) -> Path:
    """A pure-Python wheel written by hand (no network, no build back end)."""
    dist = f"{DEMO_PACKAGE}-0.1.dist-info"
    files = {
        f"{DEMO_PACKAGE}/__init__.py": b"def answer():\n    return 'kxdemo says 42'\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {DEMO_PACKAGE}\nVersion: 0.1\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kernelexec-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / DEMO_WHEEL
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def make_venv(folder: Path) -> Path:
    """A throwaway venv that sees this environment's packages (ipykernel, pip) but installs
    into itself, so the tests never change the main environment.

    Not ``--system-site-packages``: when the tests run in a venv, that flag shows the *base*
    interpreter's packages, not this venv's. A ``.pth`` file adds this environment's site dirs
    (processed as site dirs, so editable installs in them work too).
    """
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60
    )
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    line = "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in parents)
    (Path(purelib) / "_kernelexec_tests_parent.pth").write_text(line + "\n", encoding="utf-8")
    return python


FIB = """Let me compute it.
```python
def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
print(fib(14))
```"""

PLOT = """```python
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.savefig("squares.png")
print("saved squares.png")
```"""

IMPORT_DEMO = f"""```python
import {DEMO_PACKAGE}
print({DEMO_PACKAGE}.answer())
```"""


def install_demo(wheel: Path) -> str:
    # `python` is the venv's: the tests put its bin folder first on PATH.
    return f"```sh\npython -m pip install --no-index --no-deps --quiet {wheel}\n```"


SET_STATE = "```python\nsecret = 41\n```"
USE_STATE = "```python\nprint(secret + 1)\n```"
DONE = "All done. TERMINATE"
