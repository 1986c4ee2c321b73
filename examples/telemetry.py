"""Trace an agent's turns and measure them with OpenTelemetry.

    pip install 'agentcontext[otel]' opentelemetry-sdk
    python examples/telemetry.py

One request of a chat service: it searches the user's earlier chats, resolves the context and
saves the answer, inside a span of its own. agentcontext adds one span per call under it
(``agentcontext.search``, ``agentcontext.resolve``, ``agentcontext.save``) and one measurement of
the ``agentcontext.operation.duration`` histogram. The SDK here keeps them in memory and the
script prints them; a service exports them instead (OTLP, see the docs).
"""

from __future__ import annotations

import asyncio

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentcontext import ContextEngine, InMemoryContextStore, SqlContextStore, assistant_text, user

# Once, at start-up: where spans and measurements go.
exporter = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(tracer_provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

tracer = trace.get_tracer("chat-service")


async def handle(store: SqlContextStore, chat_id: str, question: str, topic: str) -> str:
    """One request: the service's span, with agentcontext's calls inside it."""
    with tracer.start_as_current_span("handle request"):
        earlier = await store.search_user_messages("alice", topic)
        context = ContextEngine(store=store, chat_id=chat_id, user_id="alice")
        context.set(user(question))
        result = await context.resolve()
        answer = f"({len(result.messages)} messages sent, {len(earlier)} earlier hits)"
        context.set(assistant_text(answer))
        await context.save()
        return answer


def print_spans(spans: tuple[ReadableSpan, ...]) -> None:
    """Each span under its parent, with its attributes."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        children.setdefault(span.parent.span_id if span.parent else None, []).append(span)

    def show(span: ReadableSpan, depth: int) -> None:
        print("  " * depth + span.name)
        for key, value in (span.attributes or {}).items():
            print("  " * depth + f"  {key} = {value!r}")
        if span.context is not None:
            for child in children.get(span.context.span_id, []):
                show(child, depth + 1)

    for root in children.get(None, []):
        show(root, 0)


def print_durations(reader: InMemoryMetricReader) -> None:
    """How many calls of each verb the histogram measured."""
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if isinstance(point, HistogramDataPoint):
                        verb = (point.attributes or {})["agentcontext.operation.name"]
                        print(f"{metric.name} ({metric.unit}) {verb!r}: {point.count} call(s)")


async def main() -> None:
    async with InMemoryContextStore() as store:
        await handle(store, "chat-1", "What is a ledger?", topic="ledger")
        await handle(store, "chat-2", "Who keeps the ledger?", topic="ledger")
    print_spans(exporter.get_finished_spans()[-4:])  # the second request
    print_durations(reader)


if __name__ == "__main__":
    asyncio.run(main())
