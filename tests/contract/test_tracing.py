"""OpenTelemetry: a run's spans, from every task and activity, join the trace it was started in."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import dex
from dex.adapters.observability.otel import OpenTelemetryTracing


@dex.activity
def shout(text: str) -> str:
    if dex.activity_context().attempt == 1:
        raise ConnectionError("first attempt fails")
    return text.upper()


@dex.workflow(name="traced-child")
async def traced_child(ctx: dex.WorkflowContext, text: str) -> str:
    return await ctx.activity(shout, text, retry=dex.RetryPolicy(max_attempts=2))  # type: ignore[no-any-return]


@dex.workflow(name="traced")
async def traced(ctx: dex.WorkflowContext, text: str) -> str:
    return await ctx.child(traced_child, text)  # type: ignore[no-any-return]


def test_spans_of_a_run_and_its_children_join_the_callers_trace(adapter_factory: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = OpenTelemetryTracing(provider)
    engine = dex.Engine(adapter_factory(), workflows=[traced, traced_child], activities=[shout], tracing=tracing)
    tracer = provider.get_tracer("the-application")
    with tracer.start_as_current_span("http request") as request:
        run_id = engine.start_workflow(traced, "hi")
    engine.drain()
    assert engine.wait(run_id, timeout=1) == "HI"

    spans = exporter.get_finished_spans()
    names = [span.name for span in spans]
    assert names.count("dex.start traced") == 1
    assert names.count("dex.activity shout") == 2  # the failed attempt and the retry
    assert "dex.workflow-task traced" in names and "dex.workflow-task traced-child" in names
    trace_id = request.get_span_context().trace_id
    assert {span.context.trace_id for span in spans} == {trace_id}  # one trace, across the run
    (start,) = [s for s in spans if s.name == "dex.start traced"]
    assert start.parent is not None and start.parent.span_id == request.get_span_context().span_id
    tasks = [s for s in spans if s.name.startswith(("dex.workflow-task", "dex.activity"))]
    assert all(s.parent is not None and s.parent.span_id == start.context.span_id for s in tasks)
    failed = [s for s in spans if s.name == "dex.activity shout" and s.attributes["dex.attempt"] == 1]
    assert failed[0].status.status_code.name == "ERROR"
    assert {s.attributes["dex.run_id"] for s in tasks if s.name == "dex.workflow-task traced"} == {run_id}


def test_without_tracing_nothing_is_stored(adapter_factory: Any) -> None:
    engine = dex.Engine(adapter_factory(), workflows=[traced, traced_child], activities=[shout])
    run_id = engine.start_workflow(traced, "hi")
    assert engine.history(run_id)[0].event.trace_context == ()
