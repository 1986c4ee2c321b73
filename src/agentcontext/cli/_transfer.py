"""`export` and `import`: a chat as JSON, moved between databases and backends unchanged."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentcontext._validate import check_id
from agentcontext.cli._common import EXIT_OK, Env, open_store
from agentcontext.cli._output import count
from agentcontext.errors import (
    BranchExistsError,
    ChatExistsError,
    ContextError,
    InvalidGraphError,
    InvalidInputError,
    NotFoundError,
)
from agentcontext.store import ChatExport
from agentcontext.store.admin import check_export, copy_export

__all__ = ["export_text", "register"]


def register(commands: Any) -> None:
    """Add ``export`` and ``import`` to the command parsers."""
    export = commands.add_parser(
        "export",
        help="write a chat as JSON (stdout by default)",
        description="Write CHAT with all its messages, branches and checkpoints as JSON: "
        "ids, timestamps and the active branch included. Keys are sorted, so the same chat "
        "gives the same bytes on every backend.",
    )
    export.add_argument("chat", metavar="CHAT", help="the chat id")
    export.add_argument(
        "-o", "--output", metavar="FILE", help="write to FILE instead of stdout ('-': stdout)"
    )
    export.set_defaults(handler=_export)

    load = commands.add_parser(
        "import",
        help="read a chat exported as JSON into the database",
        description="Read a chat written by 'agentcontext export' from FILE ('-' for stdin) "
        "and store it exactly as it was. The chat id must be free; --as stores a copy under "
        "another id. The file is checked completely before the database is opened: a "
        "malformed export exits 2 and writes nothing. Migrates an empty database first.",
    )
    load.add_argument("file", metavar="FILE", help="the JSON file, or - for stdin")
    load.add_argument(
        "--as",
        dest="as_id",
        metavar="NEW_ID",
        help="store the chat as NEW_ID; its messages, branches, checkpoints and snapshots get "
        "new ids too (ids are unique in a database), by the rule of store.copy_chat: message "
        "M becomes M@NEW_ID; names, texts and times stay",
    )
    load.set_defaults(handler=_import)


def export_text(exported: ChatExport) -> str:
    """The JSON form of an export: indented, keys sorted, non-ASCII kept as is."""
    data = exported.model_dump(mode="json")
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _summary(exported: ChatExport) -> str:
    counts = (
        count(len(exported.messages), "message"),
        count(len(exported.branches), "branch"),
        count(len(exported.checkpoints), "checkpoint"),
    )
    return f"chat {exported.chat.id} ({', '.join(counts)})"


async def _export(args: argparse.Namespace, env: Env) -> int:
    async with open_store(env) as store:
        exported = await store.export_chat(args.chat)
    text = export_text(exported)
    if args.output in (None, "-"):
        env.out.raw(text)
        return EXIT_OK
    path = _write(args.output, text)
    env.out.line(f"exported {_summary(exported)} to {path}", style="green")
    return EXIT_OK


def _write(name: str, text: str) -> Path:
    path = Path(name)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ContextError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    path = Path(name)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFoundError(f"no such file: {path}") from None
    except UnicodeDecodeError:
        raise InvalidInputError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise ContextError(f"cannot read {path}: {exc.strerror or exc}") from None


def _where(name: str) -> str:
    return "stdin" if name == "-" else name


def _parse(name: str, text: str) -> ChatExport:
    where = _where(name)
    try:
        data = json.loads(text)
    except RecursionError:
        raise InvalidInputError(f"{where} is not a chat export: it is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise InvalidInputError(f"{where} is not valid JSON: {exc}") from None
    try:
        return ChatExport.model_validate(data)
    except RecursionError:
        raise InvalidInputError(f"{where} is not a chat export: it is nested too deeply") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise InvalidInputError(
            f"{where} is not an agentcontext chat export: {exc.error_count()} problem(s), "
            f"first at {location}: {first['msg']}"
        ) from None


async def _import(args: argparse.Namespace, env: Env) -> int:
    where = _where(args.file)
    if args.as_id is not None:
        check_id(args.as_id, "the chat id of --as")
    exported = _parse(args.file, _read(args.file))

    def check() -> None:  # before the database is opened: a bad file changes nothing
        nonlocal exported
        try:
            if args.as_id is not None:
                # The rule of store.copy_chat: the same ids as a copy made in the database.
                exported, _ = copy_export(exported, args.as_id)
            check_export(exported)
        except ContextError as exc:
            raise InvalidInputError(f"{where} is not a valid chat export: {exc}") from None

    async with open_store(env, write=True, check=check) as store:
        chat_id = exported.chat.id
        try:
            await store.import_chat(exported)
        except ChatExistsError:
            raise ChatExistsError(
                f"chat {chat_id!r} already exists in {env.where}; import a copy under "
                f"another id with: {env.command('import', args.file, '--as', 'NEW_ID')}, or "
                f"delete the existing chat first with: {env.command('delete', chat_id)}"
            ) from None
        except BranchExistsError as exc:  # a branch id of the export is taken (ids are global)
            raise BranchExistsError(
                f"cannot import {where} into {env.where}: {exc}; import a copy with new "
                f"ids with: {env.command('import', args.file, '--as', 'NEW_ID')}"
            ) from None
        except InvalidGraphError as exc:
            raise InvalidGraphError(
                f"cannot import {where} into {env.where}: {exc}; import a copy with new "
                f"ids with: {env.command('import', args.file, '--as', 'NEW_ID')}"
            ) from None
    env.out.line(f"imported {_summary(exported)} into {env.where}", style="green")
    return EXIT_OK
