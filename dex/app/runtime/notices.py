"""The rounds of the event-driven dispatch mode (``Engine(dispatch="kafka")``, :mod:`dex.app.ports.notices`).

Two more threads run on an engine in that mode. The relay (``dex-relay``) publishes the outbox
while this engine leads: one leader, so notices go out in the order they were written. The
receiver (``dex-notices``) waits for the notices of this engine's queues and claims the tasks
they name through the engine's own dispatch, exactly as eager dispatch hands over what a
completion claimed: workflow tasks to the workflow worker (within its room), activity tasks to
the pool (within the slots the coordinator reserves). A notice whose task it cannot claim — a
duplicate, a task done or taken, no room now — is skipped and counted; the task's row is the
truth, and the worker threads' slow safety poll finds whatever no notice brought.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dex.app.ports.notices import (
    DISPATCH_MODES,
    KAFKA,
    POLLING,
    NoticeClaims,
    NoticeSource,
    TaskNotice,
    TaskNotices,
)
from dex.app.ports.store import ACTIVITY, WORKFLOW, ActivityTask, Clock, WorkflowTask
from dex.app.ports.telemetry import TelemetryHub
from dex.app.runtime.leader import LeaderElection
from dex.app.runtime.rounds import LocalDispatch

log = logging.getLogger("dex.engine")


def task_notices(store: object, dispatch: object, kafka: object) -> tuple[str, TaskNotices | None]:
    """``Engine(dispatch=, kafka=)`` checked: the mode, and in the Kafka mode the notices the
    store builds over the broker ``kafka`` configures. A clear error for an unknown mode,
    settings given to the polling mode, a store that cannot write notices (the memory adapter),
    or settings the adapter refuses."""
    if not isinstance(dispatch, str) or dispatch not in DISPATCH_MODES:
        raise ValueError(f"dispatch must be one of {', '.join(map(repr, DISPATCH_MODES))}, got {dispatch!r}")
    if dispatch == POLLING:
        if kafka is not None:
            raise ValueError('kafka= settings are used only with dispatch="kafka"')
        return POLLING, None
    if not isinstance(store, NoticeSource):
        raise ValueError(
            f'dispatch="kafka" needs the PostgreSQL adapter (its outbox table); {type(store).__name__} has none'
        )
    try:
        return KAFKA, store.task_notices(kafka)  # type: ignore[arg-type]  # checked by the adapter
    except ImportError as exc:
        raise ImportError(f'dispatch="kafka" needs confluent-kafka: pip install "dex-engine[kafka]" ({exc})') from exc


def set_dispatch(store: NoticeSource, mode: str) -> None:
    """Make the database write notices or not, at an engine's start. The Kafka mode needs its
    triggers, so a failure there fails the start; a polling engine starts whatever the store
    says, as it always did (a store that is down is retried by its threads), and the triggers
    it could not drop are dropped by the next polling start."""
    if mode == KAFKA:
        store.set_dispatch(mode)
        return
    try:
        store.set_dispatch(mode)
    except Exception:
        log.warning("could not turn the outbox of the Kafka mode off; the next start tries again", exc_info=True)


class DispatchCounts:
    """What the event-driven mode did since the engine was made, for ``Engine.health()``
    (each figure only grows, except the outbox's depth and lag, as of the last relay round)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.claimed = 0
        self.skipped: dict[str, int] = {}
        self.lock_conflicts = 0
        self.published = 0
        self.outbox_depth = 0
        self.relay_lag = 0.0

    def relayed(self, published: int, depth: int, lag: float) -> None:
        with self._lock:
            self.published += published
            self.outbox_depth, self.relay_lag = depth, lag

    def claims(self, claimed: int, conflicts: int) -> None:
        with self._lock:
            self.claimed += claimed
            self.lock_conflicts += conflicts

    def skip(self, reason: str, count: int) -> None:
        if count:
            with self._lock:
                self.skipped[reason] = self.skipped.get(reason, 0) + count

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "claimed": self.claimed,
                "skipped": dict(self.skipped),
                "lock_conflicts": self.lock_conflicts,
                "published": self.published,
                "outbox_depth": self.outbox_depth,
                "relay_lag_seconds": self.relay_lag,
            }


class NoticeRounds:
    """The relay's and the receiver's rounds; each returns the seconds its thread may idle."""

    def __init__(
        self,
        notices: TaskNotices,
        dispatch: LocalDispatch,
        leader: LeaderElection,
        clock: Clock,
        telemetry: TelemetryHub,
        counts: DispatchCounts,
        *,
        receive_timeout: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._notices, self._dispatch, self._leader = notices, dispatch, leader
        self._clock, self._telemetry, self.counts = clock, telemetry, counts
        self._receive_timeout = receive_timeout
        self._monotonic = monotonic

    def relay(self) -> float:
        """Publish a batch of the outbox (the leader's only)."""
        if not self._leader.is_leader:
            return self._notices.relay_interval
        report = self._notices.relay(self._clock.now())
        self.counts.relayed(report.published, report.depth, report.lag)
        self.counts.skip("already-claimed", report.dropped)
        self._telemetry.relayed(report.published, report.refused, report.depth, report.lag)
        return 0.0 if report.more else self._notices.relay_interval

    def receive(self) -> float:
        """Claim the tasks the notices received name; then let the broker forget them."""
        received = self._notices.receive(self._receive_timeout)
        for reason, count in received.skipped.items():
            self.counts.skip(reason, count)
            self._telemetry.notices_skipped(reason, count)
        workflows = [n for n in received.notices if n.kind == WORKFLOW]
        activities = [n for n in received.notices if n.kind == ACTIVITY]
        try:
            if workflows:
                self._workflows(workflows)
            if activities:
                self._activities(activities)
        except BaseException:
            # a store fault fails this round only: the notices come again after the back-off
            # (a claim that did commit makes its notices stale, and they are skipped then)
            self._notices.rewind()
            raise
        self._notices.received()
        return 0.0

    def _workflows(self, notices: list[TaskNotice]) -> None:
        claim = self._dispatch.workflow_claim(())
        if claim is None:  # no room now: the worker's next claim, or the safety poll, takes them
            self._no_room(notices)
            return
        now = self._clock.now()
        claims = self._notices.claim_workflow_tasks(notices, claim, now)
        self._count(claims, notices)
        if claims.tasks:
            self._telemetry.tasks_claimed(WORKFLOW, len(claims.tasks))
            self._dispatch.workflows_claimed(list(claims.tasks))

    def _activities(self, notices: list[TaskNotice]) -> None:
        claim = self._dispatch.activity_claim()
        if claim is None:
            self._no_room(notices)
            return
        claims: NoticeClaims[ActivityTask] = NoticeClaims()
        try:
            claims = self._notices.claim_activity_tasks(notices, claim, self._clock.now())
        finally:  # runs them, and frees the unused slots (all of them when the claim failed)
            self._dispatch.activities_claimed(claim, list(claims.tasks))
        self._count(claims, notices)
        if claims.tasks:
            self._telemetry.tasks_claimed(ACTIVITY, len(claims.tasks))

    def _no_room(self, notices: list[TaskNotice]) -> None:
        self.counts.skip("no-room", len(notices))
        self._telemetry.notices_skipped("no-room", len(notices))

    def _count(
        self, claims: NoticeClaims[WorkflowTask] | NoticeClaims[ActivityTask], notices: list[TaskNotice]
    ) -> None:
        now = self._clock.now()
        created = {(n.queue, n.task_id): n.created_at for n in notices}
        kind = notices[0].kind
        for task in claims.tasks:
            at = created.get((task.queue, task.task_id))
            if at is not None:
                self._telemetry.dispatch_latency(kind, max(0.0, (now - at).total_seconds()))
        self.counts.claims(len(claims.tasks), claims.conflicts)
        self.counts.skip("stale", claims.stale)
        if claims.conflicts:
            self._telemetry.lock_conflicts(kind, claims.conflicts)
        if claims.stale:
            self._telemetry.notices_skipped("stale", claims.stale)
