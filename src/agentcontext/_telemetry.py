"""OpenTelemetry spans and a duration histogram for the engine's verbs and the store's searches.

Nothing here imports OpenTelemetry when this module is imported. The first instrumented call
tries ``opentelemetry`` once: when it is missing, every instrumented call goes straight to the
method it wraps (one flag test), and nothing of OpenTelemetry is ever imported. When it is
installed, each call is one span, ``agentcontext.<verb>``, current while the call runs (so
SQLAlchemy's own instrumentation nests every statement of the call under it), and one
measurement of the histogram `DURATION` in seconds. Without a configured SDK the API's no-op
tracer and meter make that cheap too.

The engine and the store mark their methods with `verb` and `search`. Values known only deep
inside a call (the compare-and-swap attempts of a save, say) are reported with `add` and `note`
on the call's current operation; they cost one flag test when telemetry is off.

A verb an engine calls on itself (``begin_turn`` and ``complete_turn`` save through ``save``)
is part of the outer call's span, not a span of its own: one call of the user's, one span and
one duration.

Telemetry never fails a call nor changes what it returns or raises. An exception raised by
OpenTelemetry (a span processor, an exporter, a meter, a metric reader) while a span starts,
ends or is given its attributes, or while the duration is recorded, is swallowed: it is logged
on the ``agentcontext`` logger once per phase and exception type, and the caller gets the
call's own result or its own exception, never chained to the telemetry error.

A span says only what happened: a call that failed has an error status and ``error.type``,
and none of the attributes a success implies (a failed ``rewind`` does not say it forked).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Histogram
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "BRANCH",
    "BRANCH_FORKED",
    "COMPACTION_APPLIED",
    "COMPACTION_FOLDED",
    "CONVERSATION_ID",
    "DURATION",
    "DURATION_BUCKETS",
    "ERROR_TYPE",
    "MESSAGES_OMITTED",
    "MESSAGES_SENT",
    "OPERATION",
    "SAVE_ATTEMPTS",
    "SAVE_GRAFTS",
    "SEARCH_HITS",
    "SEARCH_SCOPE",
    "USER_ID",
    "WINDOW_TOKENS",
    "add",
    "note",
    "search",
    "verb",
]

P = ParamSpec("P")
R = TypeVar("R")

# --- names ---------------------------------------------------------------------------------

SCOPE = "agentcontext"
"""The instrumentation scope: the tracer's and the meter's name."""
DURATION = "agentcontext.operation.duration"
"""The histogram of call durations, in seconds (one measurement per instrumented call)."""
DURATION_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0
)  # fmt: skip
"""Advised bucket boundaries (seconds): a save or a search takes about a millisecond, and a
compaction waits for the model's summary."""

OPERATION = "agentcontext.operation.name"
"""The verb (``resolve``, ``save``, ``search``, ...): on spans and on the histogram."""
ERROR_TYPE = "error.type"
"""The exception's class name when the call failed (``HeadConflictError``,
``CancelledError``): on spans and on the histogram."""
CONVERSATION_ID = "gen_ai.conversation.id"
"""The chat id (OpenTelemetry's GenAI semantic conventions)."""
USER_ID = "agentcontext.user.id"
BRANCH = "agentcontext.branch.name"
"""The engine's branch after the call (the new one after a fork)."""
BRANCH_FORKED = "agentcontext.branch.forked"
"""Whether the call started a new branch (a rewind that succeeds always does; a save does when
it resends a stored message with other content). A failed rewind does not say it forked."""
MESSAGES_SENT = "agentcontext.messages.sent"
MESSAGES_OMITTED = "agentcontext.messages.omitted"
WINDOW_TOKENS = "agentcontext.window.tokens"
"""The estimated tokens of the request, when ``resolve`` fitted it into a window."""
COMPACTION_APPLIED = "agentcontext.compaction.applied"
"""Whether the messages ``resolve`` returned start with a compaction's summary."""
COMPACTION_FOLDED = "agentcontext.compaction.folded"
SAVE_ATTEMPTS = "agentcontext.save.attempts"
"""Compare-and-swap writes a save tried (0 when everything was stored already)."""
SAVE_GRAFTS = "agentcontext.save.grafts"
"""Times a save chained its turn again onto a head another writer had moved."""
SEARCH_SCOPE = "agentcontext.search.scope"
"""``chat`` (``search_messages``) or ``user`` (``search_user_messages``)."""
SEARCH_HITS = "agentcontext.search.hits"

_MAX_ID = 255
"""Ids longer than this are not ids (the call refuses them): they are left off the span."""

_SAVE_COUNTS: dict[str, AttributeValue] = {SAVE_ATTEMPTS: 0, SAVE_GRAFTS: 0}
_DEFAULTS: dict[str, dict[str, AttributeValue]] = {
    "save": _SAVE_COUNTS,
    "begin_turn": _SAVE_COUNTS,
    "complete_turn": _SAVE_COUNTS,
}
"""What a verb's span says when nothing inside the call reported otherwise, whether the call
succeeded or failed: counts of what the call did (zero when it did nothing of it)."""
_SAVED: dict[str, AttributeValue] = {BRANCH_FORKED: False}
_SUCCEEDED: dict[str, dict[str, AttributeValue]] = {
    "save": _SAVED,
    "begin_turn": _SAVED,
    "complete_turn": _SAVED,
    "rewind": {BRANCH_FORKED: True},
}
"""What a verb's span says, when nothing inside the call reported otherwise, only if the call
succeeded: a rewind that failed started no branch, and a save that failed may have been cut
off anywhere (a fork it did make is reported from inside the call)."""

_log = logging.getLogger("agentcontext")

_PHASES = {
    "setup": "getting its tracer and meter",
    "start": "starting a span",
    "context": "making a span current or restoring the caller's context",
    "failure": "recording a failed call on its span",
    "attributes": "setting a span's attributes",
    "end": "ending a span",
    "duration": f"recording the histogram {DURATION}",
}
"""Where a call into OpenTelemetry can fail: the key of `_report`, and its words."""

_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def _report(phase: str, problem: Exception) -> None:
    """Log an exception OpenTelemetry raised in ``phase``: once per phase and exception type
    (the process goes on calling OpenTelemetry, which may keep failing the same way)."""
    kind = type(problem)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    key = (phase, name)
    with _reported_lock:
        if key in _reported:
            return
        _reported.add(key)
    # Raised while the call's own exception was propagating: the log shows the telemetry
    # failure alone (the call's exception reaches the caller, untouched).
    problem.__suppress_context__ = True
    _log.warning(
        "OpenTelemetry raised %s while %s; the agentcontext call went on unaffected (logged "
        "once per exception type and phase)",
        name,
        _PHASES[phase],
        exc_info=problem,
    )


# --- state -----------------------------------------------------------------------------------


def _package_version() -> str:
    """The installed version, read from the package's metadata (no import of the package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentcontext")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


class _Otel:
    """The OpenTelemetry API, once imported: the tracer, the histogram, what a span needs."""

    __slots__ = ("attach", "detach", "duration", "error", "set_span_in_context", "tracer")

    def __init__(self) -> None:
        from opentelemetry import context, metrics, trace
        from opentelemetry.trace import Status, StatusCode

        version = _package_version()
        self.tracer: Tracer = trace.get_tracer(SCOPE, version)
        self.duration: Histogram = metrics.get_meter(SCOPE, version).create_histogram(
            DURATION,
            unit="s",
            description="Duration of agentcontext's engine verbs and searches",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.attach = context.attach
        self.detach = context.detach
        self.set_span_in_context = trace.set_span_in_context

        def error(description: str) -> Status:
            return Status(StatusCode.ERROR, description)

        self.error = error


_otel: _Otel | None = None
_checked = False
"""Whether the import of OpenTelemetry was tried (``_otel`` is None when it is missing)."""


def _load() -> _Otel | None:
    global _otel, _checked
    try:
        _otel = _Otel()
    except ImportError:
        _otel = None
    except Exception as problem:  # a tracer or meter provider that fails: telemetry off
        _report("setup", problem)
        _otel = None
    _checked = True
    return _otel


class _Operation:
    """One instrumented call in progress: whose it is, and what its inside reported."""

    __slots__ = ("counts", "notes", "owner")

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.counts: dict[str, int] = {}
        self.notes: dict[str, AttributeValue] = {}


_CURRENT: contextvars.ContextVar[_Operation | None] = contextvars.ContextVar(
    "agentcontext_operation", default=None
)


def add(key: str, amount: int = 1) -> None:
    """Add ``amount`` to the counter ``key`` of the current call's span (nothing when telemetry
    is off or no instrumented call is running)."""
    if _otel is None:
        return
    operation = _CURRENT.get()
    if operation is not None:
        operation.counts[key] = operation.counts.get(key, 0) + amount


def note(key: str, value: AttributeValue) -> None:
    """Set the attribute ``key`` of the current call's span (nothing when telemetry is off or no
    instrumented call is running)."""
    if _otel is None:
        return
    operation = _CURRENT.get()
    if operation is not None:
        operation.notes[key] = value


# --- what each operation says ----------------------------------------------------------------

Describe = Callable[[tuple[Any, ...]], Iterator[tuple[str, "AttributeValue"]]]
"""The attributes known when a call starts, from its arguments (``self`` first)."""
Outcome = Callable[[Any, Any], Iterator[tuple[str, "AttributeValue"]]]
"""The attributes known when a call ends, from ``self`` and the result (None on failure)."""


def _engine_start(args: tuple[Any, ...]) -> Iterator[tuple[str, AttributeValue]]:
    engine = args[0]
    yield CONVERSATION_ID, engine.chat_id
    yield USER_ID, engine.user_id


def _engine_end(engine: Any, result: Any) -> Iterator[tuple[str, AttributeValue]]:
    branch = engine.branch
    if branch is not None:
        yield BRANCH, branch


def _resolved(engine: Any, result: Any) -> Iterator[tuple[str, AttributeValue]]:
    yield from _engine_end(engine, result)
    if result is None:
        return
    messages = result.messages
    yield MESSAGES_SENT, len(messages)
    yield MESSAGES_OMITTED, len(result.omitted)
    if result.estimate is not None:
        yield WINDOW_TOKENS, result.estimate
    first = messages[0].metadata if messages else None
    yield COMPACTION_APPLIED, first is not None and "compaction" in first


def _compacted(engine: Any, result: Any) -> Iterator[tuple[str, AttributeValue]]:
    yield from _engine_end(engine, result)
    if result is not None:
        yield COMPACTION_FOLDED, result.folded


_OUTCOMES: dict[str, Outcome] = {"resolve": _resolved, "compact": _compacted}


def _search_start(scope: str) -> Describe:
    key = CONVERSATION_ID if scope == "chat" else USER_ID

    def describe(args: tuple[Any, ...]) -> Iterator[tuple[str, AttributeValue]]:
        yield SEARCH_SCOPE, scope
        if len(args) > 1 and isinstance(args[1], str) and 0 < len(args[1]) <= _MAX_ID:
            yield key, args[1]

    return describe


def _searched(store: Any, result: Any) -> Iterator[tuple[str, AttributeValue]]:
    if isinstance(result, list):
        yield SEARCH_HITS, len(result)


# --- the decorators --------------------------------------------------------------------------


def verb(
    name: str,
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Instrument an async method of `ContextEngine`: span ``agentcontext.<name>``."""
    return _instrument(name, _engine_start, _OUTCOMES.get(name, _engine_end))


def search(
    scope: str,
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Instrument a search method of a store: span ``agentcontext.search`` with its ``scope``
    (``chat`` or ``user``)."""
    return _instrument("search", _search_start(scope), _searched)


def _instrument(
    name: str, describe: Describe, outcome: Outcome
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    span_name = f"{SCOPE}.{name}"
    defaults = _DEFAULTS.get(name, {})
    claims = {**defaults, **_SUCCEEDED.get(name, {})}
    succeeded: dict[str, AttributeValue] = {OPERATION: name}

    def decorate(
        method: Callable[P, Coroutine[Any, Any, R]],
    ) -> Callable[P, Coroutine[Any, Any, R]]:
        @functools.wraps(method)
        async def instrumented(*args: P.args, **kwargs: P.kwargs) -> R:
            otel = _otel if _checked else _load()
            if otel is None:
                return await method(*args, **kwargs)
            current = _CURRENT.get()
            if current is not None and current.owner is args[0]:
                return await method(*args, **kwargs)  # part of the outer call
            operation = _Operation(args[0])
            span, recording, context_token = _start(otel, span_name, succeeded, describe, args)
            token = _CURRENT.set(operation)
            started = time.perf_counter()
            result: R | None = None
            measured: dict[str, AttributeValue] = succeeded
            try:
                result = await method(*args, **kwargs)
                return result
            except BaseException as exc:
                error = type(exc).__qualname__
                measured = {OPERATION: name, ERROR_TYPE: error}
                if recording and span is not None:
                    _failed(otel, span, exc, error)
                raise
            finally:
                elapsed = time.perf_counter() - started
                _CURRENT.reset(token)
                if context_token is not None:
                    try:
                        otel.detach(context_token)
                    except Exception as problem:
                        _report("context", problem)
                if span is not None:
                    if recording:
                        _finish(
                            span,
                            operation,
                            claims if measured is succeeded else defaults,
                            outcome,
                            args[0],
                            result,
                        )
                    try:
                        span.end()
                    except Exception as problem:
                        _report("end", problem)
                try:
                    otel.duration.record(elapsed, measured)
                except Exception as problem:
                    _report("duration", problem)

        return instrumented

    return decorate


def _start(
    otel: _Otel,
    name: str,
    attributes: dict[str, AttributeValue],
    describe: Describe,
    args: tuple[Any, ...],
) -> tuple[Span | None, bool, contextvars.Token[Context] | None]:
    """Start the call's span and make it current: the span (None when OpenTelemetry failed to
    start one), whether it records, and the token that restores the caller's context (None when
    the span could not be made current)."""
    try:
        span = otel.tracer.start_span(name, attributes={**attributes, **dict(describe(args))})
    except Exception as problem:
        _report("start", problem)
        return None, False, None
    try:
        recording = span.is_recording()
    except Exception as problem:
        _report("start", problem)
        recording = False
    try:
        token = otel.attach(otel.set_span_in_context(span))
    except Exception as problem:
        _report("context", problem)
        token = None
    return span, recording, token


def _failed(otel: _Otel, span: Span, exc: BaseException, error: str) -> None:
    try:
        description = "cancelled" if error == "CancelledError" else str(exc) or error
    except Exception:  # an exception whose str() fails
        description = error
    try:
        span.set_status(otel.error(description))
        span.set_attribute(ERROR_TYPE, error)
    except Exception as problem:
        _report("failure", problem)
    try:
        span.record_exception(exc)
    except Exception as problem:
        _report("failure", problem)


def _finish(
    span: Span,
    operation: _Operation,
    defaults: dict[str, AttributeValue],
    outcome: Outcome,
    owner: Any,
    result: Any,
) -> None:
    try:
        attributes: dict[str, AttributeValue] = dict(outcome(owner, result))
        for key, value in defaults.items():
            attributes.setdefault(key, value)
        attributes.update(operation.counts)
        attributes.update(operation.notes)
        span.set_attributes(attributes)
    except Exception as problem:
        _report("attributes", problem)
