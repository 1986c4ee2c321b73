"""Search through scoped search terms (PostgreSQL's, and SQLite's FTS5 text): the terms are a
stable part of the on-disk format, each token's terms differ from scope to scope, the GIN index
serves the candidate query whatever the planner would guess, and revisions 0008 and 0010 fill
the column (0008's CRC-32 token hashes, kept for its downgrade, are pinned too)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Connection, column, select, table, text

from agentcontext.store import MessageRecord, SqlContextStore
from agentcontext.store._db import migrate as _migrate
from agentcontext.store._db.schema import SEARCH_HASHES_INDEX
from agentcontext.store._dialects import sqlite as _sqlite
from agentcontext.store._dialects.postgresql import PostgresDialect, int4_terms, terms_text
from agentcontext.store._rows import text as _text
from agentcontext.store._rows import tokenizer as _tokenizer
from agentcontext.store._rows.terms import mask, message_terms, query_terms, token_hashes
from tests.conftest import fresh_pg_database, require_postgres

INT4 = range(-(2**31), 2**31)

TOKENS = st.text(min_size=1, max_size=20).filter(lambda s: _tokenizer.tokens(s) == [s])


@given(st.text(max_size=40))
def test_a_token_hash_is_the_crc32_of_its_utf8_moved_into_int4(token: str) -> None:
    value = _tokenizer.token_hash(token)
    assert value in INT4
    assert value == zlib.crc32(token.encode("utf-8")) - 2**31


@given(st.lists(st.lists(TOKENS, max_size=8), max_size=6), st.integers(min_value=0, max_value=10))
def test_token_hashes_are_the_same_when_the_remembered_ones_are_forgotten(
    batches: list[list[str]], bound: int
) -> None:
    """Hashes are remembered per token; past a bound the memory starts afresh, and no array
    changes: each is what the tokens' own hashes give."""
    saved = _tokenizer._HASHED_AT_MOST, _tokenizer._hashed
    _tokenizer._HASHED_AT_MOST, _tokenizer._hashed = bound, {}
    try:
        for tokens in batches + batches:
            assert _tokenizer.token_hashes(tokens) == sorted(
                {zlib.crc32(token.encode()) - 2**31 for token in tokens}
            )
            assert len(_tokenizer._hashed) <= max([bound, *map(len, map(set, batches))])
    finally:
        _tokenizer._HASHED_AT_MOST, _tokenizer._hashed = saved


@given(st.lists(TOKENS, max_size=30))
def test_token_hashes_are_distinct_ascending_and_in_int4(tokens: list[str]) -> None:
    hashes = _tokenizer.token_hashes(tokens)
    assert hashes == sorted({_tokenizer.token_hash(token) for token in tokens})
    assert all(value in INT4 for value in hashes)
    assert _tokenizer.token_hashes(list(reversed(tokens)) + tokens) == hashes


@given(st.lists(TOKENS, max_size=30), st.text(min_size=1, max_size=8), st.text(min_size=1))
def test_a_message_is_indexed_under_its_chat_and_its_user(
    tokens: list[str], chat_id: str, user_id: str
) -> None:
    """Each distinct token gives one term under the chat's mask and one under the user's; a
    query of the chat (or of the user) looks for exactly those, in int4."""
    terms = int4_terms(message_terms(tokens, chat_id, user_id))
    distinct = len(set(tokens))
    assert len(terms) == 2 * distinct
    assert all(value in INT4 for value in terms)
    dialect = PostgresDialect()
    for kind, scope in (("chat", chat_id), ("user", user_id)):
        wanted = dialect.search_params(*query_terms(tokens, kind, scope))["query_hashes"]
        assert set(wanted) <= set(terms)
        assert len(set(wanted)) <= distinct
    literal = terms_text(message_terms(tokens, chat_id, user_id))
    if tokens:
        assert literal is not None
        assert [int(part) for part in literal.strip("{}").split(",")] == terms
    else:
        assert literal is None


def test_a_token_has_other_terms_in_other_scopes() -> None:
    words = [f"word{i}" for i in range(500)]
    a = set(int4_terms(message_terms(words, "chat-a", "user-1")))
    b = set(int4_terms(message_terms(words, "chat-b", "user-2")))
    assert not a & b  # 2 000 int4 values: a collision would be a 1-in-a-thousand event
    assert mask("chat", "x") != mask("user", "x")


def test_the_terms_are_fixed_across_releases() -> None:
    # The on-disk format: these values are stored in databases and must never change.
    assert token_hashes(["zebracorn"]) == [0x714E56C15A20E3B4]
    assert mask("chat", "c1") == 0x52C4D5FE32ECBC8E
    assert int4_terms(message_terms(["zebracorn"], "c1", "u1")) == [1262935045, 1797485571]


def test_the_sqlite_terms_are_fixed_across_releases() -> None:
    # The on-disk format: a contentless FTS5 table forgets a row only given this exact text.
    assert _sqlite.fts_terms(message_terms(["zebracorn", "café", "a"], "c1", "u1")) == (
        "52c4d5fe3f39a75a7d43 52c4d5fe4c8e7721cbe7 52c4d5fe714e56c15a20 "
        "f6bef0db3f39a75a7d43 f6bef0db4c8e7721cbe7 f6bef0db714e56c15a20"
    )
    assert _sqlite.fts_terms(message_terms([], "c1", "u1")) == ""


@given(
    st.lists(st.lists(TOKENS, max_size=8), max_size=6),
    st.text(min_size=1, max_size=8),
    st.integers(min_value=0, max_value=10),
)
def test_sqlite_terms_are_the_same_when_the_remembered_digits_are_forgotten(
    batches: list[list[str]], chat_id: str, bound: int
) -> None:
    """Each hash's hex digits are remembered; past a bound the memory starts afresh, and no
    message's terms change: each is its chat's, then its user's, prefix before every hash."""
    saved = _sqlite._HEXES_AT_MOST, _sqlite._hexes
    _sqlite._HEXES_AT_MOST, _sqlite._hexes = bound, {}
    try:
        for tokens in batches + batches:
            terms = message_terms(tokens, chat_id, "user-1")
            chat, user = f"{terms.chat:016x}"[:8], f"{terms.user:016x}"[:8]
            digits = [f"{value:016x}"[:12] for value in terms.hashes]
            expected = " ".join([chat + d for d in digits] + [user + d for d in digits])
            assert _sqlite.fts_terms(terms) == expected
            assert len(_sqlite._hexes) <= max([bound, *map(len, map(set, batches))])
    finally:
        _sqlite._HEXES_AT_MOST, _sqlite._hexes = saved


def test_the_hash_is_fixed_across_processes_and_releases() -> None:
    # The on-disk format: these values are stored in databases and must never change.
    pinned = {"zebracorn": 939908890 - 2**31, "café": 2561491637 - 2**31}
    assert {token: _tokenizer.token_hash(token) for token in pinned} == pinned
    assert _tokenizer.token_hash("") == -(2**31)
    code = (
        "from agentcontext.store._rows import tokenizer; print(tokenizer.token_hash('zebracorn'))"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert int(out.stdout) == pinned["zebracorn"]


def _record(i: int, words: str) -> MessageRecord:
    return MessageRecord(
        id=f"m{i}",
        chat_id="big",
        parent_id=None,
        name="user" if i % 2 else "assistant",
        data={"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": words}]},
    )


def _plan(conn: Connection, word: str = "zebracorn", scope: str = "chat") -> str:
    dialect = PostgresDialect()
    statement = dialect.search_candidates(scope, False)  # type: ignore[arg-type]
    compiled = statement.compile(dialect=conn.dialect)
    params = compiled.construct_params(
        {
            "scope_id": "big" if scope == "chat" else "u",
            "search_limit": 200,
            "before_seq": 2**62,
            **dialect.search_params(*query_terms([word], scope, "big" if scope == "chat" else "u")),
        }
    )
    assert compiled.positiontup is not None
    explain = "EXPLAIN " + compiled.string
    with conn.begin():
        dialect.prepare_search(conn, scope, "big" if scope == "chat" else "u")  # type: ignore[arg-type]
        rows = conn.exec_driver_sql(explain, tuple(params[name] for name in compiled.positiontup))
        return "\n".join(row[0] for row in rows)


@pytest.fixture
def pg_url() -> Iterator[str]:
    require_postgres()
    with fresh_pg_database("achash") as url:
        yield url


async def test_the_candidate_query_reads_the_gin_index(pg_url: str) -> None:
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "you",
        "that",
        "it",
        "he",
        "was",
        "for",
        "on",
        "are",
        "as",
        "with",
        "his",
        "they",
        "at",
        "be",
    ]
    records = []
    for i in range(20_000):
        chosen = [words[(i * 7 + k * 3) % len(words)] for k in range(12)]
        if i % 1000 == 0:
            chosen.insert(5, "zebracorn")
        records.append(_record(i, " ".join(chosen)))
    async with SqlContextStore(pg_url) as store:
        await store.create_chat("big", user_id="u")
        for start in range(0, len(records), 5000):
            await store.add_messages(records[start : start + 5000])
        async with store.engine.connect() as conn:
            await conn.execute(text("ANALYZE messages"))
            await conn.commit()
            for word in ("zebracorn", "the"):  # rare or common: the scope's GIN entries
                for scope in ("chat", "user"):
                    plan = await conn.run_sync(_plan, word, scope)
                    assert SEARCH_HASHES_INDEX in plan, plan
                    assert "Index Scan Backward" not in plan, plan
        found = await store.search_messages("big", "zebracorn", limit=100)
        assert sorted(r.message.id for r in found) == sorted(
            f"m{i}" for i in range(0, 20_000, 1000)
        )
        # A common word is found too (whatever plan the statistics choose).
        assert len(await store.search_messages("big", "the", limit=30)) == 30


def _stored(conn: Connection, name: str) -> dict[str, Any]:
    raw = table("messages", column("id"), column(name))
    rows = conn.execute(select(raw.c.id, raw.c[name]).order_by(raw.c.id)).all()
    return {row[0]: row[1] for row in rows}


async def test_revisions_0008_and_0010_fill_the_terms_and_their_downgrades_the_signatures(
    pg_url: str,
) -> None:
    texts = ["alpha beta", "", "Gamma, DELTA! café", "beta beta alpha", "日本語 text"]
    async with SqlContextStore(pg_url) as store:
        await store.create_chat("big", user_id="u")
        await store.add_messages([_record(i, words) for i, words in enumerate(texts)])
        before = {q: await store.search_messages("big", q) for q in ("alpha", "cafe", "日本", "z")}
        engine = store.engine
        await _migrate.run_in_write_transaction(
            engine, lambda c: _migrate.downgrade_in_transaction(c, "0007")
        )
        async with engine.connect() as conn:
            signatures = await conn.run_sync(_stored, "search_sig")
        assert {key for key, value in signatures.items() if value is None} == {"m1"}
        await _migrate.run_in_write_transaction(engine, _migrate.upgrade_in_transaction)
        async with engine.connect() as conn:
            hashes = await conn.run_sync(_stored, "search_hashes")
        expected = {
            f"m{i}": int4_terms(message_terms(_text.index_tokens(_record(i, t).data), "big", "u"))
            or None
            for i, t in enumerate(texts)
        }
        assert hashes == expected
        after = {q: await store.search_messages("big", q) for q in before}
        assert after == before
        assert [r.message.id for r in after["alpha"]] == ["m0", "m3"]


async def test_a_search_plans_for_its_values_in_its_own_transaction_only(pg_url: str) -> None:
    async with SqlContextStore(pg_url) as store:
        db = store.db
        show = text("SELECT current_setting('plan_cache_mode')")

        def inside(conn: Connection) -> str:
            db.dialect.prepare_search(conn, "chat", "none")
            return str(conn.execute(show).scalar_one())

        def after(conn: Connection) -> str:
            return str(conn.execute(show).scalar_one())

        assert db.dialect.search_mode == "snapshot"
        assert await db.run(db.dialect.search_mode, inside) == "force_custom_plan"
        # The setting ends with the search's transaction: the pooled connection is as before.
        for _ in range(3):
            assert await db.run("read", after) == "auto"
