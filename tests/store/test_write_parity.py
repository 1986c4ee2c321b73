"""The write rules of a save exist in several forms, for speed: the Python path
(``_messages.write`` under ``_branches.append``, a write transaction), SQLite's INSTEAD OF
trigger (migration 0010), PostgreSQL's single statement (``_dialects.postgresql``), and
MariaDB's compound statement beside the statements MySQL runs one by one
(``_dialects.mysql``). They must write identical rows: messages (parent, depth, version, name,
type, data), the chat's counts and version, the branch head and its depth, and the search
entries.

Two chats of the same shape get the same turns, one through the single-statement append, the
other through the Python path; every row is compared with the chat's prefix taken off the ids.
And the trigger of a migrated SQLite database is the canonical text the code holds.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._db.database import unit
from agentcontext.store._db.schema import branches as B
from agentcontext.store._db.schema import chats as C
from agentcontext.store._db.schema import messages as M
from agentcontext.store._dialects.postgresql import int4_terms
from agentcontext.store._dialects.sqlite import APPEND_TRIGGER, APPEND_VIEW
from agentcontext.store._ops import appends as _appends
from agentcontext.store._ops import branches as _branches
from agentcontext.store._rows.terms import message_terms
from agentcontext.store._rows.text import index_tokens

EXAMPLES = itertools.count()
WORDS = st.sampled_from(["fox", "den", "Éclair", "naïve", "東京", "3.14", "a_b", "user@x.io"])


def record(
    chat: str, suffix: str, parent: str | None, role: str, words: list[str]
) -> MessageRecord:
    message_id = f"{chat}-{suffix}"
    return MessageRecord(
        id=message_id,
        chat_id=chat,
        parent_id=None if parent is None else f"{chat}-{parent}",
        name=role,
        data={"id": message_id, "role": role, "parts": [{"type": "text", "text": " ".join(words)}]},
    )


def strip(chat: str, value: Any) -> Any:
    """A value with the chat's prefix taken off every id in it."""
    return json.loads(json.dumps(value, default=str).replace(f"{chat}-", ""))


async def picture(store: SqlContextStore, chat: str, words: set[str]) -> dict[str, Any]:
    async with store.engine.connect() as conn:
        chat_row = (
            await conn.execute(select(C.c.message_count, C.c.version).where(C.c.id == chat))
        ).one()
        branch_row = (
            await conn.execute(
                select(B.c.head_message_id, B.c.head_depth).where(B.c.chat_id == chat)
            )
        ).one()
        columns = [M.c.id, M.c.parent_id, M.c.depth, M.c.version, M.c.name, M.c.type, M.c.data]
        if store.dialect_name == "postgresql":
            columns.append(M.c.search_hashes)
        rows = (
            await conn.execute(select(*columns).where(M.c.chat_id == chat).order_by(M.c.seq))
        ).all()
    hits = {
        word: sorted(r.message.id for r in await store.search_messages(chat, word, limit=100))
        for word in sorted(words)
    }
    messages = [list(row) for row in rows]
    if store.dialect_name == "postgresql":
        # Each chat's terms are its own (scoped to it): what is compared is that both forms
        # store exactly the terms the one conversion makes for the row in its chat.
        for row in messages:
            expected = int4_terms(message_terms(index_tokens(row[6]), chat, "u")) or None
            row[7] = row[7] == expected
    return strip(
        chat,
        {
            "chat": list(chat_row),
            "branch": list(branch_row),
            "messages": messages,
            "search": hits,
        },
    )


async def setup(store: SqlContextStore, chat: str) -> str:
    await store.create_chat(chat, user_id="u")
    branch = await store.get_active_branch(chat)
    assert branch is not None
    return branch.id


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    turns=st.lists(
        st.lists(st.lists(WORDS, max_size=6), min_size=1, max_size=3), min_size=1, max_size=4
    )
)
@pytest.mark.parametrize("compound", [True, False], ids=["compound", "one-by-one"])
async def test_the_single_statement_and_the_python_path_write_the_same_rows(
    store: SqlContextStore, backend: str, compound: bool, turns: list[list[list[str]]]
) -> None:
    dialect = store.db.dialect
    if not compound:
        if backend != "mariadb":
            pytest.skip("the statements of an append one by one are MySQL's (and MariaDB's)")
        dialect.compound_append = False  # type: ignore[attr-defined]
    tag = f"p{next(EXAMPLES)}"
    fast, slow = f"{tag}f", f"{tag}s"
    fast_branch, slow_branch = await setup(store, fast), await setup(store, slow)
    head: str | None = None
    words: set[str] = set()
    for t, turn in enumerate(turns):
        chain: list[tuple[str, str | None, str, list[str]]] = []
        parent = head
        for m, message_words in enumerate(turn):
            suffix = f"t{t}m{m}"
            chain.append((suffix, parent, "user" if m % 2 == 0 else "assistant", message_words))
            parent = suffix
            words.update(w.lower() for w in message_words)
        fast_records = [record(fast, s, p, role, w) for s, p, role, w in chain]
        slow_records = [record(slow, s, p, role, w) for s, p, role, w in chain]
        expected = None if head is None else f"{{chat}}-{head}"
        done = await store.append_turn(
            fast_branch, fast_records, expected_head=None if head is None else f"{fast}-{head}"
        )
        assert done.ok
        # The Python path, as the general append runs it for a turn with in-place updates.
        general = await store.db.run(
            "write",
            unit(
                _branches.append,
                dialect,
                slow_branch,
                slow_records,
                None if expected is None else expected.format(chat=slow),
                slow_records[-1].id,
                set(),
            ),
        )
        assert general.ok
        head = chain[-1][0]
    assert _appends.is_plain(fast_records, fast_records[0].parent_id, fast_records[-1].id, None)
    assert await picture(store, fast, words) == await picture(store, slow, words)


async def test_a_migrated_sqlite_database_holds_the_canonical_append_trigger(
    store: SqlContextStore, backend: str
) -> None:
    if backend != "sqlite":
        pytest.skip("the append trigger is SQLite's")
    await store.initialize()
    async with store.engine.connect() as conn:
        found = dict(
            (await conn.execute(
                text("SELECT name, sql FROM sqlite_master WHERE name IN "
                     "('message_appends', 'message_appends_insert')")
            )).all()
        )  # fmt: skip

    def flat(sql: str) -> str:
        return " ".join(sql.split())

    assert flat(found["message_appends_insert"]) == flat(APPEND_TRIGGER)
    assert flat(found["message_appends"]) == flat(APPEND_VIEW)
