"""``agentcontext serve``: the read-only web viewer on a local port."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from typing import Any

from agentcontext.cli._common import EXIT_OK, Env, open_store
from agentcontext.errors import InvalidInputError, MissingExtraError

__all__ = ["is_loopback", "register"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def is_loopback(host: str) -> bool:
    """Whether a host name or address only reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {number}")
    return number


def register(commands: Any) -> None:
    """Add ``serve`` to the command parsers."""
    serve = commands.add_parser(
        "serve",
        help="browse chats, graphs, snapshots and recorded resolves in a local web viewer",
        description="Serve a read-only web viewer of the database: chats (filter, search), "
        "each chat's graph drawn as a tree, messages, branches as transcripts, snapshots and "
        "recorded resolves with their diffs. Listens on 127.0.0.1 unless --host says "
        "otherwise; needs the web extra (pip install 'agentcontext[web]').",
    )
    serve.add_argument(
        "--host",
        default=DEFAULT_HOST,
        metavar="HOST",
        help=f"address to bind (default {DEFAULT_HOST})",
    )
    serve.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"port (default {DEFAULT_PORT})",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to NAME (repeatable); loopback names and --host "
        "are always answered, any other Host header gets 421 (DNS-rebinding protection)",
    )
    serve.add_argument("--user", metavar="USER", help="show only this user's chats")
    serve.set_defaults(handler=_serve)


async def _serve(args: argparse.Namespace, env: Env) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise MissingExtraError(
            f"agentcontext serve needs {exc.name or 'the web viewer packages'}, from the web "
            "extra: pip install 'agentcontext[web]'"
        ) from None
    from agentcontext.web import create_app

    if args.user is not None and not args.user:
        raise InvalidInputError("--user needs a user id")
    async with open_store(env) as store:
        app = create_app(store, user=args.user, allowed_hosts=[args.host, *args.allow_host])
        if not is_loopback(args.host):
            sys.stderr.write(
                f"warning: listening on {args.host}: anyone who can reach this address can "
                "read every chat shown\n"
            )
        scope = f" (user {args.user} only)" if args.user else ""
        env.out.line(f"agentcontext viewer of {env.where}{scope}")
        env.out.line(f"open http://{args.host}:{args.port}/  (Ctrl+C to stop)")
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level="warning", lifespan="on"
        )
        await uvicorn.Server(config).serve()
    return EXIT_OK
