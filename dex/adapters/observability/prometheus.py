"""Prometheus metrics for dex (``pip install 'dex-engine[metrics]'``).

``serve_metrics(engine, 9464)`` attaches a :class:`PrometheusTelemetry` to the engine and serves it
over HTTP; or attach one yourself (``engine.telemetry.attach(PrometheusTelemetry(registry))``)
and expose ``registry`` through your application's own ``/metrics`` endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dex.app.ports.store import QueueInfo
from dex.app.ports.telemetry import TelemetryHub

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class PrometheusTelemetry:
    """The engine's hooks as Prometheus counters, histograms and gauges in ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.claimed = Counter("dex_tasks_claimed_total", "Tasks claimed by this process", ["kind"], registry=r)
        self.finished = Counter(
            "dex_tasks_finished_total", "Tasks executed, by outcome", ["kind", "name", "outcome"], registry=r
        )
        self.duration = Histogram(
            "dex_task_duration_seconds", "Time to execute a task", ["kind"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.lost = Counter("dex_lease_losses_total", "Results discarded: the lease was lost", ["kind"], registry=r)
        self.flush_size = Histogram("dex_flush_size", "Writes per buffer flush", buckets=_SIZE_BUCKETS, registry=r)
        self.flush_duration = Histogram(
            "dex_flush_duration_seconds", "Time to write one buffer flush", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.leader = Gauge("dex_leader", "1 while this process holds the leadership lease", registry=r)
        self.depth = Gauge("dex_queue_depth", "Tasks in a queue", ["queue", "kind"], registry=r)
        self.capacity = Gauge("dex_queue_capacity", "Capacity of a queue", ["queue", "kind"], registry=r)
        self.paused = Gauge("dex_queue_paused", "1 while a queue is paused", ["queue", "kind"], registry=r)
        self.thread_deaths = Counter(
            "dex_thread_deaths_total", "Engine threads that died (each is replaced)", ["thread"], registry=r
        )
        self.abandoned = Counter(
            "dex_abandoned_executors_total",
            "Workflow coroutines that refused to close when dropped, abandoned",
            ["workflow"],
            registry=r,
        )
        self.interrupted = Gauge(
            "dex_interrupted_threads", "Threads interrupted by the watchdog that still run workflow code", registry=r
        )
        self.quarantined = Gauge(
            "dex_workflow_quarantined", "1 while this process no longer runs the workflow", ["workflow"], registry=r
        )
        self.lost_slots = Gauge(
            "dex_lost_step_slots",
            "Transaction step slots given up by attempts still running after their lease was lost",
            registry=r,
        )
        self.fires = Counter("dex_schedule_fires_total", "Schedule fires that started a run", ["schedule"], registry=r)
        self.skips = Counter(
            "dex_schedule_skips_total", "Schedule fires that started no run", ["schedule", "reason"], registry=r
        )
        self.polls_open = Gauge("dex_long_polls_open", "Remote workers' long polls open now", registry=r)
        self.polls_limit = Gauge(
            "dex_long_polls_limit", "Remote workers' long polls that may be open at once", registry=r
        )
        self.lag = Histogram(
            "dex_schedule_lag_seconds", "From a fire time to its run's start", buckets=_LATENCY_BUCKETS, registry=r
        )
        # the event-driven dispatch mode (Engine(dispatch="kafka"))
        self.dispatch_seconds = Histogram(
            "dex_dispatch_latency_seconds",
            "From a task made claimable to its claim by notice",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.conflicts = Counter(
            "dex_lock_conflicts_total",
            "Claims by notice that found their task held by another worker",
            ["kind"],
            registry=r,
        )
        self.skipped_notices = Counter(
            "dex_notices_skipped_total", "Notices that claimed nothing, by reason", ["reason"], registry=r
        )
        self.published = Counter("dex_notices_published_total", "Notices the relay published", registry=r)
        self.refused = Counter("dex_notices_refused_total", "Notices the broker refused (kept, retried)", registry=r)
        self.outbox_depth = Gauge(
            "dex_outbox_depth", "Notices waiting in the outbox (as the relay last saw)", registry=r
        )
        self.relay_lag = Gauge("dex_relay_lag_seconds", "Age of the oldest notice in the outbox", registry=r)

    def tasks_claimed(self, kind: str, count: int) -> None:
        self.claimed.labels(kind).inc(count)

    def task_finished(self, kind: str, name: str, outcome: str, seconds: float) -> None:
        self.finished.labels(kind, name, outcome).inc()
        self.duration.labels(kind).observe(seconds)

    def leases_lost(self, kind: str, count: int) -> None:
        self.lost.labels(kind).inc(count)

    def flushed(self, size: int, seconds: float) -> None:
        self.flush_size.observe(size)
        self.flush_duration.observe(seconds)

    def leadership(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def queue_depths(self, queues: Sequence[QueueInfo]) -> None:
        for queue in queues:
            self.depth.labels(queue.name, queue.kind).set(queue.depth)
            self.capacity.labels(queue.name, queue.kind).set(queue.capacity)
            self.paused.labels(queue.name, queue.kind).set(1 if queue.status == "PAUSED" else 0)

    def thread_died(self, name: str) -> None:
        self.thread_deaths.labels(name).inc()

    def executors_abandoned(self, workflow: str, count: int) -> None:
        self.abandoned.labels(workflow).inc(count)

    def interrupted_threads(self, count: int) -> None:
        self.interrupted.set(count)

    def workflow_quarantined(self, workflow: str) -> None:
        self.quarantined.labels(workflow).set(1)

    def lost_step_slots(self, count: int) -> None:
        self.lost_slots.set(count)

    def schedule_fired(self, name: str, lag: float) -> None:
        self.fires.labels(name).inc()
        self.lag.observe(lag)

    def schedule_skipped(self, name: str, reason: str, count: int) -> None:
        self.skips.labels(name, reason).inc(count)

    def long_polls(self, open_polls: int, limit: int) -> None:
        self.polls_open.set(open_polls)
        self.polls_limit.set(limit)

    def relayed(self, published: int, refused: int, depth: int, lag: float) -> None:
        self.published.inc(published)
        self.refused.inc(refused)
        self.outbox_depth.set(depth)
        self.relay_lag.set(lag)

    def dispatch_latency(self, kind: str, seconds: float) -> None:
        self.dispatch_seconds.labels(kind).observe(seconds)

    def lock_conflicts(self, kind: str, count: int) -> None:
        self.conflicts.labels(kind).inc(count)

    def notices_skipped(self, reason: str, count: int) -> None:
        self.skipped_notices.labels(reason).inc(count)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)


def serve_metrics(engine: _HasTelemetry, port: int, addr: str = "127.0.0.1") -> PrometheusTelemetry:
    """Serve ``engine``'s metrics on ``http://addr:port/metrics`` from a daemon thread: through the
    :class:`PrometheusTelemetry` already attached to it, else a new one attached now."""
    prometheus = next((s for s in engine.telemetry.sinks if isinstance(s, PrometheusTelemetry)), None)
    if prometheus is None:
        prometheus = PrometheusTelemetry()
        engine.telemetry.attach(prometheus)
    prometheus.serve(port, addr)
    return prometheus


class _HasTelemetry(Protocol):
    @property
    def telemetry(self) -> TelemetryHub: ...
