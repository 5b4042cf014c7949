"""OpenTelemetry tracing for dex (``pip install 'dex-engine[tracing]'``).

``dex.Engine(adapter, ..., tracing=OpenTelemetryTracing())`` traces each run: a
``dex.start <workflow>`` span in the caller's trace when the run is started, and under it a
``dex.workflow-task <workflow>`` span per workflow task and a ``dex.activity <activity>`` span
per activity attempt, with the run id, names and attempt as attributes. The context travels
with the run's history (W3C trace context by default, or whatever propagator is configured), so
spans from every process that works on the run join one trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry import propagate, trace
from opentelemetry.trace import Status, StatusCode, TracerProvider

from dex.app.ports.tracing import Carrier


class OpenTelemetryTracing:
    """The tracing port over an OpenTelemetry tracer (the global provider unless one is given)."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("dex", tracer_provider=tracer_provider)

    @contextlib.contextmanager
    def start_run(self, workflow_name: str, attributes: Mapping[str, str]) -> Iterator[Carrier]:
        with self._tracer.start_as_current_span(f"dex.start {workflow_name}", attributes=dict(attributes)):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield tuple(sorted(carrier.items()))

    @contextlib.contextmanager
    def span(self, name: str, trace_context: Carrier, attributes: Mapping[str, str | int]) -> Iterator[None]:
        parent = propagate.extract(dict(trace_context)) if trace_context else None
        with self._tracer.start_as_current_span(
            name, context=parent, attributes=dict(attributes), record_exception=True
        ) as span:
            try:
                yield
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise
