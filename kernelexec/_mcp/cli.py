"""The ``kernelexec mcp`` sub-command (registered by ``kernelexec.cli``).

Building the parser imports nothing heavy; ``cmd_mcp`` checks that the ``mcp`` extra is installed
before it loads the SDK.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import signal
import sys
from typing import Any

from .._registry import DEFAULT_EXECUTOR, EXECUTOR_NAMES

INSTALL_HINT = 'pip install "kernelexec[mcp]"'
TOKEN_ENV = "KERNELEXEC_MCP_TOKEN"
EXIT_USAGE = 2


def add_mcp_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mcp = sub.add_parser(
        "mcp",
        help="serve stateful kernels to MCP clients (Claude, Cursor, agent SDKs)",
        description="An MCP server whose tools run code in stateful sessions: execute, "
        "list_sessions, restart, interrupt, close_session, upload_file, read_file, list_files. "
        "stdio by default; --http serves streamable HTTP on 127.0.0.1.",
    )
    mcp.add_argument(
        "--executor",
        default=DEFAULT_EXECUTOR,
        metavar="NAME",
        help=f"what runs the blocks: {', '.join(EXECUTOR_NAMES)} (default: {DEFAULT_EXECUTOR}; "
        "docker-kernel for untrusted use)",
    )
    mcp.add_argument("--image", help="the Docker image of the docker executors")
    mcp.add_argument("--timeout", type=float, default=60.0, help="default seconds per block")
    mcp.add_argument(
        "--no-charts",
        dest="charts",
        action="store_false",
        help="no chart and table documents in the sessions' results (a figure: its image alone)",
    )
    mcp.add_argument("--max-sessions", type=int, default=8, help="most sessions at once")
    mcp.add_argument(
        "--idle-timeout",
        type=float,
        default=1800.0,
        help="close a session unused this many seconds (0: never; default 1800)",
    )
    mcp.add_argument(
        "--warm", type=int, default=1, help="kernels kept started ahead of use (default 1)"
    )
    mcp.add_argument(
        "--allow",
        action="append",
        metavar="HOST[:PORT]",
        help="the sessions' egress allowlist (docker-* and sandboxed-* executors; repeatable): "
        "their code reaches these hosts through kernelexec's proxy, nothing else",
    )
    mcp.add_argument(
        "--secret",
        action="append",
        metavar="NAME@HOST[,HOST]",
        help="each session's code gets a placeholder in $NAME; the proxy puts the value of NAME "
        "(this server's environment) in requests to HOST only (an --allow'ed host; repeatable)",
    )
    http = mcp.add_argument_group("streamable HTTP")
    http.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    http.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free)")
    http.add_argument(
        "--token",
        help=f"bearer token clients must send (default: ${TOKEN_ENV}); required off 127.0.0.1",
    )
    remote = mcp.add_argument_group("gateway executor")
    remote.add_argument("--remote", metavar="URL", help="the Kernel / Enterprise Gateway's URL")
    remote.add_argument("--remote-token", help="the gateway's token")
    remote.add_argument("--remote-user", metavar="NAME", help="sent as KERNEL_USERNAME")
    remote.add_argument(
        "--remote-working-dir",
        metavar="DIR",
        help="the kernels' folder on the gateway's machine (shared by every session; default: "
        "each session's work dir path, which a gateway on another machine may not have)",
    )
    mcp.set_defaults(func=cmd_mcp)


def _hub_options(args: argparse.Namespace) -> Any:
    from .hub import HubOptions

    extra: dict[str, Any] = {}
    if args.image:
        extra["image"] = args.image
    if args.remote:
        if args.executor not in {DEFAULT_EXECUTOR, "gateway"}:
            raise SystemExit("kernelexec: --remote runs a gateway kernel; drop --executor")
        args.executor = "gateway"
        extra.update(url=args.remote, token=args.remote_token, user=args.remote_user)
        if args.remote_working_dir:
            extra["working_dir"] = args.remote_working_dir
    elif args.executor == "gateway":
        raise SystemExit("kernelexec: the gateway executor needs --remote URL")
    extra.update(_egress_options(args))
    if not args.charts:
        extra["charts"] = False
    return HubOptions(
        executor=args.executor,
        timeout=args.timeout,
        max_sessions=args.max_sessions,
        idle_timeout=args.idle_timeout or None,
        warm=args.warm,
        executor_options=extra,
    )


def _egress_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--allow``: every session's egress allowlist (a bad entry or executor: ValueError)."""
    allow = getattr(args, "allow", None)
    specs = getattr(args, "secret", None) or []
    if not allow and not specs:
        return {}
    from .._network import NetworkPolicy, secrets_from_environment

    # values from the server's own environment, never from its command line
    policy = NetworkPolicy(allow=allow or [], secrets=secrets_from_environment(specs))
    if args.executor.startswith("docker-"):
        return {"network": policy}
    if args.executor.startswith("sandboxed-"):
        from ..backends._sandbox import SandboxOptions

        return {"sandbox": SandboxOptions(network=policy)}
    raise ValueError(
        "--allow applies to the isolating executors (docker-kernel, docker-command, "
        f"sandboxed-kernel, sandboxed-command), not {args.executor!r}"
    )


def cmd_mcp(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("mcp") is None:
        print(f"kernelexec: the mcp server needs the mcp extra: {INSTALL_HINT}", file=sys.stderr)
        return EXIT_USAGE
    from .hub import Hub
    from .server import check_bind, serve_http, serve_stdio

    try:
        options = _hub_options(args)
    except ValueError as exc:
        print(f"kernelexec: {exc}", file=sys.stderr)
        return EXIT_USAGE
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if args.http:
        try:
            check_bind(args.host, token)
        except PermissionError as exc:
            print(f"kernelexec: {exc}", file=sys.stderr)
            return EXIT_USAGE
    hub = Hub(options)
    serve = (
        serve_http(hub, host=args.host, port=args.port, token=token)
        if args.http
        else serve_stdio(hub)
    )
    asyncio.run(_until_signalled(serve))
    return 0


async def _until_signalled(serve: Any) -> None:
    """Run ``serve``; SIGTERM / SIGINT cancel it, so sessions and kernels are shut down."""
    task = asyncio.ensure_future(serve)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
