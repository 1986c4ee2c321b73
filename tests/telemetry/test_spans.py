"""Spans and durations of the engine's verbs and the store's searches, on SQLite and PostgreSQL.

Each verb is one span ``agentcontext.<verb>`` with its attributes, current while the store runs
the call's statements, a child of the caller's span, ended with an error status when the call
fails or is cancelled, and one measurement of ``agentcontext.operation.duration``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import event

from agentcontext import (
    ContextEngine,
    ContextWindow,
    InvalidTypeError,
    Message,
    MessageNotFoundError,
    SqlContextStore,
    assistant_text,
    fragment,
    role,
    user,
)
from agentcontext import _telemetry as t
from tests.telemetry.conftest import Otel

FILLER = "the ledger balances every debit with a credit, and the auditor reads it twice " * 3


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def engine_attributes(verb: str, branch: str = "main", **extra: Any) -> dict[str, Any]:
    return {
        t.OPERATION: verb,
        t.CONVERSATION_ID: "c1",
        t.USER_ID: "u1",
        t.BRANCH: branch,
        **extra,
    }


def saved(attempts: int = 1, grafts: int = 0, forked: bool = False) -> dict[str, Any]:
    return {t.SAVE_ATTEMPTS: attempts, t.SAVE_GRAFTS: grafts, t.BRANCH_FORKED: forked}


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


@contextmanager
def statement_spans(store: SqlContextStore) -> Iterator[list[int]]:
    """The id of the span current when each SQL statement of the store runs."""
    seen: list[int] = []

    def before(*_: Any) -> None:
        seen.append(trace.get_current_span().get_span_context().span_id)

    event.listen(store.engine.sync_engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", before)


async def summarize(messages: list[Message]) -> str:
    return f"summary of {len(messages)} messages"


def make(store: SqlContextStore, chat_id: str = "c1") -> ContextEngine:
    return ContextEngine(store=store, chat_id=chat_id, user_id="u1")


# --- names and attributes ----------------------------------------------------------------------


async def test_a_turn_saved_then_resolved(store: SqlContextStore, otel: Otel) -> None:
    engine = make(store)
    engine.set(role("You are terse."), user("hello", id="q1"), assistant_text("hi", id="a1"))
    await engine.save()
    engine.set(user("and now?", id="q2"))
    result = await engine.resolve()

    assert [s.name for s in otel.ours()] == ["agentcontext.save", "agentcontext.resolve"]
    assert attributes(otel.span("agentcontext.save")) == engine_attributes("save", **saved())
    assert [m.id for m in result.messages] == ["q1", "a1", "q2"]
    assert attributes(otel.span("agentcontext.resolve")) == engine_attributes(
        "resolve",
        **{t.MESSAGES_SENT: 3, t.MESSAGES_OMITTED: 0, t.COMPACTION_APPLIED: False},
    )
    for span in otel.ours():
        assert span.kind is SpanKind.INTERNAL
        assert span.status.status_code is StatusCode.UNSET
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == "agentcontext"


async def test_a_streamed_turn_is_one_span_per_call(store: SqlContextStore, otel: Otel) -> None:
    """begin_turn and complete_turn save through save(): that save is part of their span."""
    engine = make(store)
    placeholder = await engine.begin_turn(user("stream it", id="q1"))
    await engine.complete_turn(assistant_text("streamed"))
    assert [s.name for s in otel.ours()] == [
        "agentcontext.begin_turn",
        "agentcontext.complete_turn",
    ]
    assert attributes(otel.span("agentcontext.begin_turn")) == engine_attributes(
        "begin_turn", **saved()
    )
    assert attributes(otel.span("agentcontext.complete_turn")) == engine_attributes(
        "complete_turn", **saved()
    )
    assert otel.measured() == {("begin_turn", None): 1, ("complete_turn", None): 1}
    # A whole turn retried after it landed writes nothing: no compare-and-swap attempt.
    again = make(store)
    assert await again.begin_turn(user("stream it", id="q1")) == placeholder
    assert attributes(otel.spans("agentcontext.begin_turn")[-1]) == engine_attributes(
        "begin_turn", **saved(attempts=0)
    )


async def test_resolve_in_a_window_after_a_compaction(store: SqlContextStore, otel: Otel) -> None:
    engine = make(store)
    for i in range(6):
        engine.set(user(f"question {i} {FILLER}"), assistant_text(f"answer {i} {FILLER}"))
        await engine.save()
    compaction = await engine.compact(summarize, keep_last_turns=4)
    window = ContextWindow(400)
    result = await engine.resolve(window=window)

    assert attributes(otel.span("agentcontext.compact")) == engine_attributes(
        "compact", **{t.COMPACTION_FOLDED: compaction.folded}
    )
    assert compaction.folded == 4
    assert result.messages[0].id == compaction.id  # the summary is always kept
    assert result.omitted and result.estimate is not None
    assert attributes(otel.span("agentcontext.resolve")) == engine_attributes(
        "resolve",
        **{
            t.MESSAGES_SENT: len(result.messages),
            t.MESSAGES_OMITTED: len(result.omitted),
            t.WINDOW_TOKENS: result.estimate,
            t.COMPACTION_APPLIED: True,
        },
    )


async def test_rewind_names_its_new_branch(store: SqlContextStore, otel: Otel) -> None:
    engine = make(store)
    engine.set(user("one", id="q1"), assistant_text("two", id="a1"))
    await engine.save()
    info = await engine.rewind("q1")
    assert info.name == "main-v2"
    assert attributes(otel.span("agentcontext.rewind")) == engine_attributes(
        "rewind", "main-v2", **{t.BRANCH_FORKED: True}
    )


async def test_a_resent_message_forks_and_says_so(store: SqlContextStore, otel: Otel) -> None:
    engine = make(store)
    engine.set(user("first", id="q1"), assistant_text("answer", id="a1"))
    await engine.save()
    engine.set(assistant_text("a better answer", id="a1"))
    await engine.save()
    assert engine.branch == "main-v2"
    first, second = otel.spans("agentcontext.save")
    assert attributes(first) == engine_attributes("save", **saved())
    assert attributes(second) == engine_attributes("save", "main-v2", **saved(0, 0, True))


async def test_a_save_that_lost_the_race_counts_its_graft(
    store: SqlContextStore, store_url: str, otel: Otel
) -> None:
    """Another process moved the head after this engine read it: the turn is grafted."""
    engine = make(store)
    engine.set(user("first", id="q1"))
    await engine.save()
    async with SqlContextStore(store_url) as elsewhere:
        other = make(elsewhere)
        other.set(user("meanwhile", id="q2"))
        await other.save()
    engine.set(user("late", id="q3"))
    await engine.save()
    assert [m.id for m in (await engine.resolve()).messages] == ["q1", "q2", "q3"]
    *_, late = otel.spans("agentcontext.save")
    assert attributes(late) == engine_attributes("save", **saved(attempts=2, grafts=1))


async def test_searches(store: SqlContextStore, otel: Otel) -> None:
    engine = make(store)
    engine.set(user("where is the ledger?"), assistant_text("the ledger is on the desk"))
    await engine.save()
    chat_hits = await store.search_messages("c1", "ledger")
    user_hits = await store.search_user_messages("u1", "desk")
    assert (len(chat_hits), len(user_hits)) == (2, 1)
    chat_span, user_span = otel.spans("agentcontext.search")
    assert attributes(chat_span) == {
        t.OPERATION: "search",
        t.SEARCH_SCOPE: "chat",
        t.CONVERSATION_ID: "c1",
        t.SEARCH_HITS: 2,
    }
    assert attributes(user_span) == {
        t.OPERATION: "search",
        t.SEARCH_SCOPE: "user",
        t.USER_ID: "u1",
        t.SEARCH_HITS: 1,
    }
    assert otel.measured() == {("save", None): 1, ("search", None): 2}


# --- nesting -----------------------------------------------------------------------------------


async def test_a_save_in_the_callers_span_runs_its_statements_under_its_own(
    store: SqlContextStore, otel: Otel
) -> None:
    engine = make(store)
    await engine.initialize()
    engine.set(user("hello"), assistant_text("hi"))
    with (
        statement_spans(store) as seen,
        otel.tracer.start_as_current_span("handle request") as mine,
    ):
        await engine.save()
        assert trace.get_current_span() is mine
    save = otel.span("agentcontext.save")
    assert parent_id(save) == mine.get_span_context().span_id
    assert save.context is not None and save.context.trace_id == mine.get_span_context().trace_id
    assert seen and set(seen) == {span_id(save)}


async def test_statements_are_children_under_sqlalchemy_instrumentation(
    store: SqlContextStore, otel: Otel
) -> None:
    engine = make(store)
    await engine.initialize()
    instrumentor = SQLAlchemyInstrumentor()
    # The instrumentation declares SQLAlchemy < 2.1; the events it listens to are the same in
    # 2.1, so skip its version check.
    instrumentor.instrument(
        engine=store.engine.sync_engine, tracer_provider=otel.provider, skip_dep_check=True
    )
    try:
        engine.set(user("hello"))
        await engine.save()
        await store.search_messages("c1", "hello")
    finally:
        instrumentor.uninstrument()
    save, search = otel.span("agentcontext.save"), otel.span("agentcontext.search")
    clients = [s for s in otel.spans() if s.kind is SpanKind.CLIENT]
    statements = [s for s in clients if s.name != "connect"]
    assert statements
    assert {parent_id(s) for s in clients} == {span_id(save), span_id(search)}
    assert {parent_id(s) for s in statements} == {span_id(save), span_id(search)}


async def test_a_search_inside_a_verb_is_a_child_span(store: SqlContextStore, otel: Otel) -> None:
    """A lazy fragment that searches while resolve() runs: its search nests under resolve."""
    engine = make(store)
    engine.set(user("remember the ledger"))
    await engine.save()

    async def recall(context: Any) -> str:
        hits = await store.search_messages("c1", "ledger")
        return f"{len(hits)} earlier mention"

    engine.set(fragment("memory", recall))
    result = await engine.resolve()
    assert "1 earlier mention" in result.system_prompt
    search, resolve = otel.spans("agentcontext.search"), otel.spans("agentcontext.resolve")
    assert len(search) == 1 and len(resolve) == 1
    assert parent_id(search[0]) == span_id(resolve[0])


# --- failures and cancellation -----------------------------------------------------------------


async def test_a_failed_call_is_an_error_span(store: SqlContextStore, otel: Otel) -> None:
    engine = make(store)
    engine.set(user("hello", id="q1"))
    await engine.save()
    with pytest.raises(MessageNotFoundError) as caught:
        await engine.rewind("no-such-message")
    with pytest.raises(InvalidTypeError):
        await store.search_messages(["not", "an", "id"], "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        await store.search_messages("c1", 42)  # type: ignore[arg-type]

    rewind = otel.span("agentcontext.rewind")
    assert rewind.status.status_code is StatusCode.ERROR
    assert rewind.status.description == str(caught.value)
    # It started no branch: the span does not say it forked, and names the branch it stayed on.
    assert attributes(rewind) == engine_attributes(
        "rewind", **{t.ERROR_TYPE: "MessageNotFoundError"}
    )
    assert engine.branch == "main"
    [raised] = rewind.events
    assert raised.name == "exception"
    assert raised.attributes is not None
    assert raised.attributes["exception.type"].endswith("MessageNotFoundError")
    assert raised.attributes["exception.message"] == str(caught.value)

    not_an_id, not_text = otel.spans("agentcontext.search")
    # A value that is no id is left off the span; the error says what was wrong.
    assert attributes(not_an_id) == {
        t.OPERATION: "search",
        t.SEARCH_SCOPE: "chat",
        t.ERROR_TYPE: "InvalidTypeError",
    }
    assert attributes(not_text)[t.CONVERSATION_ID] == "c1"
    assert otel.measured() == {
        ("save", None): 1,
        ("rewind", "MessageNotFoundError"): 1,
        ("search", "InvalidTypeError"): 2,
    }


async def test_a_cancelled_save_ends_its_span_and_restores_the_context(
    store: SqlContextStore, otel: Otel
) -> None:
    """Cancelled while its write runs: the span ends as cancelled, the caller's span is current
    again, and saving again stores the turn once."""
    engine = make(store)
    await engine.initialize()
    me = asyncio.current_task()
    assert me is not None
    writes: list[str] = []

    def cancel_the_caller(*args: Any) -> None:
        statement: str = args[2]
        if "insert" in statement.lower():
            writes.append(statement)
            if len(writes) == 1:
                me.cancel()

    engine.set(user("hello", id="q1"), assistant_text("hi", id="a1"))
    with otel.tracer.start_as_current_span("handler") as mine:
        event.listen(store.engine.sync_engine, "before_cursor_execute", cancel_the_caller)
        try:
            with pytest.raises(asyncio.CancelledError):
                await engine.save()
        finally:
            event.remove(store.engine.sync_engine, "before_cursor_execute", cancel_the_caller)
            me.uncancel()
        assert trace.get_current_span() is mine
        assert t._CURRENT.get() is None
        await engine.save()
    assert otel.open == {}
    cancelled, retried = otel.spans("agentcontext.save")
    assert cancelled.status.status_code is StatusCode.ERROR
    assert cancelled.status.description == "cancelled"
    assert attributes(cancelled)[t.ERROR_TYPE] == "CancelledError"
    assert attributes(cancelled)[t.SAVE_ATTEMPTS] == 1
    assert parent_id(cancelled) == parent_id(retried) == mine.get_span_context().span_id
    assert retried.status.status_code is StatusCode.UNSET
    assert [m.id for m in (await engine.resolve()).messages] == ["q1", "a1"]
    assert otel.measured() == {
        ("save", "CancelledError"): 1,
        ("save", None): 1,
        ("resolve", None): 1,
    }


async def test_a_timed_out_resolve_is_a_cancelled_span(store: SqlContextStore, otel: Otel) -> None:
    engine = make(store)
    engine.set(user("hello"))
    await engine.save()
    gate = asyncio.Event()

    async def slow(context: Any) -> str:
        await gate.wait()
        return "never"

    engine.set(fragment("slow", slow))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(engine.resolve(), timeout=0.01)
    resolve = otel.span("agentcontext.resolve")
    assert resolve.status.status_code is StatusCode.ERROR
    assert attributes(resolve)[t.ERROR_TYPE] == "CancelledError"
    assert otel.open == {}


# --- the histogram and the decorators ------------------------------------------------------------


async def test_every_call_is_measured_once(store: SqlContextStore, otel: Otel) -> None:
    engine = make(store)
    for i in range(3):
        engine.set(user(f"q{i}"))
        await engine.save()
    await engine.resolve()
    points = otel.durations()
    by_verb = {dict(p.attributes or {})[t.OPERATION]: p for p in points}
    assert set(by_verb) == {"save", "resolve"}
    assert by_verb["save"].count == 3 and by_verb["resolve"].count == 1
    for point in points:
        assert tuple(point.explicit_bounds) == t.DURATION_BUCKETS
        assert 0 < point.min <= point.max < 60
        assert sum(point.bucket_counts) == point.count
    assert otel.durations() == []  # deltas: nothing more was measured


def test_instrumented_methods_keep_their_signatures() -> None:
    for method in (
        ContextEngine.resolve,
        ContextEngine.save,
        ContextEngine.begin_turn,
        ContextEngine.complete_turn,
        ContextEngine.compact,
        ContextEngine.rewind,
        SqlContextStore.search_messages,
        SqlContextStore.search_user_messages,
    ):
        assert inspect.iscoroutinefunction(method)
        wrapped = method.__wrapped__  # type: ignore[attr-defined]
        assert inspect.signature(method) == inspect.signature(wrapped)
        assert method.__doc__ == wrapped.__doc__
        assert method.__name__ == wrapped.__name__
