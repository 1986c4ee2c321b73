"""Hostile input: a catalogue of bad inputs, each tried on SQLite and on PostgreSQL.

Every entry of :data:`CATALOGUE` is one kind of bad input, fed through the public API (the
engine and the store, in every place it can go). For an entry with an ``error``, each attempt
must:

- raise that :class:`~agentcontext.ContextError` subclass (never a raw sqlite3, asyncpg,
  SQLAlchemy, pydantic or Python error), with a message that names the problem and says what
  to do (``says``);
- leave the database unchanged: every table, row for row.

An entry without an error is *accepted*: the input is stored or searched literally and reads
back exactly, and the chats that were there before are unchanged.

The catalogue is also the "Hostile input" table of ``docs/reliability.md``; a test keeps them
equal. After changing the catalogue, rewrite the table with::

    python -m tests.reliability.test_hostile --write-docs
"""

from __future__ import annotations

import asyncio
import inspect
import math
import string
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agentcontext import (
    BranchExistsError,
    ChatExport,
    ChatOwnershipError,
    ChatUpdate,
    ContextEngine,
    ContextError,
    ContextItem,
    ContextSnapshot,
    DataPart,
    InMemoryContextStore,
    InvalidGraphError,
    InvalidInputError,
    InvalidTypeError,
    MarkdownRenderer,
    Message,
    MessageRecord,
    SerializationError,
    SnapshotError,
    SqlContextStore,
    StoreClosedError,
    StoreError,
    TextPart,
    TomlRenderer,
    ToolPart,
    ToonRenderer,
    XmlRenderer,
    assistant,
    assistant_text,
    blob_hash,
    fragment,
    from_fragment,
    hint,
    role,
    user,
)
from agentcontext._validate import MAX_MESSAGE_BYTES
from agentcontext.store import ExportedBlob
from agentcontext.store._db import schema as _schema
from agentcontext.store._rows.text import INDEXED_BYTES
from tests.helpers import rec

SEED, OWNER = "seed-chat", "owner"
OTHER, STRANGER = "other-chat", "stranger"
FIRST, HEAD, OTHER_MSG = "seed-m1", "seed-m2", "other-m1"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
BEGIN, END = "<!-- hostile-input:begin -->", "<!-- hostile-input:end -->"
RENDERERS = (XmlRenderer, MarkdownRenderer, TomlRenderer, ToonRenderer)


# --- the world every case starts from --------------------------------------------------------


@dataclass
class World:
    """A store holding two chats of two users, with branches, a checkpoint, a snapshot and a
    resolve record, and the ids a case needs."""

    store: SqlContextStore
    branch_id: str
    snapshot_id: str
    record_id: str
    other_export: ChatExport

    def engine(self, chat_id: str = SEED, user_id: str = OWNER) -> ContextEngine:
        return ContextEngine(store=self.store, chat_id=chat_id, user_id=user_id)


@pytest.fixture
async def world(store: SqlContextStore) -> World:
    engine = ContextEngine(store=store, chat_id=SEED, user_id=OWNER, metadata={"team": "red"})
    engine.set(
        role("You are terse."),
        user("hello world", id=FIRST),
        assistant_text("hi there", id=HEAD),
    )
    await engine.save()
    await engine.checkpoint("cp")
    await engine.btw()  # a second branch, main-v2, not active
    draft = ContextSnapshot(summary="seed")
    draft.add_file("notes.txt", "some notes")
    snapshot = await engine.snapshot(draft)
    result = await engine.resolve(record=True)
    other = ContextEngine(store=store, chat_id=OTHER, user_id=STRANGER)
    other.set(user("elsewhere", id=OTHER_MSG))
    await other.save()
    branch = await store.get_active_branch(SEED)
    assert branch is not None and snapshot.id is not None and result.record_id is not None
    return World(store, branch.id, snapshot.id, result.record_id, await store.export_chat(OTHER))


TABLES = (
    _schema.chats,
    _schema.messages,
    _schema.branches,
    _schema.checkpoints,
    _schema.blobs,
    _schema.snapshots,
    _schema.snapshot_items,
    _schema.resolve_records,
    _schema.record_messages,
)


async def dump(store: SqlContextStore) -> dict[str, list[str]]:
    """Every row of every table, in a stable order."""
    out: dict[str, list[str]] = {}
    async with store.engine.connect() as conn:
        for table in TABLES:
            rows = (await conn.execute(select(table))).all()
            out[table.name] = sorted(repr(tuple(row)) for row in rows)
    return out


# --- the catalogue ----------------------------------------------------------------------------

Call = Callable[[World], Awaitable[object]]


@dataclass(frozen=True)
class Entry:
    """One kind of hostile input: what it is, the error it gets, what the user should do, and
    the calls that feed it to the library."""

    key: str
    input: str
    error: type[ContextError] | None
    """The error every call raises (a subclass is fine); None: the input is accepted."""
    advice: str
    calls: tuple[Call, ...]
    says: tuple[str, ...] = ()
    """Phrases every error message contains (case-insensitive)."""


def tool_message(message_id: str, value: object) -> Message:
    return Message(
        id=message_id,
        role="assistant",
        parts=[
            ToolPart(
                tool_call_id="call-1", tool_name="lookup", state="input-available", input=value
            )
        ],
    )


def data_message(message_id: str, value: object) -> Message:
    return Message(id=message_id, role="assistant", parts=[DataPart(name="payload", data=value)])


def named(name: str, call: Call) -> Call:
    call.__name__ = call.__qualname__ = name
    return call


def render_with_every_renderer(*fragments: Any) -> list[Call]:
    def one(renderer: type[XmlRenderer] | type[MarkdownRenderer] | Any) -> Call:
        async def render(w: World) -> object:
            return renderer().render(list(fragments))

        return named(f"{renderer.__name__}.render", render)

    return [one(renderer) for renderer in RENDERERS]


# String fields. Each function returns the calls that put ``value`` into that field, through
# the engine and through the store (writes and the reads that take it).


def chat_id_calls(value: str) -> list[Call]:
    async def create_chat(w: World) -> object:
        return await w.store.create_chat(value, user_id="new-user")

    async def open_engine(w: World) -> object:
        return await w.engine(value, "new-user").initialize()

    async def get_chat(w: World) -> object:
        return await w.store.get_chat(value)

    return [named(f.__name__, f) for f in (create_chat, open_engine, get_chat)]


def user_id_calls(value: str) -> list[Call]:
    async def create_chat(w: World) -> object:
        return await w.store.create_chat("new-chat", user_id=value)

    async def open_engine(w: World) -> object:
        return await w.engine("new-chat", value).initialize()

    async def list_chats(w: World) -> object:
        return await w.store.list_chats(user_id=value)

    async def search_user_messages(w: World) -> object:
        return await w.store.search_user_messages(value, "hello")

    async def delete_chat(w: World) -> object:
        return await w.store.delete_chat(SEED, user_id=value)

    return [create_chat, open_engine, list_chats, search_user_messages, delete_chat]


def title_calls(value: str) -> list[Call]:
    async def create_chat(w: World) -> object:
        return await w.store.create_chat("new-chat", user_id="new-user", title=value)

    async def engine_update_chat(w: World) -> object:
        return await w.engine().update_chat(title=value)

    async def store_update_chat(w: World) -> object:
        return await w.store.update_chat(SEED, lambda chat: ChatUpdate(title=value))

    return [create_chat, engine_update_chat, store_update_chat]


def metadata_calls(metadata: Any, *, with_filter: bool = False) -> list[Call]:
    async def create_chat(w: World) -> object:
        return await w.store.create_chat("new-chat", user_id="new-user", metadata=metadata)

    async def engine_update_chat(w: World) -> object:
        return await w.engine().update_chat(metadata=metadata)

    async def store_update_chat(w: World) -> object:
        # model_construct: the store's own check, not pydantic's in the caller's updater.
        update = ChatUpdate.model_construct(metadata=metadata)
        return await w.store.update_chat(SEED, lambda chat: update)

    async def open_engine_with_metadata(w: World) -> object:
        engine = ContextEngine(store=w.store, chat_id=SEED, user_id=OWNER, metadata=metadata)
        return await engine.initialize()

    async def track_usage(w: World) -> object:
        return await w.engine().track_usage(metadata)

    async def list_chats_filter(w: World) -> object:
        return await w.store.list_chats(metadata=metadata)

    calls: list[Call] = [
        create_chat,
        engine_update_chat,
        store_update_chat,
        open_engine_with_metadata,
        track_usage,
    ]
    return [*calls, list_chats_filter] if with_filter else calls


def message_data_calls(message: Message) -> list[Call]:
    """A message through the engine (save, begin_turn) and its JSON through the store."""

    async def engine_save(w: World) -> object:
        return await w.engine().set(assistant(message)).save()

    async def engine_save_in_place(w: World) -> object:
        return await w.engine().set(assistant(message)).save(branch=False)

    async def store_add_message(w: World) -> object:
        data = message.model_dump(exclude_none=True)
        return await w.store.add_message(
            MessageRecord(id="new-m", chat_id=SEED, parent_id=HEAD, name="assistant", data=data)
        )

    async def store_append_messages(w: World) -> object:
        data = message.model_dump(exclude_none=True)
        record = MessageRecord(id="new-m", chat_id=SEED, parent_id=HEAD, name="user", data=data)
        return await w.store.append_messages(w.branch_id, [record], expected_head=HEAD)

    return [engine_save, engine_save_in_place, store_add_message, store_append_messages]


def message_text_calls(value: str) -> list[Call]:
    message = Message(id="new-m", role="assistant", parts=[TextPart(text=value)])

    async def begin_turn(w: World) -> object:
        return await w.engine().begin_turn(user(value))

    return [*message_data_calls(message), begin_turn]


def message_id_calls(value: str) -> list[Call]:
    async def engine_save(w: World) -> object:
        return await w.engine().set(user("text", id=value)).save()

    async def store_add_message(w: World) -> object:
        return await w.store.add_message(rec(value, SEED, HEAD))

    async def get_message(w: World) -> object:
        return await w.store.get_message(value)

    async def rewind(w: World) -> object:
        return await w.engine().rewind(value)

    return [engine_save, store_add_message, get_message, rewind]


def branch_name_calls(value: str) -> list[Call]:
    async def create_branch(w: World) -> object:
        return await w.store.create_branch(SEED, value, head_message_id=HEAD)

    async def switch_branch(w: World) -> object:
        return await w.engine().switch_branch(value)

    async def get_branch(w: World) -> object:
        return await w.store.get_branch(SEED, value)

    return [create_branch, switch_branch, get_branch]


def checkpoint_name_calls(value: str) -> list[Call]:
    async def engine_checkpoint(w: World) -> object:
        return await w.engine().checkpoint(value)

    async def engine_restore(w: World) -> object:
        return await w.engine().restore(value)

    async def create_checkpoint(w: World) -> object:
        return await w.store.create_checkpoint(SEED, value, HEAD)

    async def get_checkpoint(w: World) -> object:
        return await w.store.get_checkpoint(SEED, value)

    async def delete_checkpoint(w: World) -> object:
        return await w.store.delete_checkpoint(SEED, value)

    return [engine_checkpoint, engine_restore, create_checkpoint, get_checkpoint, delete_checkpoint]


def search_query_calls(value: str) -> list[Call]:
    async def search_messages(w: World) -> object:
        return await w.store.search_messages(SEED, value)

    async def search_user_messages(w: World) -> object:
        return await w.store.search_user_messages(OWNER, value)

    return [search_messages, search_user_messages]


def tool_input_calls(value: object) -> list[Call]:
    return message_data_calls(tool_message("new-m", value))


def data_part_calls(value: object) -> list[Call]:
    return message_data_calls(data_message("new-m", value))


def snapshot_path_calls(value: str) -> list[Call]:
    async def add_file(w: World) -> object:
        return ContextSnapshot().add_file(value, "content")

    async def save_snapshot(w: World) -> object:
        draft = ContextSnapshot()
        draft.add_file("notes.txt", "content")
        item = draft.items[0].model_copy(update={"path": value})
        smuggled = ContextSnapshot(items=[item])
        smuggled._contents.update(draft.contents)
        return await w.engine().snapshot(smuggled)

    return [add_file, save_snapshot]


@dataclass(frozen=True)
class Field:
    """A string field of the API and how a value gets into it."""

    key: str
    label: str
    calls: Callable[[str], list[Call]]
    stored_as_json: bool = False
    """Stored inside JSON (metadata, message data): refused with SerializationError."""


FIELDS = (
    Field("chat-id", "a chat id", chat_id_calls),
    Field("user-id", "a user id", user_id_calls),
    Field("title", "a chat title", title_calls),
    Field(
        "metadata-key",
        "a metadata key",
        lambda v: metadata_calls({v: 1}, with_filter=True),
    ),
    Field(
        "metadata-value",
        "a metadata value",
        lambda v: metadata_calls({"note": v}, with_filter=True),
    ),
    Field("message-text", "message text", message_text_calls, stored_as_json=True),
    Field("message-id", "a message id", message_id_calls),
    Field("branch-name", "a branch name", branch_name_calls),
    Field("checkpoint-name", "a checkpoint name", checkpoint_name_calls),
    Field("search-query", "a search query", search_query_calls),
    Field("tool-input", "a tool call's input", lambda v: tool_input_calls({"q": v}), True),
    Field("snapshot-path", "a snapshot item's path", snapshot_path_calls),
)


def string_field_entries() -> Iterator[Entry]:
    for f in FIELDS:
        # Metadata goes through JSON when stored but not as a list_chats filter: the filter's
        # refusal is an InvalidInputError, the parent class of SerializationError.
        json_error = SerializationError if f.stored_as_json else InvalidInputError
        yield Entry(
            f"nul-in-{f.key}",
            f"A NUL character (`\\x00`) in {f.label}",
            json_error,
            "Remove the NUL: PostgreSQL cannot store it in text, so neither backend accepts it.",
            tuple(f.calls("before\x00after")),
            says=("NUL", "\\x00"),
        )
    for f in FIELDS:
        json_error = SerializationError if f.stored_as_json else InvalidInputError
        yield Entry(
            f"lone-surrogate-in-{f.key}",
            f"A lone surrogate (`\\ud800`) in {f.label}",
            json_error,
            "Decode input with `errors='replace'` (or `'surrogateescape'` and re-encode): the "
            "text must be valid Unicode.",
            tuple(f.calls("before\ud800after")),
            says=("surrogate",),
        )


ID_FIELDS = {
    "chat-id": ("chat id", chat_id_calls),
    "user-id": ("user id", user_id_calls),
    "message-id": ("message id", message_id_calls),
    "branch-name": ("branch name", branch_name_calls),
    "checkpoint-name": ("checkpoint name", checkpoint_name_calls),
}


def long_id_entries() -> Iterator[Entry]:
    for key, (label, calls) in ID_FIELDS.items():
        yield Entry(
            f"long-{key}",
            f"A {label} of 10 000 characters",
            InvalidInputError,
            "Keep ids and names to at most 255 characters; hash or shorten longer keys.",
            tuple(calls("x" * 10_000)),
            says=("10000 characters", "limit is 255"),
        )


# Values JSON cannot hold or that no backend stores the same way.

NON_FINITE = (math.nan, math.inf, -math.inf)


def each(values: tuple[object, ...], make: Callable[[object], list[Call]]) -> tuple[Call, ...]:
    return tuple(call for value in values for call in make(value))


def deep_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def deep_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"k": value}
    return value


def self_list() -> list[Any]:
    value: list[Any] = ["x"]
    value.append(value)
    return value


def self_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"x": 1}
    value["self"] = value
    return value


def deep_fragment(depth: int) -> Any:
    value = hint("leaf")
    for _ in range(depth):
        value = fragment("level", value)
    return value


def self_fragment() -> Any:
    loop = fragment("loop", hint("inside"))
    assert isinstance(loop.data, list)
    loop.data.append(loop)
    return loop


def engine_set_calls(make: Callable[[], Any]) -> list[Call]:
    """The fragment given to ContextEngine.set() and, lazily produced, to resolve()."""

    async def engine_set(w: World) -> object:
        return w.engine().set(make())

    return [engine_set]


def json_value_entries() -> Iterator[Entry]:
    advice_nan = "Store `None` or a string (`'NaN'`, `'inf'`) instead: JSON has no NaN or infinity."
    yield Entry(
        "non-finite-in-metadata",
        "NaN, +inf or -inf in chat metadata or token usage",
        SerializationError,
        advice_nan,
        each(NON_FINITE, lambda x: metadata_calls({"score": x})),
        says=("JSON has no NaN or infinity",),
    )
    yield Entry(
        "non-finite-in-tool-input",
        "NaN, +inf or -inf in a tool call's input",
        SerializationError,
        advice_nan,
        each(NON_FINITE, lambda x: tool_input_calls({"x": [1.0, x]})),
        says=("JSON has no NaN or infinity",),
    )
    yield Entry(
        "non-finite-in-data-part",
        "NaN, +inf or -inf in a data part",
        SerializationError,
        advice_nan,
        each(NON_FINITE, lambda x: data_part_calls({"x": x})),
        says=("JSON has no NaN or infinity",),
    )
    odd = (b"bytes", datetime(2024, 1, 1, tzinfo=UTC), {1, 2}, object())
    yield Entry(
        "non-json-value",
        "bytes, a datetime, a set or another object in metadata or message data",
        SerializationError,
        "Convert it to str, int, float, bool, None, a list or a dict first.",
        each(odd, lambda x: [*metadata_calls({"v": x}), *tool_input_calls({"v": x})]),
        says=("JSON cannot represent",),
    )
    keys = (1, (1, 2), None)
    yield Entry(
        "non-str-key-in-metadata",
        "A dict key that is an int, a tuple or None in metadata or token usage",
        SerializationError,
        "Use string keys (`str(key)`): JSON object keys are strings.",
        each(keys, lambda k: metadata_calls({k: 1})),
        says=("key", "JSON object keys must be strings"),
    )
    yield Entry(
        "non-str-key-in-message-data",
        "A dict key that is an int, a tuple or None in a tool input or data part",
        SerializationError,
        "Use string keys (`str(key)`): JSON object keys are strings.",
        each(keys, lambda k: [*tool_input_calls({k: 1}), *data_part_calls({"a": {k: 1}})]),
        says=("key", "JSON object keys must be strings"),
    )
    yield Entry(
        "non-str-key-in-fragment-data",
        "A dict key that is an int, a tuple or None in fragment data",
        InvalidTypeError,
        "Use string keys: renderers turn keys into tags, headings and TOML keys.",
        each(
            keys,
            lambda k: [
                *render_with_every_renderer(hint({k: "v"})),
                named("resolve", lambda w, k=k: w.engine().set(hint({k: "v"})).resolve()),
            ],
        ),
        says=("dict keys must be str",),
    )


def nesting_entries() -> Iterator[Entry]:
    flatten = "Flatten it (or store it as a JSON string); at most 128 levels are stored."
    yield Entry(
        "deep-list-in-metadata",
        "Lists nested 10 000 deep in chat metadata",
        SerializationError,
        flatten,
        tuple(metadata_calls({"deep": deep_list(10_000)})),
        says=("nested deeper than 128 levels", "flatten"),
    )
    yield Entry(
        "deep-dict-in-metadata",
        "Dicts nested 10 000 deep in chat metadata",
        SerializationError,
        flatten,
        tuple(metadata_calls({"deep": deep_dict(10_000)})),
        says=("nested deeper than 128 levels", "flatten"),
    )
    yield Entry(
        "deep-message-data",
        "Lists or dicts nested 10 000 deep in a tool input or data part",
        SerializationError,
        flatten,
        (
            *tool_input_calls(deep_list(10_000)),
            *data_part_calls(deep_dict(10_000)),
        ),
        says=("nested deeper than 128 levels", "flatten"),
    )
    yield Entry(
        "deep-fragment-data",
        "Lists or dicts nested 10 000 deep in fragment data",
        InvalidInputError,
        "Flatten it: renderers show at most 200 levels.",
        (
            *engine_set_calls(lambda: hint(deep_list(10_000))),
            *engine_set_calls(lambda: hint(deep_dict(10_000))),
            *render_with_every_renderer(hint(deep_list(10_000))),
            *render_with_every_renderer(hint(deep_dict(10_000))),
        ),
        says=("nested deeper than 200 levels",),
    )
    yield Entry(
        "deep-lazy-fragment-data",
        "A lazy value that loads lists nested 2 000 deep",
        InvalidInputError,
        "Flatten what the loader returns: renderers show at most 200 levels.",
        (
            named(
                "resolve",
                # 2 000, not 10 000: materialising nested data costs time quadratic in its
                # depth (about 10 s for 10 000 levels).
                lambda w: w.engine().set(hint(lambda: deep_list(2_000))).resolve(),
            ),
        ),
        says=("nested deeper than 200 levels",),
    )
    yield Entry(
        "deep-fragment-nesting",
        "Fragments nested in fragments 10 000 deep",
        InvalidInputError,
        "Flatten the tree: renderers show at most 200 levels.",
        (
            *engine_set_calls(lambda: deep_fragment(10_000)),
            *render_with_every_renderer(deep_fragment(10_000)),
        ),
        says=("nested deeper than 200 levels",),
    )
    yield Entry(
        "deep-serialized-fragment",
        "`from_fragment` of fragments or data nested 10 000 deep",
        SerializationError,
        "Flatten the tree: serialized fragments hold at most 200 levels.",
        (
            named(
                "from_fragment(deep fragment)", _sync(lambda: from_fragment(deep_fragment(10_000)))
            ),
            named(
                "from_fragment(deep data)", _sync(lambda: from_fragment(hint(deep_list(10_000))))
            ),
        ),
        says=("nested too deeply",),
    )


def _sync(function: Callable[[], object]) -> Call:
    async def call(w: World) -> object:
        return function()

    return call


def self_reference_entries() -> Iterator[Entry]:
    remove = "Remove the reference to itself (copy the value instead of nesting it)."
    yield Entry(
        "self-containing-metadata",
        "A list or dict that contains itself, in chat metadata",
        SerializationError,
        remove,
        (*metadata_calls({"l": self_list()}), *metadata_calls({"d": self_dict()})),
        says=("contains itself",),
    )
    yield Entry(
        "self-containing-message-data",
        "A list or dict that contains itself, in a tool input or data part",
        SerializationError,
        remove,
        (*tool_input_calls(self_dict()), *data_part_calls(self_list())),
        says=("contains itself",),
    )
    yield Entry(
        "self-containing-fragment-data",
        "A list or dict that contains itself, in fragment data",
        InvalidInputError,
        remove,
        (
            *engine_set_calls(lambda: hint(self_list())),
            *engine_set_calls(lambda: hint(self_dict())),
            *render_with_every_renderer(hint(self_list())),
            *render_with_every_renderer(hint(self_dict())),
        ),
        says=("contains itself",),
    )
    yield Entry(
        "fragment-contains-itself",
        "A fragment nested in its own data",
        InvalidInputError,
        remove,
        (
            *engine_set_calls(self_fragment),
            *render_with_every_renderer(self_fragment()),
            named(
                "set(parent of a loop)",
                lambda w: _value(w.engine().set(fragment("parent", self_fragment()))),
            ),
        ),
        says=("contains itself",),
    )
    yield Entry(
        "serialize-self-containing-fragment",
        "`from_fragment` of a fragment or data that contains itself",
        SerializationError,
        remove,
        (
            named("from_fragment(loop)", _sync(lambda: from_fragment(self_fragment()))),
            named("from_fragment(list)", _sync(lambda: from_fragment(hint(self_list())))),
        ),
        says=("contains itself",),
    )


async def _value(value: object) -> object:
    return value


# --- accepted inputs: stored and searched literally --------------------------------------------

SQL_PAYLOADS = (
    "'; DROP TABLE chats; --",
    '" OR 1=1 --',
    "Robert'); DELETE FROM messages WHERE ('1'='1",
    "%_\\ LIKE '%'",
)
FTS_PAYLOADS = ("NEAR(", '"', "*", "AND OR", 'title:"x" NOT -y^2', "((a OR b", "col:* {x}")


def literal_calls(payloads: tuple[str, ...], tag: str) -> tuple[Call, ...]:
    """Store every payload in every string field; each reads back exactly."""
    calls: list[Call] = []
    for index, value in enumerate(payloads):
        calls.extend(
            named(f"{name}[{index}]", make(value, f"{tag}marker{index}x{number}"))
            for number, (name, make) in enumerate(LITERAL_FIELDS.items())
        )
    return tuple(calls)


def _accept_chat_id(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        engine = w.engine(value, f"user-{marker}")
        await engine.set(user(f"hello {marker}")).save()
        chat = await w.store.get_chat(value)
        assert chat is not None and chat.id == value
        assert [c.id for c in await w.store.list_chats(user_id=f"user-{marker}")] == [value]
        assert (await w.store.export_chat(value)).chat.id == value
        hits = await w.store.search_messages(value, marker)
        assert [h.chat_id for h in hits] == [value]

    return call


def _accept_user_id(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        chat_id = f"chat-{marker}"
        engine = w.engine(chat_id, value)
        await engine.set(user(f"hello {marker}")).save()
        assert [c.id for c in await w.store.list_chats(user_id=value)] == [chat_id]
        hits = await w.store.search_user_messages(value, marker)
        assert [h.chat_id for h in hits] == [chat_id]
        with pytest.raises(ChatOwnershipError):
            await w.engine(chat_id, value + "x").initialize()

    return call


def _accept_title(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        await w.store.create_chat(f"chat-{marker}", user_id="u", title=value)
        chat = await w.store.get_chat(f"chat-{marker}")
        assert chat is not None and chat.title == value

    return call


def _accept_metadata(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        chat_id = f"chat-{marker}"
        await w.store.create_chat(chat_id, user_id="u", metadata={value: value})
        chat = await w.store.get_chat(chat_id)
        assert chat is not None and chat.metadata == {value: value}
        assert [c.id for c in await w.store.list_chats(metadata={value: value})] == [chat_id]

    return call


def _accept_message_text(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        chat_id = f"chat-{marker}"
        engine = w.engine(chat_id)
        text = f"{value} {marker}"
        await engine.set(user(text)).save()
        messages = await w.engine(chat_id).get_messages()
        assert [m.text for m in messages] == [text]
        hits = await w.store.search_messages(chat_id, marker)
        assert [h.message.data["parts"][0]["text"] for h in hits] == [text]
        await w.store.search_messages(chat_id, text)  # the payload as a query: no error

    return call


def _accept_message_id(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        chat_id = f"chat-{marker}"
        engine = w.engine(chat_id)
        await engine.set(user("first", id=value), assistant_text("second")).save()
        stored = await w.store.get_message(value)
        assert stored is not None and stored.id == value and stored.chat_id == chat_id
        info = await engine.rewind(value)
        assert info.head_message_id == value

    return call


def _accept_branch_name(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        chat_id = f"chat-{marker}"
        engine = w.engine(chat_id)
        saved = await engine.set(user("first")).save()
        await w.store.create_branch(chat_id, value, head_message_id=saved.head_message_id)
        await engine.switch_branch(value)
        assert engine.branch == value
        assert saved.head_message_id is not None
        forked = await engine.rewind(saved.head_message_id)  # names the fork f"{value}-v2"
        assert forked.name == f"{value}-v2"

    return call


def _accept_checkpoint_name(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        chat_id = f"chat-{marker}"
        engine = w.engine(chat_id)
        saved = await engine.set(user("first")).save()
        checkpoint = await engine.checkpoint(value)
        assert checkpoint.name == value
        restored = await engine.restore(value)
        assert restored.head_message_id == saved.head_message_id

    return call


def _accept_search_query(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        hits = await w.store.search_messages(SEED, value)
        words = {word.casefold() for word in value.replace("_", " ").split() if word.isalnum()}
        for hit in hits:  # every word of the query occurs in every hit
            assert all(word in hit.snippet.casefold() for word in words)
        await w.store.search_user_messages(OWNER, value)
        both = await w.store.search_messages(SEED, f"hello {value}")
        assert all("hello" in hit.snippet.casefold() for hit in both)

    return call


def _accept_tool_input(value: str, marker: str) -> Call:
    async def call(w: World) -> None:
        chat_id = f"chat-{marker}"
        message = tool_message(f"tool-{marker}", {value: value})
        await w.engine(chat_id).set(assistant(message)).save()
        (loaded,) = await w.engine(chat_id).get_messages()
        assert loaded == message

    return call


LITERAL_FIELDS: dict[str, Callable[[str, str], Call]] = {
    "chat id": _accept_chat_id,
    "user id": _accept_user_id,
    "title": _accept_title,
    "metadata key and value": _accept_metadata,
    "message text": _accept_message_text,
    "message id": _accept_message_id,
    "branch name": _accept_branch_name,
    "checkpoint name": _accept_checkpoint_name,
    "search query": _accept_search_query,
    "tool input key and value": _accept_tool_input,
}


def literal_entries() -> Iterator[Entry]:
    fields = ", ".join(LITERAL_FIELDS)
    yield Entry(
        "sql-syntax-in-strings",
        f"SQL syntax (`'; DROP TABLE chats; --`, `\" OR 1=1 --`, ...) in every string field "
        f"({fields})",
        None,
        "Nothing: every value is a bound parameter, stored and searched literally.",
        literal_calls(SQL_PAYLOADS, "sql"),
    )
    yield Entry(
        "fts-syntax-in-strings",
        f'Full-text query syntax (`NEAR(`, `"`, `*`, `AND OR`, ...) in every string field '
        f"({fields})",
        None,
        "Nothing: a search query is plain text, its words must all occur; operators are text.",
        literal_calls(FTS_PAYLOADS, "fts"),
    )


# --- size --------------------------------------------------------------------------------------

TEN_MB = 10 * 1024 * 1024


def huge_text() -> str:
    return ("All work and no play makes Jack a dull boy. " * (TEN_MB // 44 + 1))[:TEN_MB]


def adversarial_text(limit: int) -> str:
    """Distinct short words, the worst case for PostgreSQL's tsvector, up to ``limit`` bytes."""

    def words() -> Iterator[str]:
        for start, end in ((0x4E00, 0xA000), (0xAC00, 0xD7A4)):
            yield from map(chr, range(start, end))
        alphabet = string.ascii_lowercase + string.digits
        yield from ("".join(letters) for letters in product(alphabet, repeat=3))
        yield from ("".join(letters) for letters in product(alphabet, repeat=4))

    out: list[str] = []
    size = -1
    for word in words():
        size += len(word.encode("utf-8")) + 1
        if size > limit:
            break
        out.append(word)
    return " ".join(out)


def size_entries() -> Iterator[Entry]:
    def oversized() -> str:
        return "x" * (MAX_MESSAGE_BYTES + 1)

    async def engine_set(w: World) -> object:
        return w.engine().set(user(oversized()))

    async def begin_turn(w: World) -> object:
        return await w.engine().begin_turn(user(oversized()))

    async def store_add_message(w: World) -> object:
        return await w.store.add_message(rec("huge", SEED, HEAD, text=oversized()))

    async def store_append_messages(w: World) -> object:
        record = rec("huge", SEED, HEAD, text=oversized())
        return await w.store.append_messages(w.branch_id, [record], expected_head=HEAD)

    yield Entry(
        "oversized-message",
        f"A message with more than {MAX_MESSAGE_BYTES // 2**20} MiB of text",
        InvalidInputError,
        f"Refused at set(), before any resolve() could send it: a message holds at most "
        f"{MAX_MESSAGE_BYTES // 2**20} MiB of text (the UTF-8 size of its strings). Split it, "
        "or keep the content in a ContextSnapshot file.",
        tuple(
            named(f.__name__, f)
            for f in (engine_set, begin_turn, store_add_message, store_append_messages)
        ),
        says=("MiB", "split"),
    )

    async def huge_text_stored_whole(w: World) -> None:
        text = huge_text() + " zebrafinch"  # a word after the indexed prefix
        engine = w.engine("chat-huge-text")
        await engine.set(user(text)).save()
        (loaded,) = await w.engine("chat-huge-text").get_messages()
        assert loaded.text == text
        assert len(await w.store.search_messages("chat-huge-text", "dull boy")) == 1
        assert await w.store.search_messages("chat-huge-text", "zebrafinch") == []

    yield Entry(
        "huge-message-text",
        "A message with 10 MB of text",
        None,
        f"Nothing: it is stored and resolved whole; search finds it by the words of its first "
        f"{INDEXED_BYTES // 1024} KiB (the index holds that prefix, the same on every backend).",
        (huge_text_stored_whole,),
    )

    async def largest_text(w: World) -> None:
        text = adversarial_text(INDEXED_BYTES)
        assert len(text.encode("utf-8")) <= INDEXED_BYTES
        engine = w.engine("chat-largest")
        await engine.set(user(text)).save()
        (loaded,) = await w.engine("chat-largest").get_messages()
        assert loaded.text == text
        assert len(await w.store.search_messages("chat-largest", "aaa")) == 1
        last = text.rsplit(" ", 1)[-1]
        assert len(await w.store.search_messages("chat-largest", last)) == 1

    yield Entry(
        "largest-message-text",
        f"A message with {INDEXED_BYTES // 1024} KiB of distinct short words (the worst case "
        "for the index)",
        None,
        "Nothing: any text is stored, and the words of its indexed prefix are found, on every "
        "backend.",
        (largest_text,),
    )

    async def huge_payloads(w: World) -> None:
        content = huge_text()
        message = Message(
            id="huge-tool",
            role="assistant",
            parts=[
                TextPart(text="Here is the log."),
                ToolPart(
                    tool_call_id="call-1",
                    tool_name="read_log",
                    state="output-available",
                    input={"path": "app.log"},
                    output=content,
                ),
                DataPart(name="copy", data={"lines": content.split(". ")[:50_000]}),
            ],
        )
        await w.engine("chat-huge").set(user("show me the log"), assistant(message)).save()
        loaded = await w.engine("chat-huge").get_messages()
        assert loaded[-1] == message
        stored = await w.store.get_message("huge-tool")
        assert stored is not None and stored.data == message.model_dump(exclude_none=True)

    yield Entry(
        "huge-tool-output",
        "A message whose tool output and data part hold 10 MB",
        None,
        "Nothing: tool outputs and data parts are stored whole and round-trip exactly "
        "(they are not indexed).",
        (huge_payloads,),
    )


# --- ids and the graph ------------------------------------------------------------------------


def graph_entries() -> Iterator[Entry]:
    async def save(w: World) -> object:
        return await w.engine().set(user("mine", id=OTHER_MSG)).save()

    async def save_in_place(w: World) -> object:
        return await w.engine().set(user("mine", id=OTHER_MSG)).save(branch=False)

    yield Entry(
        "message-id-of-another-chat-engine",
        "A message whose id is already used in another chat, saved by the engine",
        InvalidGraphError,
        "Give the message a new id (ids are global); omit `id=` to get a fresh one.",
        (save, save_in_place),
        says=("message ids are global", "new id"),
    )

    async def add_message(w: World) -> object:
        return await w.store.add_message(rec(OTHER_MSG, SEED, HEAD))

    async def append_messages(w: World) -> object:
        return await w.store.append_messages(
            w.branch_id, [rec(OTHER_MSG, SEED, HEAD)], expected_head=HEAD
        )

    async def fork_branch(w: World) -> object:
        return await w.store.fork_branch(
            SEED,
            "main",
            head_message_id=HEAD,
            activate=False,
            messages=[rec(OTHER_MSG, SEED, HEAD)],
        )

    yield Entry(
        "message-id-of-another-chat-store",
        "A MessageRecord whose id is already used in another chat, written to the store",
        InvalidGraphError,
        "Pick a new message id: ids are global across chats.",
        (add_message, append_messages, fork_branch),
        says=("message ids are global", "pick a new id"),
    )

    async def rewind(w: World) -> object:
        return await w.engine().rewind(OTHER_MSG)

    async def checkpoint(w: World) -> object:
        return await w.store.create_checkpoint(SEED, "theirs", OTHER_MSG)

    async def branch(w: World) -> object:
        return await w.store.create_branch(SEED, "theirs", head_message_id=OTHER_MSG)

    async def head(w: World) -> object:
        return await w.store.update_branch_head(w.branch_id, OTHER_MSG, HEAD)

    async def parent(w: World) -> object:
        return await w.store.set_message_parent(HEAD, OTHER_MSG)

    async def child(w: World) -> object:
        return await w.store.add_message(rec("new-m", SEED, OTHER_MSG))

    async def snapshot(w: World) -> object:
        draft = ContextSnapshot()
        draft.add_snippet("s", "text")
        return await w.store.save_snapshot(draft, chat_id=SEED, message_id=OTHER_MSG)

    yield Entry(
        "message-of-another-chat-as-target",
        "Another chat's message as rewind target, checkpoint, branch head, parent or snapshot "
        "anchor",
        InvalidGraphError,
        "Use a message of this chat (`store.get_message(id).chat_id` tells where one lives).",
        (rewind, checkpoint, branch, head, parent, child, snapshot),
        says=(OTHER_MSG,),
    )

    async def self_parent_record(w: World) -> object:
        return await w.store.add_message(rec("loop", SEED, "loop"))

    async def self_parent_move(w: World) -> object:
        return await w.store.set_message_parent(HEAD, HEAD)

    async def cycle(w: World) -> object:
        return await w.store.set_message_parent(FIRST, HEAD)

    yield Entry(
        "parent-cycle",
        "A message made its own parent, or the parent of its own ancestor",
        InvalidGraphError,
        "Pick a parent outside the message's subtree.",
        (self_parent_record, self_parent_move, cycle),
        says=("parent",),
    )

    async def twice(w: World) -> object:
        return await w.store.add_messages([rec("dup", SEED, HEAD), rec("dup", SEED, HEAD)])

    async def child_first(w: World) -> object:
        return await w.store.add_messages([rec("b", SEED, "a"), rec("a", SEED, HEAD)])

    yield Entry(
        "bad-batch",
        "A batch of messages holding one id twice, or a child before its parent",
        InvalidInputError,
        "Send each message once, parents before children.",
        (twice, child_first),
        says=("message",),
    )

    yield Entry(
        "checkpoint-name-of-0-chars",
        "A checkpoint name of 0 characters",
        InvalidInputError,
        "Name the checkpoint (1 to 255 characters).",
        tuple(checkpoint_name_calls("")),
        says=("must not be empty",),
    )
    yield Entry(
        "checkpoint-name-of-1000-chars",
        "A checkpoint name of 1 000 characters",
        InvalidInputError,
        "Keep checkpoint names to at most 255 characters.",
        tuple(checkpoint_name_calls("c" * 1000)),
        says=("1000 characters", "limit is 255"),
    )

    async def negative_limit(w: World) -> object:
        return await w.store.list_chats(limit=-1)

    async def negative_offset(w: World) -> object:
        return await w.store.list_chats(offset=-5)

    async def zero_search_limit(w: World) -> object:
        return await w.store.search_messages(SEED, "hello", limit=0)

    async def negative_version(w: World) -> object:
        return await w.store.get_changes(SEED, -1)

    async def negative_lazy_depth(w: World) -> object:
        return ContextEngine(store=w.store, chat_id=SEED, user_id=OWNER, lazy_max_depth=0)

    yield Entry(
        "negative-number",
        "A negative limit, offset, version or lazy depth (or a search limit of 0)",
        InvalidInputError,
        "Pass a number in range; the message names the smallest one allowed.",
        (negative_limit, negative_offset, zero_search_limit, negative_version, negative_lazy_depth),
        says=("must be at least",),
    )


# --- snapshots and renderers ------------------------------------------------------------------


def snapshot_entries() -> Iterator[Entry]:
    async def add_file(w: World) -> object:
        snapshot = await w.engine().load_snapshot(w.snapshot_id, with_content=True)
        return snapshot.add_file("more.txt", "more")

    async def assign(w: World) -> object:
        snapshot = await w.store.get_snapshot(w.snapshot_id)
        assert snapshot is not None
        snapshot.summary = "changed"
        return snapshot

    async def store_again(w: World) -> object:
        snapshot = await w.store.get_snapshot(w.snapshot_id, with_content=True)
        assert snapshot is not None
        return await w.store.save_snapshot(snapshot, chat_id=SEED, message_id=HEAD)

    async def engine_again(w: World) -> object:
        snapshot = await w.engine().load_snapshot(w.snapshot_id)
        return await w.engine().snapshot(snapshot)

    yield Entry(
        "snapshot-store-twice",
        "Storing an already stored snapshot again",
        SnapshotError,
        "Build a new ContextSnapshot for new content.",
        (store_again, engine_again),
        says=("build a new ContextSnapshot",),
    )
    yield Entry(
        "snapshot-add-after-store",
        "Adding an item to (or changing) a stored snapshot",
        SnapshotError,
        "Build a new ContextSnapshot; a stored one is immutable.",
        (add_file, assign),
        says=("build a new ContextSnapshot",),
    )

    async def put_blob(w: World) -> object:
        return await w.store.put_blob(b"content", expected_hash=blob_hash(b"other content"))

    async def tampered_snapshot(w: World) -> object:
        draft = ContextSnapshot()
        item = draft.add_file("a.txt", "original")
        assert item.blob is not None
        draft._contents[item.blob] = (b"tampered", item.media_type)
        return await w.engine().snapshot(draft)

    async def tampered_import(w: World) -> object:
        export = await w.store.export_chat(SEED)
        blob = export.blobs[0]
        forged = ExportedBlob.of(blob.hash, blob.media_type, b"forged")
        return await w.store.import_chat(export.model_copy(update={"blobs": [forged]}))

    yield Entry(
        "blob-hash-mismatch",
        "A blob whose content does not match its hash (put_blob, a snapshot, an import)",
        InvalidInputError,
        "Let the library compute the hash (`blob_hash(content)`); never reuse a hash for other "
        "bytes.",
        (put_blob, tampered_snapshot, tampered_import),
        says=("hash",),
    )

    async def missing_blob(w: World) -> object:
        item = ContextItem(kind="file", path="ghost.txt", blob="0" * 64, size=4)
        return await w.engine().snapshot(ContextSnapshot(items=[item]))

    yield Entry(
        "snapshot-missing-blob",
        "A snapshot item pointing at a blob nobody stored",
        SnapshotError,
        "Add items with the `add_*` helpers, which keep their content until the snapshot is "
        "stored.",
        (missing_blob,),
        says=("no content for blob",),
    )

    async def nul_content(w: World) -> None:
        draft = ContextSnapshot()
        draft.add_file("data.txt", "before\x00after")
        stored = await w.engine("chat-snapshot").snapshot(draft)
        assert stored.id is not None
        loaded = await w.store.get_snapshot(stored.id, with_content=True)
        assert loaded is not None
        assert loaded.content_of(loaded.items[0]) == b"before\x00after"
        assert loaded.items[0].preview is None  # treated as binary

    yield Entry(
        "nul-in-snapshot-content",
        "A NUL character in a snapshot file's text content",
        None,
        "Nothing: contents are stored as bytes and read back exactly (shown as binary).",
        (nul_content,),
    )


def range_entries() -> Iterator[Entry]:
    """Numbers the database could not hold, and instants that are no date in UTC."""

    async def list_chats_limit(w: World) -> object:
        return await w.store.list_chats(limit=2**63)

    async def list_chats_limit_31(w: World) -> object:
        return await w.store.list_chats(limit=2**31)

    async def list_chats_offset(w: World) -> object:
        return await w.store.list_chats(offset=2**63)

    async def search_limit(w: World) -> object:
        return await w.store.search_messages(SEED, "hello", limit=2**63)

    async def search_user_limit(w: World) -> object:
        return await w.store.search_user_messages(OWNER, "hello", limit=2**31)

    yield Entry(
        "count-out-of-range",
        "A limit or offset of 2**31 or more (list_chats, search_messages, search_user_messages)",
        InvalidInputError,
        "Page with a smaller limit; every backend binds row counts as 32-bit integers.",
        (list_chats_limit, list_chats_limit_31, list_chats_offset, search_limit, search_user_limit),
        says=("at most",),
    )

    async def get_changes(w: World) -> object:
        return await w.store.get_changes(SEED, 2**63)

    async def metadata_filter(w: World) -> object:
        return await w.store.list_chats(metadata={"team": 2**70})

    yield Entry(
        "integer-beyond-64-bits",
        "An integer beyond 64 bits as a change version or a metadata filter value",
        InvalidInputError,
        "Use values that fit in 64 bits (a filter value can be a string).",
        (get_changes, metadata_filter),
        says=("64 bits",),
    )

    huge = 10**5000
    yield Entry(
        "json-integer-of-thousands-of-digits",
        "A JSON integer of 5 000 digits in a message part or in chat metadata",
        SerializationError,
        "Store such a number as a string.",
        (
            *message_data_calls(data_message("new-m", huge)),
            *metadata_calls({"n": huge}),
        ),
        says=("digits",),
    )


def import_entries() -> Iterator[Entry]:
    """Exports that would not fit this database, or any database."""

    async def renamed(w: World) -> ChatExport:
        """The seeded chat's export under fresh chat and message ids (ids of branches,
        checkpoints and snapshots unchanged: they exist in this database)."""
        export = await w.store.export_chat(SEED)
        fresh = {m.id: f"{m.id}-copy" for m in export.messages}
        chat = export.chat.model_copy(update={"id": "copy"})
        return export.model_copy(
            update={
                "chat": chat,
                "messages": [
                    m.model_copy(
                        update={
                            "id": fresh[m.id],
                            "chat_id": "copy",
                            "parent_id": None if m.parent_id is None else fresh[m.parent_id],
                            "data": {**m.data, "id": fresh[m.id]},
                        }
                    )
                    for m in export.messages
                ],
                "branches": [
                    b.model_copy(
                        update={
                            "chat_id": "copy",
                            "head_message_id": None
                            if b.head_message_id is None
                            else fresh[b.head_message_id],
                        }
                    )
                    for b in export.branches
                ],
                "checkpoints": [
                    c.model_copy(update={"chat_id": "copy", "message_id": fresh[c.message_id]})
                    for c in export.checkpoints
                ],
                "snapshots": [],
                "blobs": [],
            }
        )

    def with_new_branch_ids(export: ChatExport) -> ChatExport:
        return export.model_copy(
            update={
                "branches": [b.model_copy(update={"id": f"{b.id}-copy"}) for b in export.branches]
            }
        )

    async def long_checkpoint_id(w: World) -> object:
        export = with_new_branch_ids(await renamed(w))
        export.checkpoints[0] = export.checkpoints[0].model_copy(update={"id": "c" * 10_000})
        return await w.store.import_chat(export)

    async def nul_checkpoint_id(w: World) -> object:
        export = with_new_branch_ids(await renamed(w))
        export.checkpoints[0] = export.checkpoints[0].model_copy(update={"id": "c\x00p"})
        return await w.store.import_chat(export)

    async def year_one(w: World) -> object:
        export = with_new_branch_ids(await renamed(w))
        early = datetime(1, 1, 1, 5, tzinfo=timezone(timedelta(hours=14)))
        export.messages[0] = export.messages[0].model_copy(update={"created_at": early})
        return await w.store.import_chat(export)

    yield Entry(
        "import-bad-checkpoint-or-time",
        "An import with a checkpoint id of 10 000 characters or with a NUL, or a message "
        "created in year 1 at +14:00 (before year 1 in UTC)",
        InvalidInputError,
        "Fix the export: ids are at most 255 characters without NUL, times are valid in UTC.",
        (long_checkpoint_id, nul_checkpoint_id, year_one),
    )

    async def taken_branch_ids(w: World) -> object:
        return await w.store.import_chat(await renamed(w))

    yield Entry(
        "import-taken-branch-id",
        "An import whose branch ids exist in this database (another chat's)",
        BranchExistsError,
        "Import the chat under another id (the command line's `import --as NEW_ID` renames "
        "every id).",
        (taken_branch_ids,),
        says=("exist", "another id"),
    )

    async def taken_checkpoint_ids(w: World) -> object:
        return await w.store.import_chat(with_new_branch_ids(await renamed(w)))

    yield Entry(
        "import-taken-checkpoint-id",
        "An import whose checkpoint ids exist in this database (another chat's)",
        InvalidGraphError,
        "Import the chat under another id (the command line's `import --as NEW_ID` renames "
        "every id).",
        (taken_checkpoint_ids,),
        says=("exist", "another id"),
    )


def lifecycle_entries() -> Iterator[Entry]:
    """A store used after it was closed, or from another event loop."""

    def url_of(w: World) -> str:
        return w.store.engine.url.render_as_string(hide_password=False)

    async def after_close(w: World) -> object:
        store = SqlContextStore(url_of(w))
        await store.initialize()
        await store.close()
        return await store.get_chat(SEED)

    async def enter_after_close(w: World) -> object:
        store = SqlContextStore(url_of(w))
        await store.close()
        async with store:
            return None

    async def engine_after_close(w: World) -> object:
        store = SqlContextStore(url_of(w))
        await store.close()
        return await ContextEngine(store=store, chat_id=SEED, user_id=OWNER).set(user("x")).save()

    yield Entry(
        "closed-store",
        "A store used (or entered with `async with`) after `close()`",
        StoreClosedError,
        "Create a new store; close it once, when the application stops.",
        (after_close, enter_after_close, engine_after_close),
        says=("closed",),
    )

    async def other_loop(w: World) -> object:
        return await asyncio.to_thread(asyncio.run, w.store.get_chat(SEED))

    async def other_loop_engine(w: World) -> object:
        async def save() -> object:
            return await w.engine().set(user("x")).save()

        return await asyncio.to_thread(asyncio.run, save())

    yield Entry(
        "store-in-another-event-loop",
        "A store used from another event loop (another `asyncio.run()`, another thread)",
        StoreError,
        "Make one store per event loop.",
        (other_loop, other_loop_engine),
        says=("another event loop",),
    )


def renderer_entries() -> Iterator[Entry]:
    async def generate() -> Any:
        yield "item"

    def lazy_values() -> tuple[Any, ...]:
        return (lambda: "text", generate(), {"a", "b"})

    calls: list[Call] = []
    for index, lazy in enumerate(lazy_values()):
        calls += [
            named(f"{c.__name__}[{index}]", c) for c in render_with_every_renderer(hint(lazy))
        ]
    calls += render_with_every_renderer(fragment("outer", hint(lambda: "nested")))
    yield Entry(
        "render-lazy-data",
        "A renderer given lazy data (a callable, an async generator, a set)",
        InvalidInputError,
        "Resolve through `ContextEngine.resolve()`, or `await LazyResolver().materialize(...)` "
        "first.",
        tuple(calls),
        says=("lazy value", "resolve()"),
    )
    yield Entry(
        "render-message-fragment",
        "A renderer given a message fragment (top level or nested)",
        InvalidInputError,
        "Pass messages to `ContextEngine.set()`: they are the conversation, not the prompt.",
        (
            *render_with_every_renderer(user("hello")),
            *render_with_every_renderer(fragment("outer", assistant_text("hi"))),
        ),
        says=("message fragments", "ContextEngine.set()"),
    )

    async def nul_prompt(w: World) -> None:
        for renderer in RENDERERS:
            engine = w.engine(f"chat-{renderer.__name__}")
            engine.set(hint("before\x00after"), fragment("na\x00me", "x"), hint("lone\ud800"))
            result = await engine.resolve(renderer=renderer(), record=True)
            assert "\ud800" not in result.system_prompt
            assert result.record_id is not None
            replayed = await engine.replay(result.record_id)
            assert replayed.system_prompt == result.system_prompt

    yield Entry(
        "control-characters-in-prompt",
        "NUL characters and lone surrogates in system-prompt fragments, recorded with "
        "`resolve(record=True)`",
        None,
        "Nothing: renderers escape or replace them, and the recorded prompt replays exactly.",
        (nul_prompt,),
    )


# --- wrong types for every argument -------------------------------------------------------------

_RECORD = MessageRecord(id="typed", chat_id=SEED, parent_id=HEAD, name="user", data={"parts": []})

WRONG: dict[str, tuple[object, ...]] = {
    "str": (None, 42, b"bytes", ["list"]),
    "str | None": (42, b"bytes", ["list"], 1.5),
    "bool": (None, 1, "yes"),
    "int": (None, "3", 2.5, True),
    "int | None": ("3", 2.5, True),
    "Mapping[str, Any] | None": ("text", [("k", "v")], 42),
    "Mapping[str, str | int | bool] | None": ("text", [("k", "v")], 42),
    "Sequence[str] | None": ("text", b"bytes", 42, [42]),
    "Sequence[str]": (None, "text", b"bytes", 42, [42]),
    "Collection[str] | None": ("text", 42, [42]),
    "Sequence[MessageRecord]": ("text", 42, [42], [{"id": "x"}], _RECORD),
    "MessageRecord": (None, "text", {"id": "x"}),
    "Callable[[Chat], ChatUpdate | None]": (None, 42, "text"),
    "ContextSnapshot": (None, "text", {"items": []}),
    "ChatExport": (None, "text", {"chat": {}}),
    "bytes": (None, "text", 42, [1, 2]),
    "Sequence[tuple[str, bytes]]": ("text", 42, [42], [("id", "text")], [(42, b"x")]),
    "ContextRenderer | None": ("xml", 42, XmlRenderer),
    "ContextWindow | None": (128_000, "gpt-4o", {"max_tokens": 10}),
    "Summarizer": (None, "summarize", 42),
    "ContextFragment": (None, "text", 42, Message(id="m", role="user")),
    "ContextStore": (None, "sqlite+aiosqlite://", 42),
    "EngineStore": (None, "sqlite+aiosqlite://", 42),
    "Mapping[str, Any] | Any": (None, 42, "text", [1]),
    "str | URL | AsyncEngine": (None, 42, b"bytes"),
    "Sequence[str | URL | AsyncEngine]": ("postgresql+asyncpg://h/db", 42, [42], [None]),
    "MigrateMode": (None, 1.5, ["auto"]),
    "float | None": ("3", True, [1.0]),
    "float": (None, "3", True, [1.0]),
    "bool | None": (1, "yes", [True]),
    "AsyncConnection": (None, "text", 42),
    "datetime | timedelta": (None, "1d", 42, [1]),
    "Callable[[int, int], object] | None": ("text", 42, [print]),
    "KeyProvider | None": ("text", 42, b"k" * 32, [None]),
}


def _snapshot_draft() -> ContextSnapshot:
    draft = ContextSnapshot()
    draft.add_snippet("s", "text")
    return draft


Baseline = Callable[[World], dict[str, Any]]

STORE_BASELINES: dict[str, Baseline] = {
    "__init__": lambda w: {"url_or_engine": "sqlite+aiosqlite://", "migrate": "auto"},
    "create_chat": lambda w: {"chat_id": "new", "user_id": "u", "title": "t", "metadata": {}},
    "upsert_chat": lambda w: {"chat_id": "new", "user_id": "u", "title": "t", "metadata": {}},
    "get_chat": lambda w: {"chat_id": SEED},
    "update_chat": lambda w: {"chat_id": SEED, "updater": lambda chat: None},
    "list_chats": lambda w: {
        "user_id": OWNER,
        "metadata": {"team": "red"},
        "limit": 5,
        "offset": 0,
    },
    "list_chats_query": lambda w: {
        "user_id": OWNER,
        "metadata": {"team": "red"},
        "limit": 5,
        "offset": 0,
    },
    "delete_chat": lambda w: {"chat_id": SEED, "user_id": OWNER},
    "add_message": lambda w: {"message": rec("new-m", SEED, HEAD)},
    "add_messages": lambda w: {"messages": [rec("new-m", SEED, HEAD)]},
    "get_message": lambda w: {"message_id": HEAD},
    "get_message_chain": lambda w: {"head_id": HEAD, "after": FIRST},
    "get_messages": lambda w: {"chat_id": SEED},
    "get_changes": lambda w: {"chat_id": SEED, "since_version": 0},
    "has_children": lambda w: {"message_id": FIRST},
    "set_message_parent": lambda w: {"message_id": HEAD, "parent_id": FIRST},
    "is_ancestor": lambda w: {"ancestor_id": FIRST, "message_id": HEAD},
    "create_branch": lambda w: {
        "chat_id": SEED,
        "name": "new-branch",
        "head_message_id": HEAD,
        "activate": False,
    },
    "fork_branch": lambda w: {
        "chat_id": SEED,
        "base_name": "main",
        "head_message_id": HEAD,
        "activate": False,
        "messages": [],
    },
    "get_branch": lambda w: {"chat_id": SEED, "name": "main"},
    "get_branch_by_id": lambda w: {"branch_id": w.branch_id},
    "get_branch_state": lambda w: {"branch_id": w.branch_id},
    "get_active_branch": lambda w: {"chat_id": SEED},
    "set_active_branch": lambda w: {"chat_id": SEED, "branch_id": w.branch_id},
    "update_branch_head": lambda w: {
        "branch_id": w.branch_id,
        "message_id": HEAD,
        "expected_head": HEAD,
    },
    "append_messages": lambda w: {
        "branch_id": w.branch_id,
        "messages": [rec("new-m", SEED, HEAD)],
        "expected_head": HEAD,
        "new_head": "new-m",
        "updates": [],
    },
    "append_turn": lambda w: {
        "branch_id": w.branch_id,
        "messages": [rec("new-m", SEED, HEAD)],
        "expected_head": HEAD,
    },
    "list_branches": lambda w: {"chat_id": SEED},
    "rename_branch": lambda w: {"chat_id": SEED, "name": "main-v2", "new_name": "side"},
    "delete_branch": lambda w: {"chat_id": SEED, "name": "main-v2"},
    "open_chat": lambda w: {"chat_id": SEED, "user_id": OWNER},
    "load_chain_rows": lambda w: {
        "chat_id": SEED,
        "head_id": HEAD,
        "head_depth": 2,
        "chat_size": 2,
        "stop_depth": 0,
        "stop_at": None,
    },
    "using": lambda w: {"connection": None},
    "create_checkpoint": lambda w: {"chat_id": SEED, "name": "cp2", "message_id": HEAD},
    "get_checkpoint": lambda w: {"chat_id": SEED, "name": "cp"},
    "list_checkpoints": lambda w: {"chat_id": SEED},
    "delete_checkpoint": lambda w: {"chat_id": SEED, "name": "cp"},
    "search_messages": lambda w: {"chat_id": SEED, "query": "hello", "roles": ["user"], "limit": 5},
    "search_user_messages": lambda w: {
        "user_id": OWNER,
        "query": "hello",
        "roles": ["user"],
        "limit": 5,
    },
    "get_graph": lambda w: {"chat_id": SEED},
    "put_blob": lambda w: {
        "content": b"x",
        "media_type": "text/plain",
        "expected_hash": blob_hash(b"x"),
    },
    "read_blob": lambda w: {"blob": blob_hash(b"x")},
    "save_snapshot": lambda w: {"snapshot": _snapshot_draft(), "chat_id": SEED, "message_id": HEAD},
    "get_snapshot": lambda w: {"snapshot_id": w.snapshot_id, "with_content": True},
    "list_snapshots": lambda w: {"chat_id": SEED},
    "create_resolve_record": lambda w: {
        "chat_id": SEED,
        "branch_id": w.branch_id,
        "branch_name": "main",
        "head_message_id": HEAD,
        "renderer": "XmlRenderer()",
        "system_prompt": "prompt",
        "messages": [(HEAD, b"{}")],
    },
    "get_resolve_record": lambda w: {"record_id": w.record_id},
    "list_resolve_records": lambda w: {"chat_id": SEED},
    "export_chat": lambda w: {"chat_id": SEED},
    "import_chat": lambda w: {"export": w.other_export},
    "graph_outline": lambda w: {"chat_id": SEED, "fold": 6, "keep": [HEAD], "opened": []},
    "chain_page": lambda w: {"chat_id": SEED, "end_id": HEAD, "limit": 10},
    "prune": lambda w: {"older_than": timedelta(days=3650), "user_id": OWNER},
    "purge": lambda w: {"chat_id": SEED},
    "erase_user": lambda w: {"user_id": "nobody"},
    "copy_chat": lambda w: {
        "source_id": SEED,
        "new_chat_id": "copy",
        "up_to": HEAD,
        "user_id": OWNER,
    },
    "consistency_token": lambda w: {"chat_id": SEED},
    "read_after": lambda w: {"chat_id": SEED, "token": "0/16B3748"},
    "write_turn": lambda w: {"chat_id": SEED},
}

ENGINE_BASELINES: dict[str, Baseline] = {
    "__init__": lambda w: {
        "store": w.store,
        "chat_id": SEED,
        "user_id": OWNER,
        "metadata": None,
        "lazy_max_depth": 10,
        "lazy_max_items": 100,
        "after": None,
    },
    "set": lambda w: {"fragments": [hint("x")]},
    "resolve": lambda w: {"renderer": XmlRenderer(), "window": None, "record": False},
    "compact": lambda w: {"summarize": _summarize, "keep_last_turns": 0},
    "replay": lambda w: {"record_id": w.record_id},
    "snapshot": lambda w: {"snapshot": _snapshot_draft()},
    "load_snapshot": lambda w: {"snapshot_id": w.snapshot_id, "with_content": False},
    "save": lambda w: {"branch": True},
    "begin_turn": lambda w: {"user_fragment": user("x")},
    "complete_turn": lambda w: {"assistant_fragment": assistant_text("x")},
    "rewind": lambda w: {"message_id": FIRST},
    "checkpoint": lambda w: {"name": "cp2"},
    "restore": lambda w: {"checkpoint": "cp"},
    "btw": lambda w: {"name": None},
    "rename_branch": lambda w: {"name": "main-v2", "new_name": "side"},
    "delete_branch": lambda w: {"name": "main-v2"},
    "switch_branch": lambda w: {"name": "main-v2"},
    "update_chat": lambda w: {"title": "t", "metadata": {"a": 1}},
    "track_usage": lambda w: {"usage": {"input_tokens": 1}},
    "estimate": lambda w: {"model_id": "gpt-4o", "renderer": XmlRenderer()},
    "inspect": lambda w: {"model_id": "gpt-4o", "renderer": XmlRenderer()},
    "unset": lambda w: {"name": "hint"},
    "render": lambda w: {"renderer": XmlRenderer()},
}


async def _summarize(messages: list[Message]) -> str:
    return "a summary"


@dataclass(frozen=True)
class WrongCall:
    """One argument of one public method replaced by a value of the wrong type."""

    owner: str
    method: str
    parameter: str
    value: object
    run: Call = field(compare=False)

    def __str__(self) -> str:
        return f"{self.owner}.{self.method}({self.parameter}={self.value!r})"


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The methods of the public API of ``cls`` that take arguments (and its constructor)."""
    out: dict[str, Callable[..., Any]] = {"__init__": cls.__init__}
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_"):
            continue
        parameters = list(inspect.signature(member).parameters)[1:]
        if parameters:
            out[name] = member
    return out


def wrong_calls(cls: type, baselines: dict[str, Baseline]) -> Iterator[WrongCall]:
    """Every public method of ``cls`` called with one argument of a wrong type."""
    for name, method in public_methods(cls).items():
        if name not in baselines:
            raise AssertionError(
                f"{cls.__name__}.{name} has no baseline in test_hostile.py; add valid arguments "
                "for it so its arguments are checked"
            )
        signature = inspect.signature(method)
        for parameter in list(signature.parameters.values())[1:]:
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                continue
            annotation = str(parameter.annotation)
            if annotation not in WRONG:
                raise AssertionError(
                    f"no wrong values for {cls.__name__}.{name}({parameter.name}: {annotation}); "
                    "add the annotation to WRONG in test_hostile.py"
                )
            for value in WRONG[annotation]:
                yield WrongCall(
                    cls.__name__,
                    name,
                    parameter.name,
                    value,
                    _wrong_call(cls, name, parameter, baselines[name], value),
                )


def _wrong_call(
    cls: type, name: str, parameter: inspect.Parameter, baseline: Baseline, value: object
) -> Call:
    async def run(w: World) -> object:
        kwargs = baseline(w)
        if name == "__init__":
            kwargs[parameter.name] = value
            return cls(**kwargs)
        target: Any = w.store if cls is SqlContextStore else w.engine()
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            result = getattr(target, name)(*kwargs[parameter.name][:-1], value)
        else:
            kwargs[parameter.name] = value
            result = getattr(target, name)(**kwargs)
        return await result if inspect.isawaitable(result) else result

    return run


def type_entries() -> Iterator[Entry]:
    def calls(cls: type, baselines: dict[str, Baseline]) -> tuple[Call, ...]:
        return tuple(named(str(c), c.run) for c in wrong_calls(cls, baselines))

    yield Entry(
        "wrong-type-store",
        "None, an int, bytes, a list, a dict or a str where another type is expected, for "
        "every argument of every SqlContextStore method (and its constructor)",
        InvalidTypeError,
        "Pass the documented type: the message names the argument and the type it needs.",
        calls(SqlContextStore, STORE_BASELINES),
    )
    yield Entry(
        "wrong-type-engine",
        "None, an int, bytes, a list, a dict or a str where another type is expected, for "
        "every argument of every ContextEngine method (and its constructor)",
        InvalidTypeError,
        "Pass the documented type: the message names the argument and the type it needs.",
        calls(ContextEngine, ENGINE_BASELINES),
    )


CATALOGUE: tuple[Entry, ...] = (
    *size_entries(),
    *string_field_entries(),
    *long_id_entries(),
    *json_value_entries(),
    *nesting_entries(),
    *self_reference_entries(),
    *literal_entries(),
    *graph_entries(),
    *snapshot_entries(),
    *range_entries(),
    *import_entries(),
    *lifecycle_entries(),
    *renderer_entries(),
    *type_entries(),
)


# --- the tests ---------------------------------------------------------------------------------


def test_the_catalogue_is_large_and_its_keys_unique() -> None:
    keys = [entry.key for entry in CATALOGUE]
    assert len(keys) >= 40
    assert len(set(keys)) == len(keys)
    assert all(entry.calls for entry in CATALOGUE)


@pytest.mark.parametrize("entry", CATALOGUE, ids=[entry.key for entry in CATALOGUE])
async def test_hostile_input(world: World, entry: Entry) -> None:
    store = world.store
    before = await dump(store)
    seeded = {chat_id: await store.export_chat(chat_id) for chat_id in (SEED, OTHER)}
    failures: list[str] = []
    for call in entry.calls:
        if entry.error is None:
            await call(world)
            continue
        try:
            await call(world)
        except ContextError as error:
            problem = _judge(entry, error)
        except Exception as error:  # the point: catch whatever escapes
            problem = f"raised {type(error).__module__}.{type(error).__name__}: {error}"
        else:
            problem = "raised nothing"
        if problem is None and await dump(store) != before:
            problem = "changed the database"
        if problem is not None:
            failures.append(f"{call.__name__}: {problem}")
    assert not failures, "\n".join(failures)
    if entry.error is None:
        for chat_id, export in seeded.items():
            assert await store.export_chat(chat_id) == export, f"chat {chat_id} changed"


def _judge(entry: Entry, error: ContextError) -> str | None:
    """What is wrong with the error a call raised, or None."""
    assert entry.error is not None
    shown = f"{type(error).__name__}: {str(error)[:300]}"
    if not isinstance(error, entry.error):
        return f"expected {entry.error.__name__}, got {shown}"
    if isinstance(error, InvalidTypeError) and not issubclass(entry.error, InvalidTypeError):
        return f"expected a value error, got {shown}"
    message = str(error).casefold()
    missing = [phrase for phrase in entry.says if phrase.casefold() not in message]
    if missing:
        return f"message lacks {missing}: {shown}"
    return None


async def test_set_refuses_exactly_what_renderers_refuse() -> None:
    """ContextEngine.set() checks fragment trees up front with the renderers' own limit: the
    deepest data a renderer shows passes, one level more fails both; a value used twice (not
    containing itself) is fine."""
    shared, items = hint("shared"), ["x"]
    cases = {
        "deepest": (hint(deep_list(199)), True),
        "one level more": (hint(deep_list(200)), False),
        "deepest fragments": (deep_fragment(100), True),  # a fragment and its list: 2 levels
        "one fragment more": (deep_fragment(101), False),
        "shared fragment": (fragment("twice", shared, [shared, {"again": shared}]), True),
        "shared list": (hint({"a": items, "b": [items, items]}), True),
    }
    async with InMemoryContextStore() as store:
        for name, (value, renderable) in cases.items():
            for renderer in RENDERERS:
                try:
                    renderer().render([value])
                    rendered = True
                except InvalidInputError:
                    rendered = False
                assert rendered is renderable, (name, renderer.__name__)
            engine = ContextEngine(store=store, chat_id="c", user_id="u")
            try:
                engine.set(value)
                accepted = True
            except InvalidInputError:
                accepted = False
            assert accepted is renderable, name


# --- the docs table ----------------------------------------------------------------------------


def docs_table() -> str:
    """The "Hostile input" table of docs/reliability.md, made from the catalogue."""
    lines = ["| Case | Input | Error | What to do |", "| --- | --- | --- | --- |"]
    for entry in CATALOGUE:
        error = "accepted" if entry.error is None else f"`{entry.error.__name__}`"
        cells = (f"`{entry.key}`", entry.input, error, entry.advice)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def _docs_parts() -> tuple[str, str, str]:
    text = DOCS.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    body, _, tail = rest.partition(END)
    return head, body, tail


def test_the_docs_table_lists_every_entry() -> None:
    head, body, _ = _docs_parts()
    assert head.index("## Faults") < head.index("## Hostile input"), "section order"
    assert body.strip() == docs_table(), (
        "docs/reliability.md is out of date: run python -m tests.reliability.test_hostile "
        "--write-docs"
    )


def write_docs() -> None:
    head, _, tail = _docs_parts()
    DOCS.write_text(f"{head}{BEGIN}\n{docs_table()}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-docs"]:
        write_docs()
    else:
        print(docs_table())
