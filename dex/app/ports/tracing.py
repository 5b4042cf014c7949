"""The tracing port: spans for runs and tasks, with context carried through the run's history.

``start_workflow`` opens a span in the caller's trace and stores its context in the run's
``RunCreated`` (children inherit it, activity tasks carry it), so every workflow-task and
activity span of the run, on whichever process runs it, joins that trace. The OpenTelemetry
implementation is :mod:`dex.adapters.observability.otel`; without one, nothing is traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager as ContextManager
from typing import Protocol

Carrier = tuple[tuple[str, str], ...]


class Tracing(Protocol):
    def start_run(self, workflow_name: str, attributes: Mapping[str, str]) -> ContextManager[Carrier]:
        """A span for starting a run, in the caller's trace; yields the context to store."""
        ...

    def span(self, name: str, trace_context: Carrier, attributes: Mapping[str, str | int]) -> ContextManager[None]:
        """A span whose parent is the stored ``trace_context``."""
        ...


class NoTracing:
    """Traces nothing (with one shared do-nothing context: every task of a workflow opens spans)."""

    def start_run(self, workflow_name: str, attributes: Mapping[str, str]) -> ContextManager[Carrier]:
        return _NO_CARRIER

    def span(self, name: str, trace_context: Carrier, attributes: Mapping[str, str | int]) -> ContextManager[None]:
        return _NO_SPAN


_NO_CARRIER: ContextManager[Carrier] = contextlib.nullcontext(())
_NO_SPAN: ContextManager[None] = contextlib.nullcontext()
