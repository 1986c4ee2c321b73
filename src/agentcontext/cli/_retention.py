"""Deleting chats: `delete CHAT` and `prune --older-than DURATION` (retention)."""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta
from typing import Any

from agentcontext.cli._browse import add_json
from agentcontext.cli._common import EXIT_OK, Env, open_store
from agentcontext.cli._output import count
from agentcontext.errors import (
    ChatNotFoundError,
    CorruptDataError,
    EncryptionError,
    InvalidInputError,
)
from agentcontext.store import ChatInfo, PruneReport
from agentcontext.store.records import utcnow

__all__ = ["parse_duration", "register"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:(\d{1,9})([smhdw]))+")
_PART = re.compile(r"(\d{1,9})([smhdw])")
_PAGE = 500


def parse_duration(text: str) -> timedelta:
    """A duration such as `90d`, `12h`, `1w`, `1d12h` or `30m` (s, m, h, d, w), more than 0."""
    value = text.strip().lower()
    if not _DURATION.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 30d, 12h, 1w or 1d12h (units s, m, h, d, w), got {text!r}"
        )
    seconds = sum(int(number) * _UNITS[unit] for number, unit in _PART.findall(value))
    if seconds == 0:
        raise argparse.ArgumentTypeError("the duration must be more than 0")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"the duration {text!r} is too long") from None


def register(commands: Any) -> None:
    """Add `delete` and `prune` to the command parsers."""
    delete = commands.add_parser(
        "delete",
        help="delete a chat with all its messages, branches and checkpoints",
        description="Delete CHAT with its messages, branches, checkpoints, snapshots and "
        "search index entries. There is no undo: export it first to keep a copy "
        "(agentcontext export CHAT -o CHAT.json).",
    )
    delete.add_argument("chat", metavar="CHAT", help="the chat id")
    delete.add_argument(
        "--user", metavar="USER", help="delete only if USER owns the chat (else exit 3)"
    )
    delete.set_defaults(handler=_delete)

    prune = commands.add_parser(
        "prune",
        help="delete chats whose last activity is older than a duration (retention)",
        description="Delete every chat (or every chat of --user) whose last activity (the "
        "'last activity' of 'agentcontext chats', moved by every save) is "
        "older than DURATION, such as 90d, 12h, 2w or 1d12h. --dry-run lists them without "
        "deleting. Whole chats are deleted a batch at a time, each batch a short transaction "
        "(store.prune), with the blobs no other chat uses, so writers never wait for the whole "
        "run (a progress bar on standard error says how far it is); one written meanwhile is "
        "kept if it became active again. Interrupted, it has deleted whole chats only: run it "
        "again to finish.",
    )
    prune.add_argument(
        "--older-than",
        required=True,
        type=parse_duration,
        metavar="DURATION",
        help="last activity older than this: a number and a unit (s, m, h, d, w), e.g. 90d",
    )
    prune.add_argument("--user", metavar="USER", help="only this user's chats")
    prune.add_argument(
        "--dry-run", action="store_true", help="list the chats that would be deleted, delete none"
    )
    add_json(prune)
    prune.set_defaults(handler=_prune)


async def _delete(args: argparse.Namespace, env: Env) -> int:
    async with open_store(env) as store:
        unreadable = False
        try:
            chat = await store.get_chat(args.chat)
        except (EncryptionError, CorruptDataError):
            # A chat that cannot be read (its user's key destroyed, and the rows back from a
            # backup; or damaged) is deleted all the same: a delete needs none of its text.
            chat, unreadable = None, True
        deleted = await store.delete_chat(args.chat, user_id=args.user)
    if not deleted:
        if (chat is not None or unreadable) and args.user is not None:
            raise ChatNotFoundError(f"user {args.user!r} has no chat {args.chat!r}")
        raise ChatNotFoundError(f"chat {args.chat!r} does not exist")
    owner = f"user {chat.user_id}" if chat is not None else "it could not be read"
    env.out.line(f"deleted chat {args.chat} ({owner})", style="green")
    return EXIT_OK


async def _prune(args: argparse.Namespace, env: Env) -> int:
    async with open_store(env) as store:
        if not args.dry_run:
            with env.out.progress("pruning chats") as progress:
                report = await store.prune(
                    older_than=args.older_than, user_id=args.user, progress=progress
                )
            _report(args, env, report.older_than, report.chats, report)
            return EXIT_OK
        try:
            cutoff: datetime = utcnow() - args.older_than
        except OverflowError:  # (as prune() itself says it)
            raise InvalidInputError(
                f"older_than {args.older_than!r} reaches before year 1; give a shorter duration"
            ) from None
        stale: list[ChatInfo] = []
        after: str | None = None
        while True:
            page = await store.list_chats(user_id=args.user, limit=_PAGE, after=after)
            stale.extend(chat for chat in page if chat.updated_at < cutoff)
            if len(page) < _PAGE:
                break
            after = page[-1].cursor
    _report(args, env, cutoff, stale)
    return EXIT_OK


def _report(
    args: argparse.Namespace,
    env: Env,
    cutoff: datetime,
    chats: list[ChatInfo],
    report: PruneReport | None = None,
) -> None:
    out = env.out
    if args.json:
        done = {} if report is None else {
            "deleted": report.deleted, "pruned_at": report.pruned_at.isoformat()
        }  # fmt: skip
        out.json(
            {
                "dry_run": args.dry_run,
                "older_than": cutoff.isoformat(),
                "chats": [chat.model_dump(mode="json") for chat in chats],
                **done,
            }
        )
        return
    verb = "would delete" if args.dry_run else "deleted"
    out.line(
        f"{verb} {count(len(chats), 'chat')} with no activity since {cutoff.isoformat()}",
        style="yellow" if args.dry_run else "green",
    )
    if chats:
        out.table(
            ["id", "user", "title", "messages", "last activity"],
            [
                [c.id, c.user_id, c.title or "", str(c.message_count), c.updated_at.isoformat()]
                for c in chats
            ],
            numeric=("messages",),
            whole=("id", "user"),
        )
