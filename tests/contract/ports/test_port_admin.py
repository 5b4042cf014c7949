"""The contracts of the small ports: QueueAdmin, Leadership, Maintenance, and refused data.

docs/reference/contract.md §5 (queues: created on first use, paused, resized, listed with their depth), §7 (one
leader at a time on an expiring lease; retention of finished runs), and the port's
``StoreRejectedError``: a write the store refuses for a value in it fails as a whole, with
that error, so the buffer can split the batch (dex/app/machinery/buffer.py).
"""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from dex.app.ports.store import ActivityOutcome, ActivitySlots, Claim, QueueInfo, RunFilter, Store, StoreRejectedError
from dex.domain import events as ev
from dex.domain.errors import RunNotFoundError
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    LEASE,
    QUEUE,
    WF,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    activity,
    claim,
    decide,
    done,
    event,
    failure,
    finish,
    inbox_of,
    next_task,
    payload,
    start,
    step,
)

TTL = timedelta(seconds=15)


def _workflow_claim() -> Claim:
    return Claim(names=frozenset({WF}), owner="eager", limit=8, lease=LEASE)


def _queues(store: Store) -> list[QueueInfo]:
    return sorted(store.list_queues(), key=lambda q: (q.name, q.kind))


class QueueAdminContract(PortContract):
    def test_a_queue_is_ensured_once_and_keeps_its_settings(self, store: Store, clock: VirtualClock) -> None:
        store.ensure_queue("mail", "activity", 5)
        store.ensure_queue("mail", "activity", 50)  # exists: nothing changes
        store.ensure_queue("mail", "workflow")  # a queue of the other kind is another queue
        assert _queues(store) == [
            QueueInfo(name="mail", kind="activity", status="ACTIVE", capacity=5, depth=0),
            QueueInfo(name="mail", kind="workflow", status="ACTIVE", capacity=100, depth=0),
        ]
        store.create_queue("mail", "activity", 7)  # create sets the capacity of an existing one
        store.set_queue_paused("mail", "workflow", True)
        store.set_queue_capacity("mail", "workflow", 3)
        assert [(q.kind, q.status, q.capacity) for q in _queues(store)] == [
            ("activity", "ACTIVE", 7),
            ("workflow", "PAUSED", 3),
        ]

    def test_a_run_s_queue_exists_from_its_start_and_counts_its_tasks(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        start(store, clock, "r2")
        assert [(q.name, q.kind, q.depth) for q in _queues(store)] == [(QUEUE, "workflow", 0)]
        store.schedule_workflow_tasks(clock.now(), 100)
        assert [q.depth for q in _queues(store)] == [2]
        step(store, clock, "r1", activities=[ACT, ACT])
        depths = {q.kind: q.depth for q in _queues(store)}
        assert depths == {"activity": 2, "workflow": 1}

    def test_activity_slots_count_the_tasks_that_hold_one_not_those_waiting(
        self, store: Store, clock: VirtualClock
    ) -> None:
        store.ensure_queue(QUEUE, "activity", 2)
        assert store.activity_slots() == [ActivitySlots(queue=QUEUE, paused=False, capacity=2, held=0)]
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT, ACT])
        store.schedule_activity_tasks(clock.now(), 100)  # two of the three get a slot
        assert store.activity_slots() == [ActivitySlots(queue=QUEUE, paused=False, capacity=2, held=2)]
        (first,) = store.claim_activity_tasks(frozenset({ACT}), "a1", clock.now(), LEASE, 1)
        assert [s.held for s in store.activity_slots()] == [2]  # claimed or not, a slot is held
        retry = attrs.evolve(done(first), result=None, failure=failure(), retry_at=clock.now() + timedelta(hours=1))
        assert store.complete_activity_tasks([retry], clock.now()) == [True]
        assert [s.held for s in store.activity_slots()] == [1]  # a retry waiting out its delay holds none
        assert [q.depth for q in _queues(store) if q.kind == "activity"] == [3]  # the depth counts it
        store.set_queue_paused(QUEUE, "activity", True)
        store.ensure_queue("other", "workflow")  # workflow queues are not listed
        assert store.activity_slots() == [ActivitySlots(queue=QUEUE, paused=True, capacity=2, held=1)]

    def test_changing_a_queue_that_does_not_exist_or_is_not_valid_is_refused(
        self, store: Store, clock: VirtualClock
    ) -> None:
        with pytest.raises(ValueError):
            store.set_queue_paused("nowhere", "workflow", True)
        with pytest.raises(ValueError):
            store.set_queue_capacity("nowhere", "activity", 3)
        with pytest.raises(ValueError):
            store.ensure_queue("q", "cron")
        with pytest.raises(ValueError):
            store.create_queue("q", "workflow", 0)
        assert store.list_queues() == []


class LeadershipContract(PortContract):
    def test_one_node_leads_until_its_lease_expires(self, store: Store, clock: VirtualClock) -> None:
        assert store.try_lead("a", clock.now(), TTL)
        assert not store.try_lead("b", clock.now(), TTL)
        clock.advance(TTL - timedelta(seconds=1))
        assert store.try_lead("a", clock.now(), TTL)  # a renewal starts a new lease
        clock.advance(TTL - timedelta(seconds=1))
        assert not store.try_lead("b", clock.now(), TTL)
        clock.advance(1)
        assert store.try_lead("b", clock.now(), TTL)
        assert not store.try_lead("a", clock.now(), TTL)

    def test_a_leader_whose_lease_ran_out_takes_it_again_if_nobody_else_did(
        self, store: Store, clock: VirtualClock
    ) -> None:
        assert store.try_lead("a", clock.now(), TTL)
        clock.advance(TTL * 3)
        assert store.try_lead("a", clock.now(), TTL)
        assert not store.try_lead("b", clock.now(), TTL)

    def test_a_released_lease_is_free_at_once_and_only_its_holder_releases_it(
        self, store: Store, clock: VirtualClock
    ) -> None:
        assert store.try_lead("a", clock.now(), TTL)
        store.release_leadership("b")  # not the leader: nothing happens
        assert not store.try_lead("b", clock.now(), TTL)
        store.release_leadership("a")
        assert store.try_lead("b", clock.now(), TTL)
        store.release_leadership("a")
        assert not store.try_lead("a", clock.now(), TTL)


class MaintenanceContract(PortContract):
    def test_retention_deletes_only_runs_that_ended_before_the_cut_off(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "live")
        step(store, clock, "live")
        for run_id, status in [("done", RunStatus.COMPLETED), ("failed", RunStatus.FAILED)]:
            start(store, clock, run_id)
            finish(store, clock, run_id, status)
        cut_off = clock.now()
        assert store.delete_finished_runs(cut_off, 100) == 0  # the bound is strict
        clock.advance(1)
        start(store, clock, "recent")
        finish(store, clock, "recent", RunStatus.CANCELLED)
        assert store.delete_finished_runs(clock.now(), 100) == 2  # not "recent", which ended at the cut-off
        assert sorted(r.run_id for r in store.list_runs(RunFilter())) == ["live", "recent"]
        assert store.delete_finished_runs(clock.now() + timedelta(seconds=1), 100) == 1
        assert [r.run_id for r in store.list_runs(RunFilter())] == ["live"]

    def test_retention_takes_the_runs_that_ended_first_up_to_its_limit(self, store: Store, clock: VirtualClock) -> None:
        for run_id in ("a", "b", "c"):
            start(store, clock, run_id)
        for run_id in ("c", "a", "b"):  # ended in this order
            finish(store, clock, run_id)
            clock.advance(1)
        assert store.delete_finished_runs(clock.now(), 2) == 2
        assert [r.run_id for r in store.list_runs(RunFilter())] == ["b"]

    def test_a_deleted_run_is_gone_with_everything_it_had(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1", instance_id="order-1")
        step(store, clock, "r1", activities=[ACT], timers=[clock.now() + timedelta(hours=1)])
        finish(store, clock, "r1")
        clock.advance(1)
        assert store.delete_finished_runs(clock.now(), 100) == 1
        assert store.get_run("r1") is None and store.get_runs(["r1"]) == []
        with pytest.raises(RunNotFoundError):
            store.load_history("r1")
        with pytest.raises(RunNotFoundError):
            store.send_message("r1", event("late"), clock.now())
        assert store.next_due_time(clock.now()) is None  # its timer went with it
        assert all(q.depth == 0 for q in store.list_queues())
        assert start(store, clock, "r2", instance_id="order-1") == "r2"

    def test_next_due_time_is_the_earliest_future_timer_retry_or_lease(self, store: Store, clock: VirtualClock) -> None:
        assert store.next_due_time(clock.now()) is None
        t0 = clock.now()
        start(store, clock, "r1")  # its RunStarted is due now, which is not in the future
        assert store.next_due_time(t0) is None
        step(store, clock, "r1", timers=[t0 + timedelta(minutes=10)], activities=[ACT])
        assert store.next_due_time(t0) == t0 + timedelta(minutes=10)
        (task,) = activity(store, clock)  # an activity lease ends in LEASE
        assert store.next_due_time(t0) == t0 + LEASE
        retry = ActivityOutcome(task=task, failure=failure("again"), retry_at=t0 + timedelta(minutes=2))
        assert store.complete_activity_tasks([retry], t0) == [True]
        assert store.next_due_time(t0) == t0 + timedelta(minutes=2)
        store.send_message("r1", event("go"), t0)
        store.schedule_workflow_tasks(t0, 100)
        claim(store, clock)  # a workflow lease ends in LEASE too
        assert store.next_due_time(t0) == t0 + LEASE
        assert store.next_due_time(t0 + LEASE) == t0 + timedelta(minutes=2)


class RefusalContract(PortContract):
    """Data the store cannot hold (a NUL in text, a lone surrogate) fails the write as a whole."""

    def test_a_result_the_store_cannot_hold_fails_its_batch_and_changes_nothing(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        start(store, clock, "r2")
        one = next_task(store, clock, "r1")
        two = next_task(store, clock, "r2")
        good, bad = decide(store, one, clock.now()), decide(store, two, clock.now(), status="half\x00way")
        with pytest.raises(StoreRejectedError):
            store.complete_workflow_tasks([(one, good), (two, bad)], clock.now())
        assert [len(store.load_history(r)) for r in ("r1", "r2")] == [1, 1]
        # the leases still hold: the good result alone applies, the refused one can be replaced
        assert store.complete_workflow_tasks([(one, good)], clock.now()) == [True]
        assert store.complete_workflow_tasks([(two, attrs.evolve(bad, custom_status="x"))], clock.now()) == [True]

    def test_messages_the_store_cannot_hold_fail_their_batch(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        for items in ([("r1", event("ok")), ("r\x00", event("nul"))], [("r1", event("ok")), ("r1", event("\ud800"))]):
            with pytest.raises(StoreRejectedError):
                store.send_messages(items, clock.now())
        assert inbox_of(store, clock, "r1") == ["RunStarted"]

    def test_an_outcome_or_heartbeat_the_store_cannot_hold_is_refused(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT])
        good, bad = activity(store, clock)
        unholdable = ActivityOutcome(task=bad, result=attrs.evolve(payload(1), encoding="json\ud800"))
        with pytest.raises(StoreRejectedError):
            store.complete_activity_tasks([done(good), unholdable], clock.now())
        with pytest.raises(StoreRejectedError):
            store.complete_activity_tasks_then_claim([done(good), unholdable], clock.now(), _workflow_claim())
        stranger = attrs.evolve(good, lease=attrs.evolve(good.lease, owner="a\x00"))
        with pytest.raises(StoreRejectedError):
            store.extend_activity_leases([stranger, bad], clock.now(), LEASE)
        # nothing was written: both leases hold, and the good outcome alone applies
        assert store.extend_activity_leases([good, bad], clock.now(), LEASE) == [True, True]
        assert store.complete_activity_tasks([done(good)], clock.now()) == [True]
        assert [type(m.event) for m in store.load_workflow_task(next_task(store, clock, "r1"), clock.now())[1]] == [
            ev.ActivityTaskCompleted
        ]

    def test_a_complete_then_claim_the_store_cannot_hold_claims_nothing(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        bad = decide(store, task, clock.now(), activities=[ACT], status="\x00")
        claim = Claim(names=frozenset({ACT}), owner="eager", limit=8, lease=LEASE)
        with pytest.raises(StoreRejectedError):
            store.complete_workflow_tasks_then_claim([(task, bad)], clock.now(), claim)
        assert len(store.load_history("r1")) == 1 and activity(store, clock) == []


class TestQueueAdminMemory(MemoryBackend, QueueAdminContract):
    pass


class TestQueueAdminPostgres(PostgresBackend, QueueAdminContract):
    pass


class TestLeadershipMemory(MemoryBackend, LeadershipContract):
    pass


class TestLeadershipPostgres(PostgresBackend, LeadershipContract):
    pass


class TestMaintenanceMemory(MemoryBackend, MaintenanceContract):
    pass


class TestMaintenancePostgres(PostgresBackend, MaintenanceContract):
    def test_no_row_of_a_deleted_run_is_left_in_any_table(self, store: Store, clock: VirtualClock) -> None:
        import psycopg
        from psycopg import sql

        from tests.pg import postgres_dsn

        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT], timers=[clock.now() + timedelta(hours=1)])
        store.send_message("r1", event("unread"), clock.now())
        finish(store, clock, "r1")
        start(store, clock, "kept")
        clock.advance(1)
        assert store.delete_finished_runs(clock.now(), 100) == 1
        schema = store.schema  # type: ignore[attr-defined]
        with psycopg.connect(postgres_dsn()) as conn:
            for table in ("runs", "history", "inbox", "workflow_tasks", "activity_tasks"):
                query = sql.SQL("SELECT run_id, count(*) FROM {}.{} GROUP BY run_id ORDER BY run_id")
                rows = conn.execute(query.format(sql.Identifier(schema), sql.Identifier(table))).fetchall()
                assert "r1" not in {row[0] for row in rows}, table
                if table in ("runs", "history", "inbox"):
                    assert [row[0] for row in rows] == ["kept"], table


class TestRefusalMemory(MemoryBackend, RefusalContract):
    pass


class TestRefusalPostgres(PostgresBackend, RefusalContract):
    pass
