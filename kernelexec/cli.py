"""The ``kernelexec`` command line.

Each sub-command is a small function taking the parsed arguments and returning the process exit
status. ``run`` mirrors the result's exit code, so a shell script can branch on it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from ._errors import KernelExecError, UnknownExecutor
from ._extract import extract_code_blocks, normalize_language
from ._mcp.cli import add_mcp_command
from ._registry import DEFAULT_EXECUTOR, EXECUTOR_NAMES, executor_entry, make_executor
from ._types import CodeBlock, ExecutionResult
from ._version import __version__
from .backends._docker_options import DEFAULT_IMAGE, LANGUAGES_IMAGE, LAUNCHERS_IMAGE

if TYPE_CHECKING:
    from ._executor import SyncExecutor
    from .agent import ChatTurn

# Start-up time: a sub-command's heavy modules (jupyter_client, the Docker SDK, nbformat, the
# agent loop, the bench) are imported inside the function that runs it, so `kernelexec --help`
# and argument errors stay fast.


class UsageError(Exception):
    """A command line that cannot work as given: ``main`` prints its one line and exits 2."""


def _remote(args: argparse.Namespace) -> dict[str, Any]:
    """``--remote URL``: the blocks run on a kernel of that gateway (the ``gateway`` executor)."""
    if not getattr(args, "remote", None):
        if args.executor == "gateway":
            raise UsageError("--executor gateway needs --remote URL (the gateway's address)")
        return {}
    if args.executor not in {DEFAULT_EXECUTOR, "gateway"}:
        raise UsageError("--remote runs a gateway kernel; drop --executor")
    args.executor = "gateway"
    return {"url": args.remote, "token": args.token, "user": args.remote_user}


def _executor_from(args: argparse.Namespace, **options: Any) -> SyncExecutor[Any]:
    """The executor ``--executor`` (and ``--remote``) name, with the common options."""
    name, flags = executor_flags(args)
    return make_executor(name, **{**flags, **options})


def executor_flags(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The executor name and options the flags ask for; a ``UsageError`` naming the flag to
    use when they cannot work together. Nothing is made here: commands check before they
    create a work dir."""
    options: dict[str, Any] = {"timeout": args.timeout}
    if not getattr(args, "charts", True):
        options["charts"] = False
    if getattr(args, "work_dir", None):
        options.setdefault("work_dir", args.work_dir)
    options.update(_remote(args))
    if getattr(args, "kernelspec", None):
        if args.executor not in {DEFAULT_EXECUTOR, "provisioned-kernel"} or options.get("url"):
            raise UsageError("--kernelspec runs a provisioned kernel; drop --executor")
        args.executor = "provisioned-kernel"
        options.update(kernel_name=args.kernelspec, user=args.remote_user)
    elif args.executor == "provisioned-kernel":
        raise UsageError(
            "--executor provisioned-kernel needs --kernelspec NAME (an installed kernelspec "
            "with a provisioner: `kernelexec cluster spec` installs one)"
        )
    name = _sandboxed(args)
    if name == "warm-command" and getattr(args, "sandbox", False):
        options["sandbox"] = True  # the warm spawner, and so every block, in the sandbox
    runtime = getattr(args, "runtime", None)
    if runtime is not None:
        if not name.startswith("docker-"):
            raise UnknownExecutor(
                f"--runtime applies to the Docker back ends (docker-kernel, docker-command), "
                f"not {name!r}"
            )
        options["runtime"] = runtime
    options.update(_network(args, name))
    executor_entry(name)  # an unknown name is refused here, before anything is made
    return name, options


def _network(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """``--allow HOST[:PORT]`` (repeatable): the isolating back ends' egress allowlist."""
    allow = getattr(args, "allow", None) or []
    packages = [
        p.strip() for item in getattr(args, "packages", None) or [] for p in item.split(",")
    ]
    specs = getattr(args, "secret", None) or []
    if not allow and not packages and not specs:
        return {}
    # a bad entry: InvalidNetworkPolicy (or InvalidSecret), said plainly
    from ._network import NetworkPolicy, secrets_from_environment

    secrets = secrets_from_environment(specs)
    policy = NetworkPolicy(allow=allow, packages=[p for p in packages if p], secrets=secrets)
    if name.startswith("docker-"):
        return {"network": policy}
    if name in _SANDBOXED.values():
        from .backends._sandbox import SandboxOptions

        return {"sandbox": SandboxOptions(network=policy)}
    raise UsageError(
        "--allow and --packages apply to the isolating back ends (docker-kernel, "
        f"docker-command, or a local one with --sandbox), not {name!r}: a local back end's "
        "code has the host's network"
    )


_SANDBOXED = {"kernel": "sandboxed-kernel", "command": "sandboxed-command"}


def _sandboxed(args: argparse.Namespace) -> str:
    """``--sandbox`` turns the local back ends into their bubblewrap-sandboxed twins."""
    name = str(args.executor)
    if not getattr(args, "sandbox", False) or name in {*_SANDBOXED.values(), "warm-command"}:
        return name
    if name not in _SANDBOXED:
        raise UnknownExecutor(
            f"--sandbox applies to the local back ends (kernel, command, warm-command), "
            f"not {name!r}; "
            "the docker-* executors are already isolated"
        )
    return _SANDBOXED[name]


def blocks_from_source(text: str, path: str) -> list[CodeBlock]:
    """A markdown message's fenced blocks, or a whole .py / .sh file as one block."""
    suffix = Path(path).suffix.lower()
    if suffix in {".py", ".sh", ".bash", ".ps1"}:
        language = normalize_language(suffix.lstrip("."))
        return [CodeBlock(code=text, language=language)]
    return extract_code_blocks(text)


def cmd_run(args: argparse.Namespace) -> int:
    if args.file == "-":
        text, name = sys.stdin.read(), "message.md"
    else:
        path = Path(args.file)
        if not path.is_file():
            print(f"kernelexec: no such file: {args.file}", file=sys.stderr)
            return 2
        text, name = path.read_text(encoding="utf-8", errors="replace"), args.file
    missing = [u for u in args.upload if not Path(u).is_file()]
    if missing:
        print(f"kernelexec: no such file to upload: {missing[0]}", file=sys.stderr)
        return 2
    blocks = blocks_from_source(text, name)
    executor_flags(args)  # a usage error before any folder is made
    out = _Stdout(sys.stdout)
    results: list[ExecutionResult] = []
    with _WorkDir(args.work_dir, "run", uploads=args.upload) as work:
        try:
            _run_blocks(args, blocks, work.path, out, results)
        finally:
            work.made_files = any(r.files or r.full_output_file for r in results)
    if args.notebook and Path(args.notebook).is_file():  # written once a block was recorded
        _say(f"transcript saved to {Path(args.notebook).absolute()}")
    if out.closed:
        raise _OutputClosed(len(results), len(blocks))
    return _report_run(args, blocks, results, work, out)


def _report_run(
    args: argparse.Namespace,
    blocks: list[CodeBlock],
    results: list[ExecutionResult],
    work: _WorkDir,
    out: _Stdout,
) -> int:
    from ._executor import combine_results

    result = combine_results(results)
    if args.json:
        document = result.to_dict()
        document["work_dir"] = str(work.path) if work.kept else None
        document["blocks"] = block_entries(blocks, results)
        out.write(json.dumps(document, indent=2, default=str) + "\n")
    elif not blocks:
        out.write(result.output + "\n")
    out.flush()
    if out.closed:
        raise _OutputClosed(len(results), len(blocks))
    return min(result.exit_code, 255)


def block_entries(
    blocks: Sequence[CodeBlock], results: Sequence[ExecutionResult]
) -> list[dict[str, Any]]:
    """``--json``'s ``blocks``: one entry per block of the message, run or not, with its
    ``status`` (``ok``, ``failed``, ``timed_out``, ``not_run``) and, when not ok, the ``reason``."""
    entries = []
    for number, block in enumerate(blocks, 1):
        if number <= len(results):
            result = results[number - 1]
            entry = {"index": number, **result.to_dict(), "code": block.code}
            entry["status"], entry["reason"] = _status(result)
        else:
            last = results[-1] if results else None
            why = "timed out" if last is not None and last.timed_out else "failed"
            # the same keys as a block that ran (a reader need not tell them apart first)
            entry = {
                "index": number,
                **ExecutionResult(exit_code=0, language=block.language).to_dict(),
                "exit_code": None,  # it never ran: no status of its own
                "code": block.code,
                "not_run": True,
                "status": "not_run",
                "reason": f"block {len(results)} {why}" if results else "not started",
            }
        entries.append(entry)
    return entries


def _status(result: ExecutionResult) -> tuple[str, str | None]:
    evalue = result.error.evalue if result.error is not None else None
    if result.not_run:
        return "not_run", evalue or "refused before it ran"
    if result.timed_out:
        return "timed_out", str(result.error) if result.error is not None else "timed out"
    if not result.ok:
        error = result.error
        what = f"{error.ename}: {error.evalue}" if error is not None else "failed"
        return "failed", f"{what} (exit code {result.exit_code})"
    return "ok", None


def _run_blocks(
    args: argparse.Namespace,
    blocks: list[CodeBlock],
    work: Path,
    out: _Stdout,
    results: list[ExecutionResult],
) -> None:
    """Run the blocks in order into ``results``, stopping at the first failure (or when
    stdout is closed: nobody reads on); the human view streams output as it happens and
    frames each block; ``--json`` prints one document at the end."""
    from ._view import LiveView, block_footer, block_header, not_run_line

    # _Stdout has the part of TextIO the view uses (write, flush)
    live = None if args.json else LiveView(cast(TextIO, out), colour=out.isatty())
    options: dict[str, Any] = {"work_dir": work, "on_output": live}
    if args.notebook:
        options["notebook_path"] = Path(args.notebook).absolute()
    with _executor_from(args, **options) as executor:
        for upload in args.upload:
            executor.upload(upload)
        for number, block in enumerate(blocks, 1):
            if live is not None:
                out.write(block_header(number, len(blocks), block.language) + "\n")
                out.flush()
            result = executor.execute_block(block)
            results.append(result)
            if live is not None:
                live.finish()
                out.write(block_footer(result, work) + "\n")
                out.flush()
            if not result.ok or out.closed:
                break
    if live is not None and not out.closed:
        for number in range(len(results) + 1, len(blocks) + 1):
            out.write(not_run_line(number, len(blocks), len(results), results[-1]) + "\n")


def _say(text: str) -> None:
    """A note about the run itself (not its output): stderr, so stdout stays the blocks'."""
    print(f"kernelexec: {text}", file=sys.stderr, flush=True)


class _WorkDir:
    """The work dir of ``run`` and ``repl``: ``--work-dir``, or a new temp folder that is named
    when it is made and, at the end, kept (and named again) when anything was made there,
    else removed: a plot or a file the code wrote is never deleted behind the user's back."""

    def __init__(self, given: str | None, kind: str, *, uploads: Sequence[str] = ()) -> None:
        self.temporary = not given
        made = given or tempfile.mkdtemp(prefix=f"kernelexec-{kind}-")
        self.path = Path(made).absolute()
        self._uploads = {Path(u).name for u in uploads}
        self.made_files = False  # set by the caller from the results (a changed upload)
        self.kept = not self.temporary

    def __enter__(self) -> _WorkDir:
        if self.temporary:
            _say(f"work dir {self.path} (a new folder: kept if anything is made there)")
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.temporary:
            return
        if self.made_files or _anything_made(self.path, ignore=self._uploads):
            self.kept = True
            _say(f"files kept in {self.path}")
            return
        shutil.rmtree(self.path, ignore_errors=True)
        _say(f"nothing was made: removed {self.path}")


def _anything_made(folder: Path, *, ignore: set[str] | frozenset[str] = frozenset()) -> bool:
    """Any entry besides kernelexec's own folder and ``ignore`` (names only: nothing the code
    left there is followed or opened)."""
    from ._door import OWN_DIR

    try:
        names = set(os.listdir(folder))
    except OSError:
        return False
    return bool(names - {OWN_DIR} - ignore)


class _OutputClosed(Exception):
    """stdout was closed by its reader (``| head -1``): the run stopped there."""

    def __init__(self, ran: int, total: int) -> None:
        rest = f"; blocks {ran + 1}-{total} were not run" if ran < total else ""
        super().__init__(f"the output was closed by its reader after block {ran} of {total}{rest}")


class _Stdout:
    """stdout that notices when its reader goes away (``| head -1``): writes after that are
    dropped and ``closed`` is set, so the run stops cleanly instead of raising mid-block (the
    live view writes from the executor's thread)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed = False

    def write(self, text: str) -> int:
        if not self.closed:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._close()
        return len(text)

    def flush(self) -> None:
        if not self.closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._close()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def _close(self) -> None:
        self.closed = True
        # The interpreter flushes stdout at exit: point it at /dev/null so that flush does
        # not raise a second BrokenPipeError (the Python docs' advice for SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)


_EXAMPLES = """\
executors (--executor NAME):
{executors}

examples:
  kernelexec run message.md                         run a message's blocks in a local kernel
  kernelexec run analysis.py --executor docker-kernel --timeout 120
  kernelexec run --upload data.csv message.md       the blocks read data.csv from the work dir
  echo '```python
  print(6 * 7)
  ```' | kernelexec run - --json                    one JSON document, a result per block
"""


def _examples() -> str:
    from ._registry import EXECUTORS

    lines = [f"  {e.name:<15} {e.summary}" for e in EXECUTORS.values()]
    return _EXAMPLES.format(executors="\n".join(lines))


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="run the fenced code blocks of a markdown message",
        description="Run the fenced code blocks of a markdown message (or a .py / .sh file) in "
        "order, stopping at the first that fails; output is shown as it happens.",
        epilog=_examples(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("file", help="a markdown message, a .py or .sh file, or - for stdin")
    _add_executor_options(run)
    run.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON: every block with its status (ok, failed, timed_out, "
        "not_run) and why",
    )
    run.add_argument("--notebook", help="also save the session as a notebook here (as chat does)")
    run.add_argument(
        "--upload",
        action="append",
        default=[],
        metavar="FILE",
        help="copy FILE into the work dir before the blocks run (repeatable)",
    )
    run.set_defaults(func=cmd_run)


def _add_executor_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--executor",
        default=DEFAULT_EXECUTOR,
        metavar="NAME",
        help=f"which executor runs the blocks: {', '.join(EXECUTOR_NAMES)} "
        f"(default: {DEFAULT_EXECUTOR})",
    )
    parser.add_argument("--work-dir", help="where code runs and files land (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per block")
    parser.add_argument(
        "--no-charts",
        dest="charts",
        action="store_false",
        help="no chart and table documents: a figure is said as its saved image alone "
        "(docs/charts.md)",
    )
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help="run a local back end in a bubblewrap sandbox (no network, read-only host)",
    )
    parser.add_argument(
        "--allow",
        action="append",
        metavar="HOST[:PORT]",
        help="let the code reach HOST (a name, *.name or an IP address; ports 80 and 443 "
        "unless given) through kernelexec's egress proxy; repeat for more. The docker-* "
        "executors and --sandbox only; everything else stays unreachable",
    )
    parser.add_argument(
        "--packages",
        action="append",
        metavar="REQ[,REQ...]",
        help="pip-install these at session start (docker-* executors and --sandbox), from "
        "the host's wheel cache or the index the host's pip uses, whose hosts are allowed for "
        "that step only",
    )
    parser.add_argument("--secret", action="append", metavar="NAME@HOST[,HOST]", help=_SECRET_HELP)
    parser.add_argument(
        "--runtime",
        metavar="NAME",
        help="the Docker engine's runtime for the docker-* executors, e.g. runsc (gVisor: the "
        "code's syscalls go to a kernel in user space, not the host's)",
    )
    remote = parser.add_argument_group("remote kernels (Kernel / Enterprise Gateway)")
    remote.add_argument("--remote", metavar="URL", help="run on a kernel of the gateway at URL")
    remote.add_argument("--token", help="the gateway's token (default: $KERNELEXEC_GATEWAY_TOKEN)")
    remote.add_argument(
        "--remote-user",
        metavar="NAME",
        help="sent as KERNEL_USERNAME (Enterprise Gateway, provisioned kernels)",
    )
    remote.add_argument(
        "--kernelspec",
        metavar="NAME",
        help="run on a kernel started by this kernelspec's provisioner (Docker Swarm, "
        "Kubernetes, ...; the provisioned-kernel executor, kernelexec[cluster])",
    )


def cmd_repl(args: argparse.Namespace) -> int:
    from ._repl import run_interactive, run_repl

    # As for run: a temp work dir is named at the start and kept at Ctrl-D when anything was
    # made there (a plot the session showed must still exist after it).
    executor_flags(args)  # a usage error before any folder is made
    with _WorkDir(args.work_dir, "repl") as work, _executor_from(args, work_dir=work.path) as ex:
        if sys.stdin.isatty() and sys.stdout.isatty() and not args.separator_only:
            return run_interactive(ex, sys.stdout, language=normalize_language(args.language))
        return run_repl(
            ex,
            sys.stdin,
            sys.stdout,
            language=normalize_language(args.language),
            prompt=sys.stdin.isatty(),
            separator_only=args.separator_only,
        )


def _add_repl(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    repl = sub.add_parser("repl", help="an interactive session that keeps state")
    _add_executor_options(repl)
    repl.add_argument("--language", default="python", help="language of every block")
    repl.add_argument(
        "--separator-only",
        action="store_true",
        help="only a ';;' line runs the code (blank lines stay in the block)",
    )
    repl.set_defaults(func=cmd_repl)


def cmd_notebook_run(args: argparse.Namespace) -> int:
    from ._notebook import run_notebook
    from ._session import META_KEY

    output = args.output or args.notebook  # like nbconvert --inplace when no -o is given
    _check_notebook_executor(args.executor)
    if args.kernel is not None and args.executor not in (None, "kernel"):
        raise UsageError("-k/--kernel names a local kernelspec: drop --executor, or -k")
    parameters = _notebook_parameters(args)
    if args.help_notebook:
        return _help_notebook(args.notebook)
    try:
        with warnings.catch_warnings():
            # e.g. -p on a notebook without a 'parameters' cell, or a name it does not
            # declare: one line each, when it happens
            warnings.simplefilter("always", UserWarning)
            warnings.showwarning = _warning_line
            nb = _run_notebook_cli(run_notebook, args, output, parameters)
    except ValueError as exc:  # a bad --executor, -p name or --timeout: a usage error
        print(f"kernelexec: {exc}", file=sys.stderr)
        return 2
    status = nb.metadata[META_KEY]
    if status["status"] == "ok":
        print(f"Executed {args.notebook} -> {output}")
        return 0
    where = f"cell {status['failed_cell']}"
    print(f"kernelexec: {status['status']} in {where}: {status['error']}", file=sys.stderr)
    print(f"Partial notebook written to {output}", file=sys.stderr)
    return min(int(status["exit_code"]), 255)


def _notebook_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """papermill's order: ``-f`` files, then ``-y`` strings, then ``-p``, then ``-r`` (raw
    strings); a later value for a name wins."""
    from ._notebook import parse_parameter

    parameters: dict[str, Any] = {}
    for path in args.parameters_file:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"-f {path}: cannot read it ({exc.strerror or exc})") from None
        parameters.update(_yaml_mapping(text, f"-f {path}"))
    for text in args.parameters_yaml:
        parameters.update(_yaml_mapping(text, "-y"))
    parameters.update((name, parse_parameter(value)) for name, value in args.parameter)
    parameters.update((name, value) for name, value in args.parameter_raw)
    return parameters


def _yaml_mapping(text: str, flag: str) -> dict[str, Any]:
    """``-f`` / ``-y``: a YAML mapping of names to values (PyYAML when installed; JSON, which
    is YAML too, without it)."""
    try:
        import yaml
    except ImportError:
        yaml = None
    try:
        value = yaml.safe_load(text) if yaml is not None else json.loads(text or "null")
    except ValueError as exc:  # json.JSONDecodeError; yaml.YAMLError is checked below
        hint = "" if yaml is not None else " (only JSON without PyYAML: pip install pyyaml)"
        raise UsageError(f"{flag}: not a YAML mapping{hint}: {exc}") from None
    except Exception as exc:
        if yaml is not None and isinstance(exc, yaml.YAMLError):
            raise UsageError(f"{flag}: not valid YAML: {' '.join(str(exc).split())}") from None
        raise
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: expected a mapping of parameter names to values")
    return {str(name): item for name, item in value.items()}


def _help_notebook(path: str) -> int:
    """``--help-notebook``: the parameters the notebook declares, as papermill lists them."""
    from ._notebook import declared_parameters
    from ._session import read_notebook

    declared = declared_parameters(read_notebook(path))
    print(f"Parameters inferred for notebook '{path}':")
    if declared is None:
        print("\n  No cell tagged 'parameters'")
        return 1
    if not declared:
        print("\n  The 'parameters' cell assigns no names.")
    for parameter in declared:
        line = f"  {parameter.name}: {parameter.type} (default {parameter.default})"
        print(f"{line:<34}{parameter.help}".rstrip() if len(line) <= 30 else line)
        if len(line) > 30 and parameter.help:
            print(f"{'':34}{parameter.help}")
    return 0


def _check_notebook_executor(name: str | None) -> None:
    """Refuse a stateless ``--executor`` before anything starts: cells build on each other."""
    from ._registry import EXECUTORS

    if name is not None and not executor_entry(name).stateful:
        stateful = ", ".join(e.name for e in EXECUTORS.values() if e.stateful)
        raise UsageError(
            f"--executor {name} runs each block in a new process; a notebook's cells build "
            f"on each other: use --executor with one of {stateful}"
        )


def _warning_line(message: Warning | str, *args: Any, **kwargs: Any) -> None:
    print(f"kernelexec: warning: {message}", file=sys.stderr, flush=True)


def _run_notebook_cli(
    run_notebook: Any, args: argparse.Namespace, output: str, parameters: dict[str, Any]
) -> Any:
    return run_notebook(
        args.notebook,
        output_path=output,
        executor=args.executor,
        timeout=args.timeout,
        allow_errors=args.allow_errors,
        parameters=parameters,
        progress=not (args.no_progress or args.log_output),  # papermill: one or the other
        work_dir=args.work_dir,
        output_files=not args.no_output_files,
        kernel_name=args.kernel,
        on_output=_log_output() if args.log_output else None,
    )


def _log_output() -> Any:
    """``--log-output``: each cell's output as it happens, stdout text to stdout and stderr
    text to stderr (papermill logs both); rich outputs as one line."""
    from ._view import LiveView

    out, err = LiveView(sys.stdout), LiveView(sys.stderr)

    def show(output: dict[str, Any]) -> None:
        is_err = output.get("output_type") == "stream" and output.get("name") == "stderr"
        (err if is_err else out)(output)

    return show


def _add_notebook(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    notebook = sub.add_parser("notebook", help="work with Jupyter notebooks")
    actions = notebook.add_subparsers(dest="notebook_command", required=True)
    run = actions.add_parser("run", help="execute a notebook's code cells and save the outputs")
    run.add_argument("notebook", help="the .ipynb to run")
    run.add_argument("-o", "--output", help="where to write the result (default: in place)")
    run.add_argument(
        "--executor",
        default=None,
        metavar="NAME",
        help="a stateful executor: kernel, docker-kernel or gateway "
        "(default: a local kernel from the notebook's kernelspec)",
    )
    run.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    run.add_argument("--work-dir", help="where the cells run (default: the notebook's folder)")
    run.add_argument(
        "--no-output-files",
        action="store_true",
        help="do not also save plots and other rich outputs as files (default: in a folder "
        "named after the output notebook, e.g. report_files/; the notebook embeds them anyway)",
    )
    run.add_argument("--allow-errors", action="store_true", help="keep going after a failed cell")
    run.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        metavar=("NAME", "VALUE"),
        default=[],
        help="inject NAME = VALUE after the 'parameters' cell (a Python literal, else a string)",
    )
    run.add_argument(
        "-r",
        "--parameter-raw",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="inject NAME = VALUE as a string, as written (e.g. -r code 007)",
    )
    run.add_argument(
        "-f",
        "--parameters-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a YAML file of parameters (repeatable; -y, -p and -r override it)",
    )
    run.add_argument(
        "-y",
        "--parameters-yaml",
        action="append",
        default=[],
        metavar="YAML",
        help="parameters as a YAML string, e.g. -y '{region: north, n: 3}'",
    )
    run.add_argument(
        "--help-notebook",
        action="store_true",
        help="list the parameters the notebook declares (and their defaults), then exit",
    )
    run.add_argument(
        "-k",
        "--kernel",
        metavar="NAME",
        help="run this kernelspec instead of the notebook's (a local kernel)",
    )
    run.add_argument(
        "--log-output",
        action="store_true",
        help="show each cell's output as it happens (stdout, and stderr on stderr)",
    )
    run.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    run.set_defaults(func=cmd_notebook_run)


def cmd_image_build(args: argparse.Namespace) -> int:
    from ._image import build_image, build_language_image, build_launcher_image, image_languages

    try:  # a typo fails before anything is built
        languages = image_languages((args.languages or "").split(","))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    build_image(offline=args.offline, tag=args.tag, mirror=args.mirror, force=args.force)
    if args.with_launchers:
        build_launcher_image(base=args.tag, tag=args.launchers_tag, force=args.force)
    if languages:
        build_language_image(languages, base=args.tag, tag=args.languages_tag, force=args.force)
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from .backends._containment import sweep_orphans
    from .backends._docker import gc, gc_services, no_engine
    from .backends._owner import sweep_temp_folders

    verb = "would remove" if args.dry_run else "removed"

    def say(kind: str, found: list[str]) -> None:
        print(f"{verb} {len(found)} {kind}" + (": " + " ".join(found) if found else ""))

    # Local leftovers first: they need no Docker engine. The cgroups go before the temp
    # folders: their processes (an orphaned kernel) are killed before its folder goes.
    say("cgroup(s)", sweep_orphans(dry_run=args.dry_run))
    say("temp folder(s) and file(s)", sweep_temp_folders(dry_run=args.dry_run))
    # Without an engine there are no containers to remove (nor any left running): the local
    # sweep above is the whole job, and a machine without Docker is not a failure. An engine
    # that answers and then fails mid-sweep is one (exit 1): "nothing checked" would be false.
    missing = no_engine()
    if missing is not None:
        print(f"no containers checked: {missing}", file=sys.stderr)
        return 0
    containers = gc(dry_run=args.dry_run)
    services = gc_services(dry_run=args.dry_run)
    say("container(s)", containers)
    say("service(s)", services)
    return 0


def _add_docker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    image = sub.add_parser("image", help="the Docker image the docker executors use")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help="build the image (skipped when up to date)")
    build.add_argument(
        "--offline", action="store_true", help="no registry: debootstrap Debian (needs root)"
    )
    build.add_argument("--tag", default=DEFAULT_IMAGE, help=f"image name (default {DEFAULT_IMAGE})")
    build.add_argument("--mirror", help="Debian mirror for --offline (default: apt's)")
    build.add_argument("--force", action="store_true", help="rebuild even when up to date")
    build.add_argument(
        "--with-launchers",
        action="store_true",
        help="also build an image with gateway_provisioners' kernel launchers on top, for "
        "kernels on a cluster engine (needs kernelexec[cluster]; the build stays offline)",
    )
    build.add_argument(
        "--launchers-tag",
        default=LAUNCHERS_IMAGE,
        help=f"name of the image with the launchers (default {LAUNCHERS_IMAGE})",
    )
    build.add_argument(
        "--languages",
        metavar="LANGS",
        help="also build an image with these languages' kernels on top (comma-separated: r, js, "
        "bash), for ```r / ```js / ```bash blocks in a docker-kernel session",
    )
    build.add_argument(
        "--languages-tag",
        default=LANGUAGES_IMAGE,
        help=f"name of the image with the languages (default {LANGUAGES_IMAGE})",
    )
    build.set_defaults(func=cmd_image_build)
    gc = sub.add_parser(
        "gc",
        help="remove what kernelexec made whose owner process is gone: containers, Swarm "
        "services, cgroups, private temp folders",
    )
    gc.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    gc.set_defaults(func=cmd_gc)


def cmd_cluster_spec(args: argparse.Namespace) -> int:
    from ._cluster import (
        KubernetesSpec,
        SwarmSpec,
        install_kernelspec,
        kernel_pod,
        kubernetes_manifests,
        manifest_list,
    )

    prefix = Path(args.prefix).resolve()
    if args.kubernetes:
        spec = KubernetesSpec(
            image=args.image,
            namespace=args.namespace,
            kernel_name=args.name or KubernetesSpec.kernel_name,
        )
        folder = install_kernelspec(spec, prefix)
        items = [*kubernetes_manifests(spec)]
        if args.with_pod:
            items.append(kernel_pod(folder))
        text = json.dumps(manifest_list(items), indent=2) + "\n"
        if args.manifests:
            Path(args.manifests).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
    else:
        swarm = SwarmSpec(
            image=args.image, network=args.network, kernel_name=args.name or SwarmSpec.kernel_name
        )
        folder = install_kernelspec(swarm, prefix)
    print(f"kernelspec: {folder}", file=sys.stderr)
    return 0


_SECRET_HELP = (
    "give the code a placeholder in $NAME that kernelexec's egress proxy replaces by the value "
    "of NAME in this process's environment, in requests to HOST only (which --allow must allow; "
    "repeatable). The value is never on the command line, in the code's environment or output"
)


def cmd_doctor(args: argparse.Namespace) -> int:
    from ._doctor import as_json, matrix, run_doctor, targets

    network = None
    if args.allow or args.secret:
        from ._network import NetworkPolicy, describe_secrets, secrets_from_environment

        secrets = secrets_from_environment(args.secret or [])
        network = NetworkPolicy(allow=args.allow or [], secrets=secrets)
        print(f"kernelexec doctor: {describe_secrets(network)}", file=sys.stderr)
    rows = run_doctor(targets(args.backend, network=network))
    report = as_json(rows)
    if network is not None:  # names and hosts only: a value never reaches a report
        report["secrets"] = {name: list(s.hosts) for name, s in network.secrets.items()}
    print(json.dumps(report, indent=2) if args.json else matrix(rows))
    return 0 if report["ok"] else 1


def _add_doctor(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="start each back end here and measure what it protects (exit 1 if a protection "
        "it claims fails)",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    from ._doctor import BACKENDS  # a light import: the registry loads back ends lazily

    doctor.add_argument(
        "--backend", action="append", choices=BACKENDS, help="probe only this back end (repeatable)"
    )
    doctor.add_argument(
        "--allow",
        action="append",
        metavar="HOST[:PORT]",
        help="probe the isolating back ends under this egress allowlist (repeatable): the "
        "doctor's own listeners must stay unreachable, directly and through the proxy",
    )
    doctor.add_argument("--secret", action="append", metavar="NAME@HOST[,HOST]", help=_SECRET_HELP)
    doctor.set_defaults(func=cmd_doctor)


def _add_cluster(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = sub.add_parser("cluster", help="kernels on a cluster engine (Swarm, Kubernetes)")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    spec = actions.add_parser(
        "spec",
        help="install a provisioned kernelspec (gateway_provisioners' installer) and, for "
        "Kubernetes, print the manifests around it",
    )
    engine = spec.add_mutually_exclusive_group(required=True)
    engine.add_argument("--kubernetes", action="store_true", help="kubernetes-provisioner")
    engine.add_argument("--swarm", action="store_true", help="docker-swarm-provisioner")
    spec.add_argument("--name", help="kernelspec name")
    spec.add_argument("--image", default=LAUNCHERS_IMAGE, help="kernel image (with launchers)")
    spec.add_argument("--prefix", default=sys.prefix, help="install under PREFIX/share/jupyter")
    spec.add_argument("--namespace", default="kernelexec", help="Kubernetes namespace")
    spec.add_argument("--network", default="kernelexec", help="Swarm overlay network")
    spec.add_argument("--manifests", help="write the Kubernetes manifests here (default: stdout)")
    spec.add_argument(
        "--with-pod", action="store_true", help="add the kernel pod the launcher would create"
    )
    spec.set_defaults(func=cmd_cluster_spec)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelexec",
        description="Run code written by LLM agents.",
        epilog=_examples(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kernelexec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_repl(sub)
    _add_notebook(sub)
    _add_docker(sub)
    _add_cluster(sub)
    _add_doctor(sub)
    _add_bench(sub)
    _add_chat(sub)
    add_mcp_command(sub)
    return parser


def _add_chat(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``kernelexec chat "task" --model M --base-url URL``: the built-in agent loop."""
    chat = sub.add_parser("chat", help="let a model solve a task by writing code that runs here")
    chat.add_argument("task", help="what the model should do")
    chat.add_argument("--model", required=True, help="the model name the server knows")
    chat.add_argument(
        "--base-url",
        default=None,
        help="an OpenAI-compatible server, e.g. http://localhost:11434/v1 (default: OpenAI)",
    )
    chat.add_argument("--max-turns", type=int, default=10, help="most replies from the model")
    chat.add_argument("--yes", action="store_true", help="run code without asking first")
    chat.add_argument(
        "--notebook", help="save the transcript here (default: chat.ipynb in the work dir)"
    )
    chat.add_argument(
        "--send-images", action="store_true", help="send saved images to the model (vision)"
    )
    _add_executor_options(chat)
    chat.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    executor_flags(args)  # a usage error before any folder is made
    # The transcript is always kept: in the work dir (a new folder when none is given). A
    # chat that fails before anything was made there leaves no empty folder behind.
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="kernelexec-chat-")).absolute()
    try:
        return _chat(args, work)
    finally:
        if not args.work_dir and not _anything_made(work):
            shutil.rmtree(work, ignore_errors=True)


def _chat(args: argparse.Namespace, work: Path) -> int:
    from .agent import OpenAIChatModel, ask_on_terminal, run_chat

    notebook = args.notebook or str(work / "chat.ipynb")
    try:
        # Built inside the try: with no key and no --base-url, openai refuses at construction.
        model = OpenAIChatModel(args.model, base_url=args.base_url)
    except Exception as exc:
        return _say_model_problem(exc, args.base_url)
    try:
        with _executor_from(args, work_dir=work) as executor:
            chat = run_chat(
                args.task,
                model=model,
                executor=executor,
                max_turns=args.max_turns,
                approve=None if args.yes else ask_on_terminal,
                send_images=args.send_images,
                notebook_path=notebook,
                on_turn=_print_turn,
            )
    except Exception as exc:
        return _say_model_problem(exc, args.base_url)
    finally:
        model.close()
    print(f"Transcript saved to {chat.notebook_path}")
    if chat.stop_reason != "terminate":
        print(f"kernelexec: no TERMINATE after {args.max_turns} turns", file=sys.stderr)
        return 1
    return 0


def _say_model_problem(exc: BaseException, base_url: str | None) -> int:
    """Print the one line for a model problem (exit status 2); anything else propagates."""
    # A usage or kernelexec error is not the model's: main prints it as it is.
    problem = (
        None if isinstance(exc, (UsageError, KernelExecError)) else _model_problem(exc, base_url)
    )
    if problem is None:
        raise exc
    print(f"kernelexec: {problem}", file=sys.stderr)
    return 2


def _model_problem(exc: BaseException, base_url: str | None) -> str | None:
    """One line for a model server that cannot be reached or refuses us (None: not that)."""
    import openai

    where = base_url or "the OpenAI API"
    if base_url is None and not os.environ.get("OPENAI_API_KEY"):
        return "no API key for the OpenAI API: set OPENAI_API_KEY, or --base-url for a local server"
    if isinstance(exc, openai.AuthenticationError):
        return f"{where} refused the API key (set OPENAI_API_KEY): {exc.message}"
    if isinstance(exc, openai.APIConnectionError):
        return f"cannot reach the model server at {where}: {exc}"
    if isinstance(exc, openai.OpenAIError):
        return f"the model server at {where} failed: {exc}"
    return None


def _print_turn(turn: ChatTurn) -> None:
    print(f"\n--- writer ---\n{turn.writer}", flush=True)
    if turn.reply is not None:
        print(f"\n--- executor ---\n{turn.reply}", flush=True)


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .bench.cli import add_parser  # the bench's options live with the bench

    add_parser(sub)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except (KernelExecError, UsageError, _OutputClosed) as exc:
        print(f"kernelexec: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    raise SystemExit(main())
