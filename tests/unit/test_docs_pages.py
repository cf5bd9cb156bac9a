"""The README and the docs site say the same thing, and their numbers are their results file's."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _doc_tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "benchmarks/doc_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["doc_tables"] = module  # dataclasses and typing look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 300


def test_the_bench_tables_are_those_of_the_newest_results_file() -> None:
    assert _doc_tables().main(["--check"]) == 0, "run python benchmarks/doc_tables.py"


def test_a_new_results_file_rewrites_the_tables_between_the_markers() -> None:
    tables = _doc_tables()
    results = json.loads(tables.newest_results().read_text(encoding="utf-8"))
    trivial = next(
        r for r in results["rows"] if (r["workload"], r["executor"]) == ("trivial", "kernel")
    )
    trivial["block"]["p50"] = 0.123456
    page = "before\n<!-- bench:executors -->\nold\n<!-- /bench:executors -->\nafter\n"
    new = tables.render(page, results, "x.json")
    assert new.startswith("before\n<!-- bench:executors -->\n| executor |")
    assert "\nold\n" not in new and new.endswith("<!-- /bench:executors -->\nafter\n")
    assert "| `kernel` | stateful |" in new and "| 123 ms |" in new
    assert tables.render(new, results, "x.json") == new  # rendering twice changes nothing


def test_the_docs_home_page_is_the_readme_front_matter() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    home = (ROOT / "docs/index.md").read_text(encoding="utf-8")
    front = readme.split("## Documentation")[0].replace("](docs/", "](").rstrip()
    assert home.startswith(front), "docs/index.md repeats the README up to its Documentation list"


def test_every_page_the_readme_links_exists() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in sorted(set(re.findall(r"\]\((docs/[\w.-]+\.md)", readme))):
        assert (ROOT / name).is_file(), name
