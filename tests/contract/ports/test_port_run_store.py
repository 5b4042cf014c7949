"""The RunStore port's contract (docs/reference/contract.md §5): runs created, read, listed, messaged, transitioned."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dex.app.ports.store import Claim, RunFilter, Store
from dex.domain import events as ev
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    LEASE,
    QUEUE,
    WF,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    created,
    event,
    finish,
    inbox_of,
    payload,
    start,
    step,
)


def _claim(names: tuple[str, ...] = (WF,)) -> Claim:
    return Claim(names=frozenset(names), owner="eager", limit=8, lease=LEASE)


class RunStoreContract(PortContract):
    # -- create ----------------------------------------------------------------------------------
    def test_a_new_run_has_its_creation_as_history_and_its_start_in_its_inbox(
        self, store: Store, clock: VirtualClock
    ) -> None:
        event = created(labels=(("shop", "eu"),), priority=7, instance_id="order-1", parent="p-1")
        assert store.create_run("r1", event, clock.now()) == "r1"
        (first,) = store.load_history("r1")
        assert (first.sequence_number, first.timestamp, first.event) == (1, clock.now(), event)
        assert inbox_of(store, clock, "r1") == ["RunStarted"]
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.workflow_name, record.queue, record.priority) == (RunStatus.CREATED, WF, QUEUE, 7)
        assert (record.instance_id, record.labels, record.parent_run_id) == ("order-1", (("shop", "eu"),), "p-1")
        assert (record.created_at, record.started_at, record.completed_at) == (clock.now(), None, None)

    def test_a_live_run_with_the_instance_id_wins_and_nothing_is_created(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1", instance_id="order-1")
        step(store, clock, "r1")  # RUNNING counts as live, as CREATED does
        assert start(store, clock, "r2", instance_id="order-1") == "r1"
        assert store.get_run("r2") is None
        assert [r.run_id for r in store.list_runs(RunFilter(instance_id="order-1"))] == ["r1"]

    def test_an_instance_id_is_free_again_once_its_run_has_ended(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1", instance_id="order-1")
        finish(store, clock, "r1", RunStatus.FAILED)
        assert start(store, clock, "r2", instance_id="order-1") == "r2"
        runs = store.list_runs(RunFilter(instance_id="order-1"))
        assert [(r.run_id, r.status) for r in runs] == [("r2", RunStatus.CREATED), ("r1", RunStatus.FAILED)]

    def test_a_run_id_is_never_created_twice(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        with pytest.raises(ValueError):
            start(store, clock, "r1")
        assert len(store.load_history("r1")) == 1

    def test_a_created_run_claims_its_first_task_with_its_input(self, store: Store, clock: VirtualClock) -> None:
        now = clock.now()
        run_id, (task,), (loaded,) = store.create_run_then_claim("r1", created(), now, _claim())
        assert run_id == "r1" and (task.run_id, task.lease.owner, task.lease.until) == ("r1", "eager", now + LEASE)
        assert store.load_workflow_tasks([(task, 0)], now) == [loaded]
        assert store.schedule_workflow_tasks(now, 100) == 0  # it has its task already
        assert store.claim_workflow_tasks(frozenset({WF}), "other", now, LEASE, 8) == []  # and it is claimed

    def test_a_created_run_is_left_to_the_scheduler_unless_it_may_run_at_once(
        self, store: Store, clock: VirtualClock
    ) -> None:
        now = clock.now()
        assert store.create_run_then_claim("keyed", created(key="k"), now, _claim()) == ("keyed", [], [])
        assert store.create_run_then_claim("other", created("refund"), now, _claim()) == ("other", [], [])
        store.ensure_queue("slow", "workflow")
        store.set_queue_paused("slow", "workflow", True)
        assert store.create_run_then_claim("paused", created(queue="slow"), now, _claim())[1:] == ([], [])
        store.create_queue("one", "workflow", 1)
        assert len(store.create_run_then_claim("a", created(queue="one"), now, _claim())[1]) == 1
        assert store.create_run_then_claim("b", created(queue="one"), now, _claim())[1:] == ([], [])
        # all of them exist and wait for the scheduler (the paused queue's and the full one's later)
        assert store.schedule_workflow_tasks(now, 100) == 2

    def test_a_created_run_with_a_live_instance_returns_that_run_and_claims_nothing(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1", instance_id="order-1")
        got = store.create_run_then_claim("r2", created(instance_id="order-1"), clock.now(), _claim())
        assert got == ("r1", [], []) and store.get_run("r2") is None

    # -- read ------------------------------------------------------------------------------------
    def test_unknown_runs_are_absent_and_get_runs_gives_each_run_once(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        start(store, clock, "r2")
        assert store.get_run("nope") is None
        assert sorted(r.run_id for r in store.get_runs(["r2", "nope", "r1", "r2"])) == ["r1", "r2"]
        assert store.get_runs([]) == []
        with pytest.raises(RunNotFoundError):
            store.load_history("nope")

    def test_a_page_of_history_is_the_events_after_a_sequence_number(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        for i in range(4):  # blocks of several events each
            store.send_message("r1", event(f"e{i}"), clock.now())
            step(store, clock, "r1", activities=["a"] * i)
        whole = store.load_history("r1")
        seqs = [item.sequence_number for item in whole]
        assert seqs == list(range(1, len(whole) + 1)) and len(whole) > 12
        for after in range(-1, len(whole) + 2):
            for limit in (1, 2, 5, len(whole) + 3):
                page = store.load_history_after("r1", after, limit)
                assert page == [item for item in whole if item.sequence_number > after][:limit], (after, limit)
        assert store.load_history_after("r1", 3, 0) == []
        assert store.load_history_after("r1", 2**63 - 1, 10) == []  # beyond any number: nothing, no overflow
        assert store.load_history_after("r1", 0, 2**40) == whole
        with pytest.raises(RunNotFoundError):
            store.load_history_after("nope", 0, 10)

    def test_runs_are_listed_newest_first_and_in_creation_order_at_one_instant(
        self, store: Store, clock: VirtualClock
    ) -> None:
        for run_id in ("b", "a", "c"):  # same instant: the order of creation decides, not the id
            start(store, clock, run_id)
        clock.advance(1)
        start(store, clock, "d")
        assert [r.run_id for r in store.list_runs(RunFilter())] == ["d", "c", "a", "b"]
        assert [r.run_id for r in store.list_runs(RunFilter(limit=2))] == ["d", "c"]

    def test_list_filters_combine(self, store: Store, clock: VirtualClock) -> None:
        t0 = clock.now()
        start(store, clock, "r1", labels=(("shop", "eu"), ("tier", "gold")))
        clock.advance(1)
        start(store, clock, "r2", labels=(("shop", "eu"),))
        start(store, clock, "r3", workflow="refund", labels=(("shop", "us"),))
        clock.advance(1)
        start(store, clock, "r4")
        finish(store, clock, "r4")

        def ids(**kw: object) -> list[str]:
            return [r.run_id for r in store.list_runs(RunFilter(**kw))]  # type: ignore[arg-type]

        assert ids(workflow_name="refund") == ["r3"]
        assert ids(labels=(("shop", "eu"),)) == ["r2", "r1"]
        assert ids(labels=(("shop", "eu"), ("tier", "gold"))) == ["r1"]  # all pairs must be there
        assert ids(statuses=frozenset({RunStatus.COMPLETED})) == ["r4"]
        assert ids(statuses=frozenset({RunStatus.CREATED}), workflow_name=WF) == ["r2", "r1"]
        # the bounds are strict
        assert ids(created_after=t0) == ["r4", "r3", "r2"]
        assert ids(created_before=t0 + timedelta(seconds=1)) == ["r1"]
        assert ids(created_after=t0, created_before=t0 + timedelta(seconds=2)) == ["r3", "r2"]

    def test_a_run_record_follows_its_tasks(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        clock.advance(1)
        step(store, clock, "r1", status="charging")
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.started_at, record.custom_status) == (RunStatus.RUNNING, clock.now(), "charging")
        clock.advance(1)
        finish(store, clock, "r1")
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.completed_at) == (RunStatus.COMPLETED, clock.now())
        assert record.result == payload("done")
        assert record.started_at == clock.now() - timedelta(seconds=1)  # set once, by the first task
        start(store, clock, "r2")
        finish(store, clock, "r2", RunStatus.FAILED)
        failed = store.get_run("r2")
        assert failed is not None and failed.failure is not None and failed.failure.message == "card declined"

    # -- messages ----------------------------------------------------------------------------------
    def test_messages_join_the_inbox_in_the_order_sent(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        store.send_message("r1", event("a"), clock.now())
        assert store.send_messages([("r1", event("b")), ("r1", event("c"))], clock.now()) == [None, None]
        store.send_message("r1", event("d"), clock.now())
        assert inbox_of(store, clock, "r1") == ["RunStarted", "a", "b", "c", "d"]

    def test_a_message_to_an_unknown_or_ended_run_is_refused(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        finish(store, clock, "r1")
        with pytest.raises(RunNotFoundError):
            store.send_message("nope", event("a"), clock.now())
        with pytest.raises(InvalidStateError):
            store.send_message("r1", event("a"), clock.now())

    def test_a_batch_of_messages_answers_per_item_and_writes_the_rest(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "ended")
        finish(store, clock, "ended")
        start(store, clock, "r1")
        start(store, clock, "r2")
        items = [("r1", event("a")), ("nope", event("b")), ("ended", event("c")), ("r2", event("d"))]
        errors = store.send_messages(items, clock.now())
        assert [type(e).__name__ if e else None for e in errors] == [
            None,
            "RunNotFoundError",
            "InvalidStateError",
            None,
        ]
        assert inbox_of(store, clock, "r1") == ["RunStarted", "a"]
        assert inbox_of(store, clock, "r2") == ["RunStarted", "d"]
        assert store.send_messages([], clock.now()) == []

    # -- transitions -------------------------------------------------------------------------------
    def test_suspend_and_resume_change_the_status_at_once_and_are_sent(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1")
        store.request_transition("r1", RunStatus.SUSPENDED, ev.RunSuspended(), clock.now())
        assert store.get_run("r1").status is RunStatus.SUSPENDED  # type: ignore[union-attr]
        store.request_transition("r1", RunStatus.RUNNING, ev.RunResumed(), clock.now())
        assert store.get_run("r1").status is RunStatus.RUNNING  # type: ignore[union-attr]
        assert inbox_of(store, clock, "r1") == ["RunSuspended", "RunResumed"]

    def test_a_cancel_waits_for_the_run_s_task_and_is_sent_once(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        store.request_transition("r1", RunStatus.CANCELLED, ev.RunCancelled(reason="first"), clock.now())
        store.request_transition("r1", RunStatus.CANCELLED, ev.RunCancelled(reason="again"), clock.now())
        assert store.get_run("r1").status is RunStatus.CREATED  # type: ignore[union-attr]
        assert inbox_of(store, clock, "r1") == ["RunStarted", "RunCancelled"]

    def test_an_illegal_transition_is_refused_and_sends_nothing(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        with pytest.raises(InvalidStateError):  # CREATED -> SUSPENDED is not a move of docs/reference/contract.md §5
            store.request_transition("r1", RunStatus.SUSPENDED, ev.RunSuspended(), clock.now())
        step(store, clock, "r1")
        with pytest.raises(InvalidStateError):  # resume a run that is not suspended
            store.request_transition("r1", RunStatus.RUNNING, ev.RunResumed(), clock.now())
        assert inbox_of(store, clock, "r1") == []
        assert store.get_run("r1").status is RunStatus.RUNNING  # type: ignore[union-attr]
        finish(store, clock, "r1")
        moves: list[tuple[RunStatus, ev.Message]] = [
            (RunStatus.CANCELLED, ev.RunCancelled()),
            (RunStatus.SUSPENDED, ev.RunSuspended()),
        ]
        for target, message in moves:
            with pytest.raises(InvalidStateError):
                store.request_transition("r1", target, message, clock.now())
            with pytest.raises(RunNotFoundError):
                store.request_transition("nope", target, message, clock.now())
        assert store.get_run("r1").status is RunStatus.COMPLETED  # type: ignore[union-attr]


class TestRunStoreMemory(MemoryBackend, RunStoreContract):
    pass


class TestRunStorePostgres(PostgresBackend, RunStoreContract):
    pass
