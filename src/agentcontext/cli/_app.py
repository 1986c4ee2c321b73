"""The ``agentcontext`` command: the parser, dispatch and error reporting."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, cast

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from agentcontext import __version__
from agentcontext.cli import _branches, _browse, _demo, _migrate, _retention, _serve, _transfer
from agentcontext.cli._common import (
    DEFAULT_URL,
    ENV_VAR,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_OUTDATED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    KEY_ENV_DEFAULT,
    KEYRING_ENV_VAR,
    SCHEMA_ENV_VAR,
    Env,
    Handler,
    exit_code,
)
from agentcontext.cli._output import Output
from agentcontext.errors import ContextError

__all__ = ["build_parser", "main"]

EXIT_INTERRUPTED = 130

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK}    success
  {EXIT_ERROR}    any other error (for example, the chat id of an import is taken)
  {EXIT_USAGE}    usage error or invalid input (bad option, URL, schema, revision, duration,
       or a file that is not a valid chat export)
  {EXIT_NOT_FOUND}    not found (chat, branch, file)
  {EXIT_OUTDATED}    database schema missing or outdated (the message gives the command to run)
  {EXIT_UNAVAILABLE}    database unreachable
  {EXIT_INTERRUPTED}  interrupted
"""

EPILOG = f"""\
database URL:
  --url (before or after the command), else ${ENV_VAR},
  else {DEFAULT_URL} (a file in the current directory).
  Reading commands, delete and prune never create or migrate a database; import and
  demo migrate it. A command that fails removes the SQLite file it created.
  Passwords in URLs are never printed.

tenant schema (PostgreSQL) or database (MariaDB/MySQL):
  --schema NAME (before or after the command), else ${SCHEMA_ENV_VAR}, else the
  database's default schema (PostgreSQL) or the URL's database: every command works
  on the chats of that schema, as SqlContextStore(url, schema=NAME) does. SQLite
  has no schemas (usage error).

output:
  Tables, colours and trees on a terminal (with the cli extra: pip install
  'agentcontext[cli]'); plain text when stdout is not a terminal (tables become
  tab-separated lines with a header line). --json on chats, branches, show, search and
  prune prints JSON with full ids.

{EXIT_CODES}"""

URL_HELP = f"database URL (default: ${ENV_VAR}, else {DEFAULT_URL})"
SCHEMA_HELP = (
    f"a tenant's schema (PostgreSQL) or database (MariaDB/MySQL) (default: ${SCHEMA_ENV_VAR}, "
    "else the URL's own)"
)
DEMO_SCHEMA_HELP = (
    f"a PostgreSQL schema or MariaDB/MySQL database to write the demo's chat into, with --url "
    f"(${SCHEMA_ENV_VAR} is not used)"
)
DEMO_URL_HELP = (
    "database URL (default: its own file sqlite+aiosqlite:///agentcontext-demo.db in the "
    f"current directory; ${ENV_VAR} is not used, so the demo never writes to your database)"
)


class _Formatter(argparse.HelpFormatter):
    """Wraps one-paragraph descriptions; keeps multi-line text (the epilogs) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command."""
    parser = argparse.ArgumentParser(
        prog="agentcontext",
        description="Inspect and manage agentcontext databases: chats, message graphs and "
        "transcripts, search, export and import, deletion and retention, and schema "
        "migrations.",
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument("--url", metavar="URL", help=URL_HELP)
    parser.add_argument("--schema", metavar="NAME", help=SCHEMA_HELP)
    _keyring_options(parser)
    parser.add_argument("--version", action="version", version=f"agentcontext {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _demo.register(commands)
    _migrate.register(commands)
    _browse.register(commands)
    _branches.register(commands)
    _transfer.register(commands)
    _retention.register(commands)
    _serve.register(commands)
    for sub in commands.choices.values():
        _finish(sub)
    return parser


def _keyring_options(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """``--keyring`` and ``--key-env``: the key provider of an encrypted database."""
    parser.add_argument(
        "--keyring",
        metavar="K",
        default=default,
        help=f"an encrypted database's keyring: a SQLite file path or a database URL (else "
        f"${KEYRING_ENV_VAR}); the master key is read from --key-env",
    )
    parser.add_argument(
        "--key-env",
        metavar="NAME",
        default=default,
        help=f"the environment variable holding the base64 master key (default: {KEY_ENV_DEFAULT})",
    )


def _finish(parser: argparse.ArgumentParser) -> None:
    """Every command accepts ``--url`` and ``--schema`` after its name too, and lists the
    exit codes."""
    parser.epilog = parser.epilog or EXIT_CODES
    parser.formatter_class = _Formatter
    is_demo = parser.prog.split()[-1] == "demo"
    parser.add_argument(
        "--url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=DEMO_URL_HELP if is_demo else URL_HELP,
    )
    if "--schema" not in parser._option_string_actions:  # migrate's actions have their own
        parser.add_argument(
            "--schema",
            metavar="NAME",
            default=argparse.SUPPRESS,
            help=DEMO_SCHEMA_HELP if is_demo else SCHEMA_HELP,
        )
    if "--keyring" not in parser._option_string_actions:  # (migrate encrypt has its own)
        _keyring_options(parser, argparse.SUPPRESS)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _finish(cast(argparse.ArgumentParser, sub))


def _scrub(message: str, url: str) -> str:
    """One line, with the URL's password hidden even if a driver message repeated it."""
    text = " ".join(message.split())
    try:
        password = make_url(url).password
    except ArgumentError:
        return text.replace(url, "<URL>") if url else text
    if password:
        text = text.replace(url, make_url(url).render_as_string(hide_password=True))
        text = text.replace(f":{password}@", ":***@")
    return text


def _report(message: str, url: str) -> None:
    sys.stderr.write(f"error: {_scrub(message, url) or 'unknown error'}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (argparse exits 2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    env = Env.from_args(args.url, Output(), args.schema, args.keyring, args.key_env)
    handler = cast(Handler, args.handler)

    async def run() -> int:
        from agentcontext.store.admin import driver_threads, settle_driver_threads

        before = driver_threads()
        try:
            return await handler(args, env)
        finally:
            # The threads of the connections this command opened end while the loop runs,
            # so nothing prints after it has closed.
            await settle_driver_threads(since=before)

    try:
        return asyncio.run(run())
    except ContextError as exc:
        _report(str(exc), env.url)
        return exit_code(exc)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: stop quietly, without a second error at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
