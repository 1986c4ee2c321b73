"""An OpenTelemetry SDK for the telemetry tests: spans in memory, metrics read on demand.

OpenTelemetry allows one global tracer provider and one meter provider per process, so they
are installed once per session. The span processor records only while a test's `otel` fixture
is active, so the rest of the suite keeps nothing; the metric reader collects deltas, so each
test reads only what it recorded. A second span processor and the meter provider's exemplar
filter raise `TelemetryFault` in the phases a test's `faults` fixture arms: an OpenTelemetry
pipeline that breaks while a span starts, while it ends, or while a measurement is recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import (
    ExemplarFilter,
    Histogram,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.util.types import Attributes

from agentcontext import _telemetry


class Recorder(SpanProcessor):
    """Keeps the spans that end while it is on, and the ones started but not ended yet."""

    def __init__(self) -> None:
        self.on = False
        self.finished: list[ReadableSpan] = []
        self.open: dict[int, str] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.on:
            self.open[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            assert span.context is not None
            self.open.pop(span.context.span_id, None)
            self.finished.append(span)


class TelemetryFault(RuntimeError):
    """What a broken OpenTelemetry pipeline raises in these tests."""


class Faults(SpanProcessor, ExemplarFilter):
    """Raises `TelemetryFault` in the phases armed: ``start`` (a span processor's
    ``on_start``), ``end`` (its ``on_end``), ``duration`` (the meter provider's exemplar filter,
    called by every ``Histogram.record``). Registered after `Recorder`, which sees a span end
    before this processor fails."""

    def __init__(self) -> None:
        self.armed: set[str] = set()
        self.error: type[TelemetryFault] = TelemetryFault
        self.raised: dict[str, int] = {}
        self._exemplars = TraceBasedExemplarFilter()

    def arm(self, *phases: str, error: type[TelemetryFault] = TelemetryFault) -> None:
        """Raise ``error`` in ``phases`` from now on (none: disarm), counting from zero."""
        assert set(phases) <= {"start", "end", "duration"}
        self.armed = set(phases)
        self.error = error
        self.raised.clear()

    def _fail(self, phase: str) -> None:
        if phase in self.armed:
            self.raised[phase] = self.raised.get(phase, 0) + 1
            raise self.error(f"the telemetry pipeline broke ({phase})")

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._fail("start")

    def on_end(self, span: ReadableSpan) -> None:
        self._fail("end")

    def should_sample(
        self,
        value: float,
        time_unix_nano: int,
        attributes: Attributes,
        context: Context,
    ) -> bool:
        self._fail("duration")
        return self._exemplars.should_sample(value, time_unix_nano, attributes, context)


@dataclass
class Otel:
    """What a test reads: the spans that ended, the ones still open, the histogram."""

    recorder: Recorder
    reader: InMemoryMetricReader
    tracer: trace.Tracer
    provider: TracerProvider
    points: list[HistogramDataPoint] = field(default_factory=list)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """The finished spans (of one name), in the order they ended."""
        return [s for s in self.recorder.finished if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        [found] = self.spans(name)
        return found

    def ours(self) -> list[ReadableSpan]:
        return [s for s in self.recorder.finished if s.name.startswith("agentcontext.")]

    @property
    def open(self) -> dict[int, str]:
        return self.recorder.open

    def durations(self) -> list[HistogramDataPoint]:
        """The points of ``agentcontext.operation.duration`` recorded since the last read."""
        data = self.reader.get_metrics_data()
        found: list[HistogramDataPoint] = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == _telemetry.DURATION:
                        assert metric.unit == "s"
                        found.extend(metric.data.data_points)  # type: ignore[arg-type]
        self.points.extend(found)
        return found

    def measured(self) -> dict[tuple[str, str | None], int]:
        """Measurements since the last read, counted by verb and error type (None: it
        succeeded); a point with any other attribute fails the test."""
        counted: dict[tuple[str, str | None], int] = {}
        for point in self.durations():
            attributes = dict(point.attributes or {})
            assert set(attributes) <= {_telemetry.OPERATION, _telemetry.ERROR_TYPE}
            error = attributes.get(_telemetry.ERROR_TYPE)
            key = (str(attributes[_telemetry.OPERATION]), None if error is None else str(error))
            counted[key] = point.count
        return counted


_SESSION: dict[str, Any] = {}


def _install() -> tuple[Recorder, InMemoryMetricReader, TracerProvider]:
    if not _SESSION:
        recorder = Recorder()
        faults = Faults()
        provider = TracerProvider()
        provider.add_span_processor(recorder)
        provider.add_span_processor(faults)
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader(
            preferred_temporality={Histogram: AggregationTemporality.DELTA}
        )
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader], exemplar_filter=faults))
        assert trace.get_tracer_provider() is provider, "another test set a tracer provider"
        _SESSION.update(recorder=recorder, reader=reader, provider=provider, faults=faults)
    return _SESSION["recorder"], _SESSION["reader"], _SESSION["provider"]


@pytest.fixture
def otel() -> Iterator[Otel]:
    """Record spans and read the duration histogram for one test."""
    recorder, reader, provider = _install()
    reader.get_metrics_data()  # drop what earlier tests measured
    recorder.finished.clear()
    recorder.open.clear()
    recorder.on = True
    try:
        yield Otel(recorder, reader, provider.get_tracer("tests"), provider)
    finally:
        recorder.on = False


@pytest.fixture
def faults(otel: Otel) -> Iterator[Faults]:
    """The session's fault injector, disarmed after the test; what agentcontext logged of
    earlier faults is forgotten, so the test sees every first report."""
    injector: Faults = _SESSION["faults"]
    _telemetry._reported.clear()
    try:
        yield injector
    finally:
        injector.arm()
        _telemetry._reported.clear()
