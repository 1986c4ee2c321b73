"""`branches CHAT`: a chat's branches with their heads and lengths."""

from __future__ import annotations

import argparse
from typing import Any

from agentcontext.cli._browse import add_json, require_chat, when
from agentcontext.cli._common import EXIT_OK, Env, open_store

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add `branches` to the command parsers."""
    branches = commands.add_parser(
        "branches",
        help="list a chat's branches (the active one marked *)",
        description="List the branches of CHAT, oldest first: name, active mark, head "
        "message id, number of messages on the branch and creation time. Show one with "
        "'agentcontext show CHAT --branch NAME'.",
    )
    branches.add_argument("chat", metavar="CHAT", help="the chat id")
    add_json(branches)
    branches.set_defaults(handler=_branches)


async def _branches(args: argparse.Namespace, env: Env) -> int:
    async with open_store(env) as store:
        await require_chat(store, args.chat)
        found = await store.list_branches(args.chat)
    if args.json:
        env.out.json([branch.model_dump(mode="json") for branch in found])
        return EXIT_OK
    env.out.table(
        ["branch", "active", "head", "messages", "created"],
        [
            [
                b.name,
                "*" if b.is_active else "",
                b.head_message_id or "",
                str(b.message_count),
                when(b.created_at, env.out.rich),
            ]
            for b in found
        ],
        numeric=("messages",),
        whole=("branch", "head"),
    )
    return EXIT_OK
