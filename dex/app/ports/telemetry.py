"""Telemetry hooks: what the engine reports about its work, for metrics back ends to count.

Components call a :class:`Telemetry` at the points that matter to an operator (tasks claimed
and finished, leases lost, buffer flushes, leadership, queue depths, engine threads that died). The engine holds a
:class:`TelemetryHub` that forwards to any number of sinks, so a back end (Prometheus, see
:mod:`dex.adapters.observability.prometheus`) can be attached before or after the engine starts; with
no sink every hook is a no-op.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from dex.app.ports.store import QueueInfo


class Telemetry(Protocol):
    def tasks_claimed(self, kind: str, count: int) -> None:
        """``kind`` is "workflow" or "activity"."""
        ...

    def task_finished(self, kind: str, name: str, outcome: str, seconds: float) -> None:
        """One task executed. Activities: "completed", "failed" or "retried"; workflow tasks:
        "progressed", the status the run ended in ("completed", "failed", "cancelled"), or
        "retried" (the task failed for a reason outside its code and will be claimed again)."""
        ...

    def leases_lost(self, kind: str, count: int) -> None:
        """Results the store discarded because their lease had been lost."""
        ...

    def flushed(self, size: int, seconds: float) -> None: ...

    def leadership(self, leading: bool) -> None: ...

    def queue_depths(self, queues: Sequence[QueueInfo]) -> None: ...

    def thread_died(self, name: str) -> None:
        """An engine thread died (it is logged and replaced by a fresh one: ``dex.app.machinery.watchdog``)."""
        ...


class TelemetryHub:
    """Forwards every hook to the attached sinks (none by default)."""

    def __init__(self) -> None:
        self._sinks: tuple[Telemetry, ...] = ()
        self._lock = threading.Lock()

    def attach(self, sink: Telemetry) -> None:
        with self._lock:
            self._sinks = (*self._sinks, sink)

    @property
    def sinks(self) -> tuple[Telemetry, ...]:
        return self._sinks

    def __bool__(self) -> bool:
        return bool(self._sinks)

    def tasks_claimed(self, kind: str, count: int) -> None:
        for sink in self._sinks:
            sink.tasks_claimed(kind, count)

    def task_finished(self, kind: str, name: str, outcome: str, seconds: float) -> None:
        for sink in self._sinks:
            sink.task_finished(kind, name, outcome, seconds)

    def leases_lost(self, kind: str, count: int) -> None:
        for sink in self._sinks:
            sink.leases_lost(kind, count)

    def flushed(self, size: int, seconds: float) -> None:
        for sink in self._sinks:
            sink.flushed(size, seconds)

    def leadership(self, leading: bool) -> None:
        for sink in self._sinks:
            sink.leadership(leading)

    def queue_depths(self, queues: Sequence[QueueInfo]) -> None:
        for sink in self._sinks:
            sink.queue_depths(queues)

    def thread_died(self, name: str) -> None:
        for sink in self._sinks:
            hook = getattr(sink, "thread_died", None)  # sinks written before this hook lack it
            if hook is not None:
                hook(name)

    def executors_abandoned(self, workflow: str, count: int) -> None:
        """``count`` coroutines of a ``workflow`` executor refused to close and were abandoned
        (``dex.app.workflows.executors.Closer``)."""
        for sink in self._sinks:
            hook = getattr(sink, "executors_abandoned", None)  # sinks written before it lack it
            if hook is not None:
                hook(workflow, count)

    def interrupted_threads(self, count: int) -> None:
        """``count`` threads the watchdog interrupted still run workflow code (``dex.app.machinery.quarantine``)."""
        for sink in self._sinks:
            hook = getattr(sink, "interrupted_threads", None)
            if hook is not None:
                hook(count)

    def workflow_quarantined(self, workflow: str) -> None:
        """``workflow`` is no longer run by this process (``dex.app.machinery.quarantine``)."""
        for sink in self._sinks:
            hook = getattr(sink, "workflow_quarantined", None)
            if hook is not None:
                hook(workflow)

    def lost_step_slots(self, count: int) -> None:
        """Transaction step slots given up by attempts that still run after their lease was lost
        (the store's ``lost_step_slots``, reported by the scheduler's rounds)."""
        for sink in self._sinks:
            hook = getattr(sink, "lost_step_slots", None)  # sinks written before it lack it
            if hook is not None:
                hook(count)

    def schedule_fired(self, name: str, lag: float) -> None:
        """A schedule's fire started its run, ``lag`` seconds after the fire time."""
        for sink in self._sinks:
            hook = getattr(sink, "schedule_fired", None)  # sinks written before schedules lack it
            if hook is not None:
                hook(name, lag)

    def schedule_skipped(self, name: str, reason: str, count: int) -> None:
        """``count`` fires of a schedule started no run: ``reason`` is "overlap" or "catchup"."""
        for sink in self._sinks:
            hook = getattr(sink, "schedule_skipped", None)
            if hook is not None:
                hook(name, reason, count)

    def long_polls(self, open_polls: int, limit: int) -> None:
        """The remote workers' long polls open now, and the most that may be (``dex.app.runtime.long_polls``)."""
        for sink in self._sinks:
            hook = getattr(sink, "long_polls", None)  # sinks written before it lack it
            if hook is not None:
                hook(open_polls, limit)

    # -- the event-driven dispatch mode (dex.app.runtime.notices) --------------------------------
    def relayed(self, published: int, refused: int, depth: int, lag: float) -> None:
        """A relay round published ``published`` notices (``refused`` were kept for the next);
        ``depth`` notices are left in the outbox, the oldest ``lag`` seconds old."""
        for sink in self._sinks:
            hook = getattr(sink, "relayed", None)  # sinks written before the mode lack it
            if hook is not None:
                hook(published, refused, depth, lag)

    def dispatch_latency(self, kind: str, seconds: float) -> None:
        """A task was claimed ``seconds`` after it was made claimable (from its notice)."""
        for sink in self._sinks:
            hook = getattr(sink, "dispatch_latency", None)
            if hook is not None:
                hook(kind, seconds)

    def lock_conflicts(self, kind: str, count: int) -> None:
        """``count`` claims by notice found their task there but held by another worker (or no
        room for it): work was queued and the claim got nothing."""
        for sink in self._sinks:
            hook = getattr(sink, "lock_conflicts", None)
            if hook is not None:
                hook(kind, count)

    def notices_skipped(self, reason: str, count: int) -> None:
        """``count`` notices claimed nothing: "stale" (the task done or taken), "no-room",
        "malformed", "other-queue", "other-name"."""
        for sink in self._sinks:
            hook = getattr(sink, "notices_skipped", None)
            if hook is not None:
                hook(reason, count)
