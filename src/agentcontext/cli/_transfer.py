"""`export` and `import`: a chat as JSON, moved between databases and backends unchanged."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentcontext._validate import MAX_ID_LENGTH, check_id
from agentcontext.cli._common import EXIT_OK, Env, open_store
from agentcontext.cli._output import count
from agentcontext.errors import (
    ChatExistsError,
    ContextError,
    InvalidGraphError,
    InvalidInputError,
    NotFoundError,
)
from agentcontext.store import ChatExport
from agentcontext.store.admin import check_export, new_id

__all__ = ["export_text", "register", "renamed"]


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
        "new ids too (ids are unique in a database), names, texts and times stay",
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


def _copy_id(message_id: str, chat_id: str) -> str:
    copy = f"{message_id}@{chat_id}"
    return copy if len(copy) <= MAX_ID_LENGTH else new_id()


def renamed(export: ChatExport, chat_id: str) -> ChatExport:
    """A copy of `export` as chat `chat_id`, with new ids for everything that has one.

    Message, branch, checkpoint and snapshot ids are unique across a database, so a copy
    beside the original needs its own: message `m1` becomes `m1@NEW_ID` (a random id if that
    is too long), the others get random ids. Every reference (parents, heads, checkpoint and
    snapshot messages, a message's own id in its JSON) follows.
    """
    ids = {record.id: _copy_id(record.id, chat_id) for record in export.messages}

    def moved(message_id: str | None) -> str | None:
        return None if message_id is None else ids.get(message_id, message_id)

    messages = []
    for record in export.messages:
        data = record.data
        if isinstance(data, dict) and data.get("id") == record.id:
            data = {**data, "id": ids[record.id]}
        update = {"id": ids[record.id], "chat_id": chat_id, "data": data}
        messages.append(record.model_copy(update={**update, "parent_id": moved(record.parent_id)}))
    branches = [
        branch.model_copy(
            update={
                "id": new_id(),
                "chat_id": chat_id,
                "head_message_id": moved(branch.head_message_id),
            }
        )
        for branch in export.branches
    ]
    checkpoints = [
        point.model_copy(
            update={"id": new_id(), "chat_id": chat_id, "message_id": moved(point.message_id)}
        )
        for point in export.checkpoints
    ]
    snapshots = [
        snapshot.model_copy(
            update={
                "id": None if snapshot.id is None else new_id(),
                "chat_id": chat_id,
                "message_id": moved(snapshot.message_id),
            }
        )
        for snapshot in export.snapshots
    ]
    return export.model_copy(
        update={
            "chat": export.chat.model_copy(update={"id": chat_id}),
            "messages": messages,
            "branches": branches,
            "checkpoints": checkpoints,
            "snapshots": snapshots,
        }
    )


async def _import(args: argparse.Namespace, env: Env) -> int:
    where = _where(args.file)
    if args.as_id is not None:
        check_id(args.as_id, "the chat id of --as")
    exported = _parse(args.file, _read(args.file))
    if args.as_id is not None:
        exported = renamed(exported, args.as_id)

    def check() -> None:  # before the database is opened: a bad file changes nothing
        try:
            check_export(exported)
        except ContextError as exc:
            raise InvalidInputError(f"{where} is not a valid chat export: {exc}") from None

    chat_id = exported.chat.id
    async with open_store(env, write=True, check=check) as store:
        try:
            await store.import_chat(exported)
        except ChatExistsError:
            raise ChatExistsError(
                f"chat {chat_id!r} already exists in {env.shown_url}; import a copy under "
                f"another id with: {env.command('import', args.file, '--as', 'NEW_ID')}, or "
                f"delete the existing chat first with: {env.command('delete', chat_id)}"
            ) from None
        except InvalidGraphError as exc:
            raise InvalidGraphError(
                f"cannot import {where} into {env.shown_url}: {exc}; import a copy with new "
                f"ids with: {env.command('import', args.file, '--as', 'NEW_ID')}"
            ) from None
    env.out.line(f"imported {_summary(exported)} into {env.shown_url}", style="green")
    return EXIT_OK
