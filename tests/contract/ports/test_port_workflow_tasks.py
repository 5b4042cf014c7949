"""The WorkflowTaskQueue port's contract, first half: scheduling, claims, leases, loads, retries.

What the scheduler promises (ARCHITECTURE "The life of a run", docs/reference/contract.md §6): at most one task per
run with a visible message, queue pause and capacity, concurrency keys held from a run's first
task to its end (highest priority, then oldest, first), a suspended run woken only by a cancel.
Claims go highest priority first, then oldest, under a lease whose version grows per claim.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from dex.app.ports.store import Store, WorkflowInput
from dex.domain import events as ev
from dex.domain.errors import RunNotFoundError
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    LEASE,
    QUEUE,
    WF,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    claim,
    decide,
    event,
    finish,
    inbox_of,
    kinds,
    next_task,
    start,
    step,
    task_of,
)


class WorkflowTaskQueueContract(PortContract):
    # -- scheduling --------------------------------------------------------------------------------
    def test_a_run_with_visible_messages_gets_one_task(self, store: Store, clock: VirtualClock) -> None:
        for run_id in ("r1", "r2", "r3"):
            start(store, clock, run_id)
        now = clock.now()
        assert store.schedule_workflow_tasks(now, 2) == 2  # the limit holds
        assert store.schedule_workflow_tasks(now, 100) == 1
        store.send_message("r1", event("more"), now)
        assert store.schedule_workflow_tasks(now, 100) == 0  # one task per run, however many messages
        assert sorted(t.run_id for t in claim(store, clock)) == ["r1", "r2", "r3"]

    def test_a_run_waiting_only_for_a_timer_is_scheduled_when_it_is_due(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1", timers=[clock.now() + timedelta(seconds=10)])
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0
        clock.advance(9)
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0  # never early
        clock.advance(1)
        assert store.schedule_workflow_tasks(clock.now(), 100) == 1
        assert inbox_of(store, clock, "r1") == ["TimerElapsed"]

    def test_a_paused_queue_neither_schedules_nor_gives_out_tasks(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        store.schedule_workflow_tasks(clock.now(), 100)
        start(store, clock, "r2")
        store.set_queue_paused(QUEUE, "workflow", True)
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0
        assert claim(store, clock) == []  # r1's task exists, but is held back
        store.set_queue_paused(QUEUE, "workflow", False)
        assert store.schedule_workflow_tasks(clock.now(), 100) == 1
        assert sorted(t.run_id for t in claim(store, clock)) == ["r1", "r2"]

    def test_a_queue_holds_at_most_its_capacity_of_tasks_best_runs_first(
        self, store: Store, clock: VirtualClock
    ) -> None:
        store.create_queue(QUEUE, "workflow", 2)
        start(store, clock, "old")
        clock.advance(1)
        start(store, clock, "new")
        start(store, clock, "urgent", priority=9)
        assert store.schedule_workflow_tasks(clock.now(), 100) == 2
        tasks = claim(store, clock)
        assert [t.run_id for t in tasks] == ["urgent", "old"]
        # a claimed task still takes its slot; a completed one frees it
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0
        task = tasks[0]
        assert store.complete_workflow_tasks([(task, decide(store, task, clock.now()))], clock.now()) == [True]
        assert store.schedule_workflow_tasks(clock.now(), 100) == 1
        assert [t.run_id for t in claim(store, clock)] == ["new"]

    def test_runs_sharing_a_concurrency_key_run_one_at_a_time(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "first", key="acct-1")
        step(store, clock, "first")  # it takes the key with its first task
        start(store, clock, "low", key="acct-1")
        clock.advance(1)
        start(store, clock, "high", key="acct-1", priority=5)
        start(store, clock, "elsewhere", key="acct-2")
        assert store.schedule_workflow_tasks(clock.now(), 100) == 1  # acct-2 only
        assert [t.run_id for t in claim(store, clock)] == ["elsewhere"]
        # the holder keeps the key between tasks: its next message gets a task, the others wait
        store.send_message("first", event("go"), clock.now())
        assert store.schedule_workflow_tasks(clock.now(), 100) == 1
        finish(store, clock, "first")
        # the key passes on when the holder ends: highest priority, then oldest
        step(store, clock, "high")
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0
        finish(store, clock, "high")
        step(store, clock, "low")

    def test_a_cancel_reaches_a_run_that_waits_for_its_key(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "holder", key="k")
        step(store, clock, "holder")
        start(store, clock, "waiter", key="k")
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0
        store.request_transition("waiter", RunStatus.CANCELLED, ev.RunCancelled(), clock.now())
        finish(store, clock, "waiter", RunStatus.CANCELLED)  # scheduled without taking the key
        store.send_message("holder", event("go"), clock.now())
        step(store, clock, "holder")  # which the holder still has

    def test_a_suspended_run_gets_a_task_only_for_a_cancel(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1")
        store.request_transition("r1", RunStatus.SUSPENDED, ev.RunSuspended(), clock.now())
        store.send_message("r1", event("held"), clock.now())
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0
        store.request_transition("r1", RunStatus.CANCELLED, ev.RunCancelled(), clock.now())
        assert store.schedule_workflow_tasks(clock.now(), 100) == 1

    # -- claims and leases ---------------------------------------------------------------------------
    def test_tasks_are_claimed_highest_priority_first_then_oldest(self, store: Store, clock: VirtualClock) -> None:
        for run_id, priority in [("a", 0), ("b", 5), ("c", 0), ("d", 5)]:
            start(store, clock, run_id, priority=priority)
            clock.advance(1)
        store.schedule_workflow_tasks(clock.now(), 100)
        order = [t.run_id for _ in range(4) for t in claim(store, clock, limit=1)]
        assert order == ["b", "d", "a", "c"]

    def test_a_claim_takes_only_the_workflows_it_names(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        start(store, clock, "r2", workflow="refund")
        store.schedule_workflow_tasks(clock.now(), 100)
        assert [t.run_id for t in claim(store, clock, names=["refund", "unknown"])] == ["r2"]
        assert claim(store, clock, names=[]) == []
        assert [(t.run_id, t.workflow_name, t.queue) for t in claim(store, clock)] == [("r1", WF, QUEUE)]

    def test_a_lease_keeps_a_task_until_it_expires_and_a_new_claim_bumps_its_version(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        first = next_task(store, clock, "r1", owner="w1")
        assert (first.lease.owner, first.lease.until) == ("w1", clock.now() + LEASE)
        clock.advance(LEASE - timedelta(seconds=1))
        assert claim(store, clock, owner="w2") == []
        clock.advance(1)
        (second,) = claim(store, clock, owner="w2")
        assert second.task_id == first.task_id and second.lease.version > first.lease.version
        # only the lease's holder completes it: the first claim's late result is discarded
        late = decide(store, first, clock.now())
        assert store.complete_workflow_tasks([(first, late)], clock.now()) == [False]
        assert len(store.load_history("r1")) == 1
        assert store.complete_workflow_tasks([(second, decide(store, second, clock.now()))], clock.now()) == [True]

    def test_a_task_given_back_is_claimable_again_from_its_retry_time(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        retry_at = clock.now() + timedelta(seconds=5)
        assert store.retry_workflow_tasks([(task, retry_at)], clock.now()) == [True]
        assert store.retry_workflow_tasks([(task, retry_at)], clock.now()) == [False]  # given back once
        clock.advance(4)
        assert claim(store, clock, owner="w2") == []
        clock.advance(1)
        (again,) = claim(store, clock, owner="w2")
        assert again.task_id == task.task_id and again.lease.version > task.lease.version
        # the given-back claim can no longer write, nor give the task back
        assert store.complete_workflow_tasks([(task, decide(store, task, clock.now()))], clock.now()) == [False]
        assert store.retry_workflow_tasks([(task, clock.now())], clock.now()) == [False]
        assert store.complete_workflow_tasks([(again, decide(store, again, clock.now()))], clock.now()) == [True]
        assert store.retry_workflow_tasks([], clock.now()) == []

    # -- loads -----------------------------------------------------------------------------------
    def test_a_load_gives_the_history_from_a_sequence_number_and_the_visible_inbox(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        result = step(store, clock, "r1")
        last = result.new_events[-1].sequence_number
        store.send_message("r1", event("a"), clock.now())
        task = next_task(store, clock, "r1")
        history, inbox = store.load_workflow_task(task, clock.now())
        assert [e.sequence_number for e in history] == list(range(1, last + 1))
        assert history[1:] == list(result.new_events)
        assert kinds(inbox) == ["a"]
        # a worker whose executor stands at the last event gets exactly that event back
        tail, same = store.load_workflow_task(task, clock.now(), after_seq=last)
        assert [e.sequence_number for e in tail] == [last] and same == inbox
        tail, _inbox = store.load_workflow_task(task, clock.now(), after_seq=3)
        assert [e.sequence_number for e in tail] == list(range(3, last + 1))
        start(store, clock, "r2")
        other = next_task(store, clock, "r2")
        other_events, other_inbox = store.load_workflow_task(other, clock.now())
        batch = store.load_workflow_tasks([(task, last), (other, 0)], clock.now())
        assert batch == [
            WorkflowInput(events=tail[-1:], inbox=inbox),
            WorkflowInput(events=other_events, inbox=other_inbox),
        ]

    def test_messages_are_loaded_in_the_order_they_became_visible(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        t0 = clock.now()
        # a timer inserted first but due late must not overtake an event that arrived before it fired
        step(store, clock, "r1", timers=[t0 + timedelta(seconds=10), t0 + timedelta(seconds=3)])
        clock.advance(5)
        store.send_message("r1", event("early"), clock.now())
        assert kinds(store.load_workflow_task(task_of("r1"), clock.now())[1]) == ["TimerElapsed", "early"]
        clock.advance(5)
        store.send_message("r1", event("late"), clock.now())
        loaded = store.load_workflow_task(task_of("r1"), clock.now())[1]
        assert kinds(loaded) == ["TimerElapsed", "early", "TimerElapsed", "late"]
        fired = [m.event.created_seq for m in loaded if isinstance(m.event, ev.TimerElapsed)]
        assert fired[0] > fired[1]  # the second timer created fired first

    def test_a_batch_load_reports_a_missing_run_for_its_task_alone(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        with pytest.raises(RunNotFoundError):
            store.load_workflow_task(task_of("gone"), clock.now())
        good, missing = store.load_workflow_tasks([(task, 0), (task_of("gone"), 0)], clock.now())
        assert isinstance(missing, RunNotFoundError)
        assert not isinstance(good, Exception) and kinds(good.inbox) == ["RunStarted"]
        assert store.load_workflow_tasks([], clock.now()) == []

    def test_a_tail_of_a_run_that_is_gone_says_so_and_a_tail_past_the_end_is_empty(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        with pytest.raises(RunNotFoundError):
            store.load_workflow_task(task_of("gone"), clock.now(), after_seq=5)
        # an executor standing past the stored history (its result was refused) learns only that
        assert store.load_workflow_task(task, clock.now(), after_seq=5)[0] == []
        start(store, clock, "r2")
        other = next_task(store, clock, "r2")
        past, missing = store.load_workflow_tasks([(other, 5), (task_of("gone"), 5)], clock.now())
        assert isinstance(missing, RunNotFoundError)
        assert not isinstance(past, Exception) and past.events == [] and kinds(past.inbox) == ["RunStarted"]


class TestWorkflowTaskQueueMemory(MemoryBackend, WorkflowTaskQueueContract):
    pass


class TestWorkflowTaskQueuePostgres(PostgresBackend, WorkflowTaskQueueContract):
    pass
