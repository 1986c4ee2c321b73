"""Reading commands: `chats`, `show`, `search` and `mermaid`."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from typing import Any

from agentcontext.cli._common import EXIT_OK, Env, open_store
from agentcontext.cli._output import count
from agentcontext.cli._transcript import load_transcript, print_transcript
from agentcontext.errors import ChatNotFoundError, InvalidInputError
from agentcontext.store import Chat, SqlContextStore
from agentcontext.store.records import Graph, GraphOutline
from agentcontext.views import DEFAULT_DEPTH, DEFAULT_FOLD, graph_to_mermaid, visualize_graph

__all__ = [
    "add_json",
    "meta_filter",
    "non_negative",
    "positive",
    "register",
    "require_chat",
    "when",
]

_INT = re.compile(r"[+-]?\d+")
ROLES = ("system", "user", "assistant")


def meta_filter(text: str) -> tuple[str, str | int | bool]:
    """Parse ``key=value``: ``true``/``false`` become bools, integers ints, ``"..."`` a str."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return key, value[1:-1]
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    if _INT.fullmatch(value):
        return key, int(value)
    return key, value


def non_negative(text: str) -> int:
    """An int >= 0 for argparse."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {number}")
    return number


def positive(text: str) -> int:
    """An int >= 1 for argparse."""
    number = non_negative(text)
    if number == 0:
        raise argparse.ArgumentTypeError("must be 1 or more, got 0")
    return number


def add_json(parser: argparse.ArgumentParser) -> None:
    """Add `--json`: print the result as JSON with full ids and every field."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON (full ids, every field) instead of a table, for programs",
    )


def add_view_options(parser: argparse.ArgumentParser, *, depth: bool) -> None:
    """``--fold``, ``--last`` and (for the tree) ``--depth``: how much of a graph to draw."""
    parser.add_argument(
        "--fold",
        type=non_negative,
        default=DEFAULT_FOLD,
        metavar="N",
        help=f"fold runs of N or more plain messages into one line (default {DEFAULT_FOLD}; "
        "0: never)",
    )
    parser.add_argument(
        "--last",
        type=positive,
        metavar="N",
        help="draw only the newest N messages (default: all"
        + (")" if depth else " that fit under Mermaid's text limit)"),
    )
    if depth:
        parser.add_argument(
            "--depth",
            type=non_negative,
            default=DEFAULT_DEPTH,
            metavar="N",
            help=f"summarise side branches nested deeper than N (default {DEFAULT_DEPTH})",
        )


CHATS_PAGE = 50
"""Chats `agentcontext chats` lists unless told otherwise."""


def register(commands: Any) -> None:
    """Add ``chats``, ``show``, ``search`` and ``mermaid`` to the command parsers."""
    chats = commands.add_parser(
        "chats",
        help="list chats as a table, newest activity first",
        description="List chats (id, title, messages, branches, last activity), newest "
        f"activity first: {CHATS_PAGE} at a time unless --limit or --all says otherwise; the "
        "line after the table says how to see the next ones (--after CURSOR). Values of --meta "
        "are read as int or bool when they look like one (n=3, flag=true); quote them to keep "
        "a string (n='\"3\"').",
    )
    chats.add_argument("--user", metavar="USER", help="only this user's chats (default: all)")
    chats.add_argument(
        "--meta",
        metavar="KEY=VALUE",
        action="append",
        type=meta_filter,
        default=[],
        help="only chats whose metadata has KEY equal to VALUE (repeatable; all must match)",
    )
    many = chats.add_mutually_exclusive_group()
    many.add_argument(
        "--limit", type=positive, metavar="N", help=f"at most N chats (default {CHATS_PAGE})"
    )
    many.add_argument("--all", action="store_true", help="every chat, however many")
    chats.add_argument("--offset", type=non_negative, default=0, metavar="N", help="skip N")
    chats.add_argument(
        "--after",
        metavar="CURSOR",
        help="the chats after this one in the list (the cursor the previous page printed)",
    )
    add_json(chats)
    chats.set_defaults(handler=_chats)

    show = commands.add_parser(
        "show",
        help="show a chat's message graph as a tree, or one branch as a transcript",
        description="Show a chat: its message graph as a tree (the active branch marked *, "
        "checkpoints in braces; a linear run stays at one indent, runs of plain messages fold "
        "into '… N messages', tool calls read 'tool name(args) → result'), then its branches "
        "and checkpoints. With --branch or --full, "
        "show one branch as a transcript instead, oldest message first: tool calls with their "
        "input and output, text inserted by reminders wrapped in [reminder]...[/reminder], "
        "and compaction summaries after the last message they fold.",
    )
    show.add_argument("chat", metavar="CHAT", help="the chat id")
    show.add_argument(
        "--branch",
        metavar="BRANCH",
        help="show this branch as a transcript (with --full alone: the active branch)",
    )
    show.add_argument(
        "--full",
        action="store_true",
        help="the transcript with whole texts (default: one shortened line per part)",
    )
    add_view_options(show, depth=True)
    add_json(show)
    show.set_defaults(handler=_show)

    search = commands.add_parser(
        "search",
        help="full-text search in a chat, or in all of a user's chats",
        description="Search message text on every branch of CHAT, best match first. With "
        "--user and no CHAT, search all of that user's chats. QUERY is plain text: every word "
        "must occur.",
    )
    search.add_argument("chat", nargs="?", metavar="CHAT", help="the chat id (omit with --user)")
    search.add_argument("query", metavar="QUERY", help="the words to find")
    search.add_argument("--user", metavar="USER", help="search all chats of USER")
    search.add_argument(
        "--role",
        action="append",
        choices=ROLES,
        metavar="ROLE",
        help="only messages of this role: system, user or assistant (repeatable)",
    )
    search.add_argument(
        "--limit", type=positive, default=20, metavar="N", help="at most N hits (default 20)"
    )
    add_json(search)
    search.set_defaults(handler=_search)

    mermaid = commands.add_parser(
        "mermaid",
        help="print a chat's graph as a Mermaid flowchart",
        description="Print a chat's message graph as a Mermaid flowchart, for Markdown or "
        "the Mermaid live editor. Long runs of plain messages fold into one node, and the "
        "chart always stays under Mermaid's default text limit (50 000 characters): when the "
        "chat is too big, only its newest messages are drawn and the first node says how many "
        "were left out.",
    )
    mermaid.add_argument("chat", metavar="CHAT", help="the chat id")
    add_view_options(mermaid, depth=False)
    mermaid.set_defaults(handler=_mermaid)


def when(value: datetime, rich: bool) -> str:
    """A timestamp: readable on a terminal, ISO 8601 when piped."""
    if rich:
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return value.isoformat()


async def require_chat(store: SqlContextStore, chat_id: str) -> Chat:
    chat = await store.get_chat(chat_id)
    if chat is None:
        raise ChatNotFoundError(f"chat {chat_id!r} does not exist")
    return chat


async def _chats(args: argparse.Namespace, env: Env) -> int:
    limit = None if args.all else CHATS_PAGE if args.limit is None else args.limit
    async with open_store(env) as store:
        chats = await store.list_chats(
            user_id=args.user,
            metadata=dict(args.meta) or None,
            limit=None if limit is None else limit + 1,  # one more: are there more?
            offset=args.offset,
            after=args.after,
        )
    more = limit is not None and len(chats) > limit
    if more:
        chats = chats[:limit]
    if args.json:
        env.out.json([{**chat.model_dump(mode="json"), "cursor": chat.cursor} for chat in chats])
        return EXIT_OK
    columns = ["id", "title", "messages", "branches", "last activity"]
    if args.user is None:
        columns.insert(1, "user")
    rows = []
    for chat in chats:
        row = [chat.id, chat.title or "", str(chat.message_count), str(chat.branch_count)]
        row.append(when(chat.updated_at, env.out.rich))
        if args.user is None:
            row.insert(1, chat.user_id)
        rows.append(row)
    env.out.table(columns, rows, numeric=("messages", "branches"), whole=("id", "user"))
    if more:
        words = ["chats"]
        if args.user is not None:
            words += ["--user", args.user]
        for key, value in args.meta:
            shown = json.dumps(value)
            words += ["--meta", f"{key}={shown}"]
        if args.limit is not None:
            words += ["--limit", str(args.limit)]
        words += ["--after", chats[-1].cursor]
        hint = f"More chats: {env.command(*words)} (or --all for every chat)"
        if env.out.terminal:
            env.out.line(hint, style="yellow")
        else:  # standard output stays a table a program can read
            sys.stderr.write(hint + "\n")
    return EXIT_OK


async def _show(args: argparse.Namespace, env: Env) -> int:
    async with open_store(env) as store:
        chat = await require_chat(store, args.chat)
        if args.branch is not None or args.full:
            transcript = await load_transcript(store, chat, args.branch)
            if args.json:
                env.out.json(transcript.to_json())
            else:
                print_transcript(env.out, transcript, full=args.full)
            return EXIT_OK
        if args.json:
            full = await store.get_graph(args.chat)
            env.out.json({"chat": chat.model_dump(mode="json"), **full.model_dump(mode="json")})
            return EXIT_OK
        graph = await _graph(store, args)
    out = env.out
    title = f" · {chat.title}" if chat.title else ""
    total = graph.message_count if isinstance(graph, GraphOutline) else len(graph.nodes)
    counts = (
        count(total, "message"),
        count(len(graph.branches), "branch"),
        count(len(graph.checkpoints), "checkpoint"),
    )
    out.line(f"chat {chat.id} · user {chat.user_id}{title} · {' · '.join(counts)}", style="bold")
    out.line()
    out.graph_tree(visualize_graph(graph, fold=args.fold, depth=args.depth, last=args.last))
    out.heading("Branches")
    out.table(
        ["branch", "active", "head", "messages", "created"],
        [
            [
                branch.name,
                "*" if branch.is_active else "",
                branch.head_message_id or "",
                str(branch.message_count),
                when(branch.created_at, out.rich),
            ]
            for branch in graph.branches
        ],
        numeric=("messages",),
        whole=("branch", "head"),
    )
    out.heading("Checkpoints")
    out.table(
        ["checkpoint", "message", "created"],
        [
            [point.name, point.message_id, when(point.created_at, out.rich)]
            for point in graph.checkpoints
        ],
        whole=("checkpoint", "message"),
    )
    return EXIT_OK


async def _search(args: argparse.Namespace, env: Env) -> int:
    if args.chat is None and args.user is None:
        raise InvalidInputError(
            "search needs a CHAT, or --user USER to search all of a user's chats"
        )
    async with open_store(env) as store:
        if args.chat is None:
            hits = await store.search_user_messages(
                args.user, args.query, roles=args.role, limit=args.limit
            )
        else:
            chat = await require_chat(store, args.chat)
            if args.user is not None and chat.user_id != args.user:
                raise ChatNotFoundError(f"user {args.user!r} has no chat {args.chat!r}")
            hits = await store.search_messages(
                args.chat, args.query, roles=args.role, limit=args.limit
            )
    if args.json:
        env.out.json(
            [
                {
                    "chat_id": hit.chat_id,
                    **hit.model_dump(mode="json", exclude={"message"}),
                    "message": hit.message.model_dump(mode="json"),
                }
                for hit in hits
            ]
        )
        return EXIT_OK
    columns = ["chat", "message", "role", "rank", "snippet"]
    rows = [
        [hit.chat_id, hit.message.id, hit.message.name, f"{hit.rank:.4g}", hit.snippet]
        for hit in hits
    ]
    env.out.table(columns, rows, numeric=("rank",), whole=("chat", "message"))
    if env.out.rich:
        env.out.line(count(len(rows), "match"), style="dim")
    return EXIT_OK


async def _graph(store: SqlContextStore, args: argparse.Namespace) -> Graph | GraphOutline:
    """What a tree or chart needs: the outline the store folds (a long chat is never loaded
    whole), or the whole graph when every message may be drawn (--fold 0 or 1, --last)."""
    if args.last is None and args.fold >= 2:
        return await store.graph_outline(args.chat, fold=args.fold)
    return await store.get_graph(args.chat)


async def _mermaid(args: argparse.Namespace, env: Env) -> int:
    async with open_store(env) as store:
        await require_chat(store, args.chat)
        graph = await _graph(store, args)
    env.out.raw(graph_to_mermaid(graph, fold=args.fold, last=args.last) + "\n")
    return EXIT_OK
