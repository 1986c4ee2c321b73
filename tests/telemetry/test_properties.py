"""Any sequence of verbs, each possibly cancelled at any of its statements, keeps the spans whole.

After every call, whatever happened to it: exactly one new span, named for the call, a child of
the caller's span, ended, with an error status and ``error.type`` exactly when the call raised
(``CancelledError`` when it was cancelled); the caller's span is current again and no operation
is left behind. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import StatusCode
from sqlalchemy import event

from agentcontext import (
    ContextEngine,
    ContextError,
    Message,
    SqlContextStore,
    assistant_text,
    user,
)
from agentcontext import _telemetry as t
from tests.conftest import run_sync
from tests.telemetry.conftest import Otel

VERBS = (
    "save",
    "resolve",
    "rewind",
    "begin_turn",
    "complete_turn",
    "compact",
    "search",
    "search_user",
)

Steps = list[tuple[str, int | None]]
STEPS = st.lists(
    st.tuples(st.sampled_from(VERBS), st.none() | st.integers(min_value=0, max_value=4)),
    min_size=1,
    max_size=8,
)


async def summarize(messages: list[Message]) -> str:
    return f"{len(messages)} messages"


async def scenario(url: str, otel: Otel, steps: Steps) -> None:
    chat = uuid.uuid4().hex
    async with SqlContextStore(url) as store:
        engine = ContextEngine(store=store, chat_id=chat, user_id=chat)
        await engine.initialize()
        me = asyncio.current_task()
        assert me is not None
        armed: dict[str, Any] = {"at": None, "seen": 0}

        def maybe_cancel(*_: Any) -> None:
            if armed["at"] is None:
                return
            if armed["seen"] == armed["at"]:
                me.cancel()
            armed["seen"] += 1

        async def call(verb: str, n: int) -> object:
            if verb == "save":
                engine.set(user(f"question {n}"), assistant_text(f"answer {n}"))
                return await engine.save()
            if verb == "resolve":
                return await engine.resolve()
            if verb == "rewind":
                return await engine.rewind(engine.head_message_id or "no-such-message")
            if verb == "begin_turn":
                return await engine.begin_turn(user(f"streamed {n}"))
            if verb == "complete_turn":
                return await engine.complete_turn(assistant_text(f"streamed answer {n}"))
            if verb == "compact":
                return await engine.compact(summarize, keep_last_turns=1)
            if verb == "search":
                return await store.search_messages(chat, "question")
            return await store.search_user_messages(chat, "answer")

        otel.recorder.finished.clear()
        event.listen(store.engine.sync_engine, "before_cursor_execute", maybe_cancel)
        try:
            with otel.tracer.start_as_current_span("agent") as root:
                for n, (verb, cancel_at) in enumerate(steps):
                    armed.update(at=cancel_at, seen=0)
                    raised: str | None = None
                    try:
                        await call(verb, n)
                    except asyncio.CancelledError:
                        me.uncancel()
                        raised = "CancelledError"
                    except ContextError as exc:
                        raised = type(exc).__qualname__
                    finally:
                        armed["at"] = None

                    assert trace.get_current_span() is root
                    assert t._CURRENT.get() is None
                    assert otel.open == {root.get_span_context().span_id: "agent"}
                    ours = otel.ours()
                    assert len(ours) == n + 1
                    span = ours[-1]
                    assert span.name == f"agentcontext.{verb.removesuffix('_user')}"
                    assert span.parent is not None
                    assert span.parent.span_id == root.get_span_context().span_id
                    error = (span.attributes or {}).get(t.ERROR_TYPE)
                    assert error == raised
                    expected = StatusCode.UNSET if raised is None else StatusCode.ERROR
                    assert span.status.status_code is expected
        finally:
            event.remove(store.engine.sync_engine, "before_cursor_execute", maybe_cancel)
        assert otel.open == {}


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(steps=[("begin_turn", 0), ("begin_turn", None), ("complete_turn", 1)])
@example(steps=[("save", None), ("compact", None), ("rewind", 0), ("resolve", None)])
@given(steps=STEPS)
def test_every_call_is_one_ended_span_whatever_happens(
    store_url: str, otel: Otel, steps: Steps
) -> None:
    run_sync(lambda: scenario(store_url, otel, steps))
