"""A broken OpenTelemetry pipeline never fails a call, on SQLite and PostgreSQL.

A span processor that raises when a span starts or ends, a meter provider that raises when the
duration is recorded, a tracer provider that cannot give a tracer: every call still returns its
own result (committed) or raises its own exception (never chained to the telemetry error), and
agentcontext logs each kind of failure (phase and exception type) once on its logger. A call
that failed says so on its span, and claims nothing it did not do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode
from sqlalchemy import event

from agentcontext import (
    ContextEngine,
    MessageNotFoundError,
    SqlContextStore,
    assistant_text,
    user,
)
from agentcontext import _telemetry as t
from tests.telemetry.conftest import Faults, Otel, TelemetryFault


def make(store: SqlContextStore, chat_id: str = "c1") -> ContextEngine:
    return ContextEngine(store=store, chat_id=chat_id, user_id="u1")


def chain(error: BaseException) -> Iterator[BaseException]:
    """The exception and every exception it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def reports(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What agentcontext logged of telemetry failures."""
    return [
        r
        for r in caplog.records
        if r.name == "agentcontext" and r.getMessage().startswith("OpenTelemetry raised")
    ]


def kinds(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The phase of each report, in the order they were logged."""
    found: list[str] = []
    for record in reports(caplog):
        message = record.getMessage()
        [phase] = [p for p, words in t._PHASES.items() if f" while {words};" in message]
        assert record.exc_info is not None and isinstance(record.exc_info[1], TelemetryFault)
        found.append(phase)
    return found


async def a_session_of_calls(store: SqlContextStore, store_url: str) -> MessageNotFoundError:
    """Save, resolve, search, rewind, a rewind that fails, a save on the new branch: each
    result is checked, then read back through another store. Returns the failed rewind's
    error."""
    engine = make(store)
    engine.set(user("where is the ledger?", id="q1"), assistant_text("on the desk", id="a1"))
    assert (await engine.save()).head_message_id == "a1"
    engine.set(user("and the pen?", id="q2"))
    resolved = await engine.resolve()
    assert [m.id for m in resolved.messages] == ["q1", "a1", "q2"]
    assert resolved.omitted == []
    chat_hits = await store.search_messages("c1", "ledger")
    assert [h.message.id for h in chat_hits] == ["q1"]
    user_hits = await store.search_user_messages("u1", "desk")
    assert [h.message.id for h in user_hits] == ["a1"]

    forked = await engine.rewind("q1")
    assert (forked.name, forked.head_message_id) == ("main-v2", "q1")
    assert engine.branch == "main-v2"
    with pytest.raises(MessageNotFoundError) as caught:
        await engine.rewind("no-such-message")
    assert str(caught.value) == "message 'no-such-message' does not exist in chat 'c1'"
    assert engine.branch == "main-v2"
    engine.set(assistant_text("on the shelf", id="a2"))
    assert (await engine.save()).head_message_id == "a2"

    assert trace.get_current_span() is trace.INVALID_SPAN
    assert t._CURRENT.get() is None
    # Committed: another store reads it all back.
    async with SqlContextStore(store_url) as elsewhere:
        other = make(elsewhere)
        assert [m.id for m in (await other.resolve()).messages] == ["q1", "a2"]
        assert other.branch == "main-v2"
        await other.switch_branch("main")
        assert [m.id for m in (await other.resolve()).messages] == ["q1", "a1"]
    return caught.value


CALLS = {
    ("save", None): 2,
    ("resolve", None): 3,
    ("search", None): 2,
    ("rewind", None): 1,
    ("rewind", "MessageNotFoundError"): 1,
}
"""The calls of `a_session_of_calls`, counted by verb and error type (two resolves read back)."""


@pytest.mark.parametrize(
    "phases",
    [("start",), ("end",), ("duration",), ("end", "duration")],
    ids=lambda phases: "+".join(phases),
)
async def test_a_failing_pipeline_fails_no_call(
    store: SqlContextStore,
    store_url: str,
    otel: Otel,
    faults: Faults,
    caplog: pytest.LogCaptureFixture,
    phases: tuple[str, ...],
) -> None:
    faults.arm(*phases)
    failed = await a_session_of_calls(store, store_url)

    # Every call hit the fault, and its own error is the one the caller got, not chained to it.
    assert set(faults.raised) == set(phases)
    assert all(count >= sum(CALLS.values()) for count in faults.raised.values())
    assert not any(isinstance(e, TelemetryFault) for e in chain(failed))
    # One log line per kind of failure, however many calls it failed.
    assert kinds(caplog) == list(phases)

    ours = otel.ours()
    if "start" in phases:
        assert ours == []  # no span could start; the calls ran all the same
    else:
        assert [s.name for s in ours] == [
            "agentcontext.save",
            "agentcontext.resolve",
            "agentcontext.search",
            "agentcontext.search",
            "agentcontext.rewind",
            "agentcontext.rewind",
            "agentcontext.save",
            "agentcontext.resolve",
            "agentcontext.resolve",
        ]
        rewound, refused = otel.spans("agentcontext.rewind")
        assert rewound.status.status_code is StatusCode.UNSET
        assert dict(rewound.attributes or {})[t.BRANCH_FORKED] is True
        assert refused.status.status_code is StatusCode.ERROR
        assert refused.status.description == str(failed)
        assert dict(refused.attributes or {}) == {
            t.OPERATION: "rewind",
            t.CONVERSATION_ID: "c1",
            t.USER_ID: "u1",
            t.BRANCH: "main-v2",
            t.ERROR_TYPE: "MessageNotFoundError",
        }
    assert otel.measured() == ({} if "duration" in phases else CALLS)


async def test_a_failed_call_keeps_its_own_error(
    store: SqlContextStore, otel: Otel, faults: Faults, caplog: pytest.LogCaptureFixture
) -> None:
    """A rewind that fails and a save cancelled mid-write, while every phase of the pipeline
    fails: the caller gets the call's own error, and the context is the caller's again."""
    engine = make(store)
    engine.set(user("hello", id="q1"))
    await engine.save()
    faults.arm("end", "duration")
    with otel.tracer.start_as_current_span("handler") as mine:
        with pytest.raises(MessageNotFoundError) as caught:
            await engine.rewind("no-such-message")
        assert not any(isinstance(e, TelemetryFault) for e in chain(caught.value))
        assert trace.get_current_span() is mine

        me = asyncio.current_task()
        assert me is not None

        def cancel_the_caller(*args: Any) -> None:
            if "insert" in str(args[2]).lower():
                me.cancel()

        engine.set(assistant_text("hi", id="a1"))
        event.listen(store.engine.sync_engine, "before_cursor_execute", cancel_the_caller)
        try:
            with pytest.raises(asyncio.CancelledError) as cancelled:
                await engine.save()
        finally:
            event.remove(store.engine.sync_engine, "before_cursor_execute", cancel_the_caller)
            me.uncancel()
        assert not any(isinstance(e, TelemetryFault) for e in chain(cancelled.value))
        assert trace.get_current_span() is mine
        assert t._CURRENT.get() is None
        await engine.save()  # saved again, once
        faults.arm()  # the test's own span ends next
    assert [m.id for m in (await engine.resolve()).messages] == ["q1", "a1"]
    assert kinds(caplog) == ["end", "duration"]
    _, refused, cut, retried = (s for s in otel.ours() if s.name != "agentcontext.resolve")
    assert refused.status.status_code is StatusCode.ERROR
    assert t.BRANCH_FORKED not in (refused.attributes or {})
    assert cut.status.status_code is StatusCode.ERROR
    assert (cut.attributes or {})[t.ERROR_TYPE] == "CancelledError"
    assert t.BRANCH_FORKED not in (cut.attributes or {})  # cut off: nothing claimed
    assert retried.status.status_code is StatusCode.UNSET


class OtherFault(TelemetryFault):
    """Another exception type a pipeline raises."""


async def test_every_kind_is_logged_once(
    store: SqlContextStore, otel: Otel, faults: Faults, caplog: pytest.LogCaptureFixture
) -> None:
    """Another exception type in a phase already reported is another kind: logged once too."""
    engine = make(store)
    faults.arm("end")
    for i in range(3):
        engine.set(user(f"q{i}"))
        await engine.save()
    assert faults.raised == {"end": 3}
    faults.arm("end", error=OtherFault)
    for _ in range(2):
        await engine.resolve()
    assert faults.raised == {"end": 2}
    assert kinds(caplog) == ["end", "end"]
    assert [r.getMessage().split()[2] for r in reports(caplog)] == [
        "tests.telemetry.conftest.TelemetryFault",
        f"{__name__}.OtherFault",
    ]
    assert [s.name for s in otel.ours()] == ["agentcontext.save"] * 3 + ["agentcontext.resolve"] * 2


# --- a provider that cannot give a tracer or a meter --------------------------------------------

PROGRAM = """
import asyncio, json, logging

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

BROKEN = {"tracer": TracerProvider, "meter": MeterProvider}[WHAT]


class Broken(BROKEN):
    def get_tracer(self, *args, **kwargs):
        raise LookupError("no tracer today")

    def get_meter(self, *args, **kwargs):
        raise LookupError("no meter today")


if WHAT == "tracer":
    trace.set_tracer_provider(Broken())
else:
    metrics.set_meter_provider(Broken())

logged = []


class Keep(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())


logging.getLogger("agentcontext").addHandler(Keep())

from agentcontext import ContextEngine, SqlContextStore, assistant_text, user


async def main():
    async with SqlContextStore(URL) as store:
        engine = ContextEngine(store=store, chat_id="c", user_id="u")
        engine.set(user("hello", id="q"), assistant_text("hi", id="a"))
        saved = await engine.save()
        engine.set(user("again", id="q2"))
        await engine.save()
        result = await engine.resolve()
        hits = await store.search_messages("c", "hello")
    print(json.dumps({
        "head": saved.head_message_id,
        "messages": [m.id for m in result.messages],
        "hits": [h.message.id for h in hits],
        "logged": [m for m in logged if m.startswith("OpenTelemetry raised")],
    }))


asyncio.run(main())
"""


@pytest.mark.parametrize("what", ["tracer", "meter"])
def test_a_provider_that_fails_turns_telemetry_off(tmp_path: Any, what: str) -> None:
    """Runs in a fresh interpreter: a process has one global tracer and meter provider."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    code = f"WHAT = {what!r}\nURL = {url!r}\n" + textwrap.dedent(PROGRAM)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = json.loads(done.stdout)
    assert outcome["head"] == "a"
    assert outcome["messages"] == ["q", "a", "q2"]
    assert outcome["hits"] == ["q"]
    assert outcome["logged"] == [
        f"OpenTelemetry raised LookupError while {t._PHASES['setup']}; the agentcontext call "
        "went on unaffected (logged once per exception type and phase)"
    ]
