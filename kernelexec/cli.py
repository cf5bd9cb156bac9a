"""The ``kernelexec`` command line.

Each sub-command is a small function taking the parsed arguments and returning the process exit
status. ``run`` mirrors the result's exit code, so a shell script can branch on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._errors import KernelExecError
from ._executor import SyncExecutor
from ._extract import extract_code_blocks, normalize_language
from ._types import CodeBlock, ExecutionResult
from ._version import __version__

#: names accepted by ``--executor``, each with a factory taking the executor keyword options
EXECUTORS: dict[str, Callable[..., SyncExecutor[Any]]] = {}


def _command_executor(**options: Any) -> SyncExecutor[Any]:
    from ._command import CommandLineExecutor

    return CommandLineExecutor(**options)


EXECUTORS["command"] = _command_executor


def make_executor(name: str, **options: Any) -> SyncExecutor[Any]:
    """Build the executor ``--executor NAME`` stands for."""
    try:
        factory = EXECUTORS[name]
    except KeyError:
        valid = ", ".join(sorted(EXECUTORS))
        raise SystemExit(f"kernelexec: unknown executor {name!r} (valid: {valid})") from None
    return factory(**options)


def blocks_from_source(text: str, path: str) -> list[CodeBlock]:
    """A markdown message's fenced blocks, or a whole .py / .sh file as one block."""
    suffix = Path(path).suffix.lower()
    if suffix in {".py", ".sh", ".bash", ".ps1"}:
        language = normalize_language(suffix.lstrip("."))
        return [CodeBlock(code=text, language=language)]
    return extract_code_blocks(text)


def _print_human(result: ExecutionResult) -> None:
    print(result.to_reply())
    if result.files:
        print("Files: " + ", ".join(result.output_files))


def cmd_run(args: argparse.Namespace) -> int:
    if args.file == "-":
        text, name = sys.stdin.read(), "message.md"
    else:
        path = Path(args.file)
        if not path.is_file():
            print(f"kernelexec: no such file: {args.file}", file=sys.stderr)
            return 2
        text, name = path.read_text(encoding="utf-8", errors="replace"), args.file
    blocks = blocks_from_source(text, name)
    options: dict[str, Any] = {"timeout": args.timeout}
    if args.work_dir:
        options["work_dir"] = args.work_dir
    with make_executor(args.executor, **options) as executor:
        result = executor.execute_code_blocks(blocks)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        _print_human(result)
    return min(result.exit_code, 255)


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the fenced code blocks of a markdown message")
    run.add_argument("file", help="a markdown message, a .py or .sh file, or - for stdin")
    _add_executor_options(run)
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.set_defaults(func=cmd_run)


def _add_executor_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", default="command", help="which executor runs the blocks")
    parser.add_argument("--work-dir", help="where code runs and files land (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per block")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelexec", description="Run code written by LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"kernelexec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except KernelExecError as exc:
        print(f"kernelexec: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    raise SystemExit(main())
