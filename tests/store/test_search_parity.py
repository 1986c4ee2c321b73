"""Search has one meaning on every backend (DESIGN.md §3.11).

Generated texts and queries (words, e-mail addresses, URLs, paths, decimals, mixed scripts and
case, diacritics, punctuation) must give the same message ids, in the same order, with the
same ranks and snippets, on SQLite and on PostgreSQL. ``AGENTCONTEXT_PARITY_EXAMPLES`` runs
more examples than CI does.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcontext import SqlContextStore
from agentcontext.store import MessageRecord
from tests.conftest import require_mariadb, require_postgres, session_url

EXAMPLES = int(os.environ.get("AGENTCONTEXT_PARITY_EXAMPLES", "60"))

WORDS = [
    "fox",
    "Fox",
    "FOX",
    "den",
    "istanbul",
    "İstanbul",
    "ISTANBUL",
    "café",
    "cafe",
    "CAFÉ",
    "straße",
    "strasse",
    "naïve",
    "Ångström",
    "Ελλάδα",
    "ελλαδα",
    "Москва",
    "москва",
    "日本語",
    "東京",
    "テスト",
    "한국어",
    "مرحبا",
    "שלום",
    "हिन्दी",
    "ﬁle",
    "\uff26\uff4f\uff4f",  # fullwidth Foo
    "½",
    "x²",
    "3.14159",
    "42",
    "v2.1.0",
    "foo.bar@example.com",
    "Foo.Bar@Example.COM",
    "https://example.com/a?b=c#d",
    "example.com",
    "/usr/local/bin",
    "C:\\Users\\me",
    "snake_case",
    "kebab-case",
    "CamelCase",
    "e.g.",
    "don't",
    "rock'n'roll",
    "#hashtag",
    "@mention",
    "$100",
    "50%",
    "(parens)",
    "[x]",
    "***",
    "--",
    '"quoted"',
    "NEAR",
    "AND",
    "OR",
    "NOT",
    "*",
    "^",
    ":",
    "🙂",
    "🦊",
]

sentence = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)
query = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
    st.text(min_size=1, max_size=20).filter(
        lambda t: "\x00" not in t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)
    ),
)


@pytest.fixture
def stores(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[asyncio.Runner, list[SqlContextStore]]]:
    """SQLite, PostgreSQL and MariaDB stores."""
    require_postgres()
    require_mariadb()
    runner = asyncio.Runner()
    made = [
        SqlContextStore(f"sqlite+aiosqlite:///{tmp_path / 'parity.db'}"),
        SqlContextStore(session_url("postgres", request)),
        SqlContextStore(session_url("mariadb", request)),
    ]
    yield runner, made
    for store in made:
        runner.run(store.close())
    runner.close()


async def _fill(store: SqlContextStore, chat: str, texts: list[str], roles: list[str]) -> None:
    await store.create_chat(chat, user_id="u")
    parent = None
    records = []
    for i, (body, role) in enumerate(zip(texts, roles, strict=True)):
        message_id = f"{chat}-{i}"
        records.append(
            MessageRecord(
                id=message_id,
                chat_id=chat,
                parent_id=parent,
                name=role,
                data={"id": message_id, "role": role, "parts": [{"type": "text", "text": body}]},
            )
        )
        parent = message_id
    await store.add_messages(records)


def _view(results: list) -> list[tuple[str, float, str]]:  # type: ignore[type-arg]
    return [(r.message.id, round(r.rank, 9), r.snippet) for r in results]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    texts=st.lists(sentence, min_size=1, max_size=12),
    queries=st.lists(query, min_size=1, max_size=4),
    role_filter=st.sampled_from([None, ["user"], ["assistant", "user"]]),
    data=st.data(),
)
def test_every_backend_finds_the_same_messages_in_the_same_order(
    stores: tuple[asyncio.Runner, list[SqlContextStore]],
    texts: list[str],
    queries: list[str],
    role_filter: list[str] | None,
    data: st.DataObject,
) -> None:
    runner, made = stores
    roles = data.draw(
        st.lists(st.sampled_from(["user", "assistant"]), min_size=len(texts), max_size=len(texts))
    )
    chat = f"parity-{uuid.uuid4().hex[:10]}"
    for store in made:
        runner.run(_fill(store, chat, texts, roles))
    for text in queries:
        for limit in (3, 20):
            found = [
                _view(runner.run(store.search_messages(chat, text, roles=role_filter, limit=limit)))
                for store in made
            ]
            assert found[1] == found[0], f"query {text!r} differs between SQLite and PostgreSQL"
            assert found[2] == found[0], f"query {text!r} differs between SQLite and MariaDB"
        user_wide = [
            [r.message.id for r in runner.run(store.search_user_messages("u", text, limit=50))]
            for store in made
        ]
        assert user_wide[1] == user_wide[0] and user_wide[2] == user_wide[0]


@pytest.mark.parametrize(
    ("stored", "searched"),
    [
        ("write to foo.bar@example.com today", "foo.bar@example.com"),
        ("write to foo.bar@example.com today", "example"),
        ("the value is 3.14159 exactly", "3.14159"),
        ("installed in /usr/local/bin now", "/usr/local/bin"),
        ("installed in /usr/local/bin now", "usr"),
        ("see https://example.com/path?x=1 for more", "https://example.com/path?x=1"),
        ("see https://example.com/path?x=1 for more", "example"),
        ("a trip to İstanbul", "istanbul"),
        ("a trip to istanbul", "İSTANBUL"),
        ("un café crème", "cafe creme"),
        ("<script>window.__pwned = 1</script> hello", "pwned"),
    ],
)
def test_the_probes_that_used_to_disagree(
    stores: tuple[asyncio.Runner, list[SqlContextStore]], stored: str, searched: str
) -> None:
    runner, made = stores
    chat = f"probe-{uuid.uuid4().hex[:10]}"
    for store in made:
        runner.run(_fill(store, chat, [stored, "something else entirely"], ["user", "user"]))
        hits = runner.run(store.search_messages(chat, searched))
        assert [h.message.id for h in hits] == [f"{chat}-0"], (store.dialect_name, searched)
        assert "<mark>" in hits[0].snippet
