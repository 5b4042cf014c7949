"""The WorkflowTaskQueue port's contract, second half: what a completed workflow task writes.

A result applies only under its claim's lease and only if the run's history still ends where
the task found it (docs/reference/contract.md §6: a racing duplicate discards its work); applied, it appends its
block, consumes its messages and carries out its effects — activity tasks, timers, messages,
child runs, the run's outcome — and ``complete_workflow_tasks_then_claim`` claims the activity
tasks it made in the same transaction.
"""

from __future__ import annotations

from datetime import timedelta

import attrs

from dex.app.ports.store import Claim, Store
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.task import NewRun, OutgoingMessage
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    LEASE,
    LOCK_TIMEOUT,
    QUEUE,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    activity,
    claim,
    created,
    decide,
    event,
    finish,
    inbox_of,
    next_task,
    start,
    step,
)


def _activity_claim(owner: str = "eager", limit: int = 8, lease: timedelta = LEASE) -> Claim:
    return Claim(names=frozenset({ACT}), owner=owner, limit=limit, lease=lease)


class WorkflowCompletionContract(PortContract):
    def test_a_result_appends_its_block_and_consumes_what_it_saw(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        result = decide(store, task, clock.now())
        store.send_message("r1", event("during"), clock.now())  # arrives while the task runs
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        assert store.load_history("r1")[1:] == list(result.new_events)
        assert inbox_of(store, clock, "r1") == ["during"]  # RunStarted consumed, the newcomer kept
        assert store.get_run("r1").status is RunStatus.RUNNING  # type: ignore[union-attr]
        # and what is left leads to the run's next task
        assert store.schedule_workflow_tasks(clock.now(), 100) == 1

    def test_a_result_whose_history_moved_on_is_discarded(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        result = decide(store, task, clock.now())
        stale = attrs.evolve(result, expected_last_seq=result.expected_last_seq - 1)
        assert store.complete_workflow_tasks([(task, stale)], clock.now()) == [False]
        assert len(store.load_history("r1")) == 1
        assert inbox_of(store, clock, "r1") == ["RunStarted"]  # nothing consumed
        step(store, clock, "r1")  # the run is simply done again

    def test_two_results_of_one_claim_apply_once(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        start(store, clock, "r2")
        store.schedule_workflow_tasks(clock.now(), 100)
        one, two = claim(store, clock)
        first, again = decide(store, one, clock.now()), decide(store, one, clock.now())
        other = decide(store, two, clock.now())
        applied = store.complete_workflow_tasks([(one, first), (one, again), (two, other)], clock.now())
        assert applied == [True, False, True]
        assert len(store.load_history("r1")) == len(first.new_events) + 1
        assert store.complete_workflow_tasks([], clock.now()) == []

    def test_a_result_sends_messages_to_live_runs_only(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "parent")
        start(store, clock, "child")
        start(store, clock, "ended")
        finish(store, clock, "ended")
        sent = [("child", event("hello")), ("ended", event("late")), ("unknown", event("lost"))]
        step(store, clock, "parent", send=sent)
        assert inbox_of(store, clock, "child") == ["RunStarted", "hello"]
        assert store.get_run("ended").status is RunStatus.COMPLETED  # type: ignore[union-attr]
        assert store.get_run("unknown") is None

    def test_a_run_s_outcome_wins_over_a_suspend_that_raced_with_its_last_task(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1")
        store.send_message("r1", event("last"), clock.now())
        task = next_task(store, clock, "r1")
        result = decide(store, task, clock.now(), complete=RunStatus.COMPLETED)
        store.request_transition("r1", RunStatus.SUSPENDED, ev.RunSuspended(), clock.now())
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        assert store.get_run("r1").status is RunStatus.COMPLETED  # type: ignore[union-attr]
        assert inbox_of(store, clock, "r1") == []

    def test_a_message_sent_for_later_is_visible_from_its_time(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "sender")
        start(store, clock, "receiver")
        step(store, clock, "receiver")
        later = clock.now() + timedelta(seconds=30)
        task = next_task(store, clock, "sender")
        result = attrs.evolve(
            decide(store, task, clock.now()),
            messages=(OutgoingMessage(run_id="receiver", event=event("reminder"), visible_from=later),),
        )
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        assert inbox_of(store, clock, "receiver") == []
        assert store.next_due_time(clock.now()) == later
        clock.advance_to(later)
        assert inbox_of(store, clock, "receiver") == ["reminder"]
        assert store.schedule_workflow_tasks(clock.now(), 100) == 1

    def test_a_result_makes_its_activity_tasks(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT], priority=3)
        tasks = activity(store, clock)
        assert [(t.run_id, t.name, t.attempt, t.priority, t.queue) for t in tasks] == [("r1", ACT, 1, 3, QUEUE)] * 2
        history = store.load_history("r1")
        created_seqs = [e.sequence_number for e in history if isinstance(e.event, ev.ActivityTaskCreated)]
        assert sorted(t.created_seq for t in tasks) == created_seqs

    def test_a_run_that_ends_drops_its_inbox_and_its_activity_tasks(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1", key="k")
        step(store, clock, "r1", activities=[ACT], timers=[clock.now() + timedelta(seconds=5)])
        store.send_message("r1", event("pending"), clock.now())
        task = next_task(store, clock, "r1")
        result = decide(store, task, clock.now(), complete=RunStatus.CANCELLED)
        store.send_message("r1", event("during"), clock.now())
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        record = store.get_run("r1")
        assert record is not None and (record.status, record.completed_at) == (RunStatus.CANCELLED, clock.now())
        clock.advance(10)
        assert inbox_of(store, clock, "r1") == []  # the event that came during the task and the timer
        assert activity(store, clock) == []
        assert store.schedule_workflow_tasks(clock.now(), 100) == 0
        start(store, clock, "r2", key="k")  # and the key is free
        step(store, clock, "r2")

    def test_a_result_creates_its_child_runs_unless_their_instance_is_taken(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "holder", instance_id="inv-7")
        start(store, clock, "parent")
        children = [
            NewRun(run_id="child-1", created=created(parent="parent", labels=(("of", "parent"),))),
            NewRun(run_id="child-2", created=created(parent="parent", instance_id="inv-7")),
        ]
        step(store, clock, "parent", children=children)
        child = store.get_run("child-1")
        assert child is not None and (child.status, child.parent_run_id) == (RunStatus.CREATED, "parent")
        assert [e.event for e in store.load_history("child-1")] == [children[0].created]
        assert inbox_of(store, clock, "child-1") == ["RunStarted"]
        # the clash is the parent's news, not an error of the batch
        assert store.get_run("child-2") is None
        (news,) = store.load_workflow_task(next_task(store, clock, "parent"), clock.now())[1]
        assert isinstance(news.event, ev.ChildRunFailed) and news.event.child_run_id == "child-2"

    def test_a_run_continued_as_new_keeps_only_the_messages_addressed_to_it(
        self, store: Store, clock: VirtualClock
    ) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1", timers=[clock.now() + timedelta(seconds=5)])
        store.send_message("r1", event("wake"), clock.now())
        task = next_task(store, clock, "r1")
        seen = decide(store, task, clock.now())
        store.send_message("r1", event("kept"), clock.now())  # not seen by this task
        last = seen.expected_last_seq
        generation = attrs.evolve(created(), generation=2)
        result = attrs.evolve(
            seen,
            new_events=(),
            new_history=(ev.HistoryEvent(sequence_number=last + 1, timestamp=clock.now(), event=generation),),
            messages=(OutgoingMessage(run_id="r1", event=ev.RunStarted(), visible_from=clock.now()),),
        )
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        assert [(e.sequence_number, e.event) for e in store.load_history("r1")] == [(last + 1, generation)]
        clock.advance(10)  # the old generation's timer never fires into the new one
        assert inbox_of(store, clock, "r1") == ["kept", "RunStarted"]

    # -- complete, then claim ----------------------------------------------------------------------
    def test_a_completion_claims_the_activity_tasks_it_made(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        result = decide(store, task, clock.now(), activities=[ACT, ACT, ACT])
        lease = LOCK_TIMEOUT * 2  # longer than the tasks' lock_timeout, which caps it
        applied, claimed = store.complete_workflow_tasks_then_claim(
            [(task, result)], clock.now(), _activity_claim(limit=2, lease=lease)
        )
        assert applied == [True]
        assert [(t.run_id, t.lease.owner, t.lease.until) for t in claimed] == [
            ("r1", "eager", clock.now() + LOCK_TIMEOUT)
        ] * 2
        # claimed is claimed: the third is left for others, and nothing more
        assert len(store.claim_activity_tasks(frozenset({ACT}), "other", clock.now(), LEASE, 8)) == 1

    def test_a_completion_that_makes_no_activity_claims_none(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        start(store, clock, "r2")
        step(store, clock, "r1", activities=[ACT])  # a claimable activity task of another run
        store.schedule_activity_tasks(clock.now(), 100)
        task = next_task(store, clock, "r2")
        result = decide(store, task, clock.now())
        applied = store.complete_workflow_tasks_then_claim([(task, result)], clock.now(), _activity_claim())
        assert applied == ([True], [])

    def test_a_discarded_completion_claims_nothing(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        result = decide(store, task, clock.now(), activities=[ACT])
        stale = attrs.evolve(task, lease=attrs.evolve(task.lease, version=task.lease.version + 7))
        assert store.complete_workflow_tasks_then_claim([(stale, result)], clock.now(), _activity_claim()) == (
            [False],
            [],
        )
        assert activity(store, clock) == []

    def test_a_completion_claims_nothing_from_a_paused_queue(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        task = next_task(store, clock, "r1")
        result = decide(store, task, clock.now(), activities=[ACT])
        store.ensure_queue(QUEUE, "activity")
        store.set_queue_paused(QUEUE, "activity", True)
        assert store.complete_workflow_tasks_then_claim([(task, result)], clock.now(), _activity_claim()) == (
            [True],
            [],
        )
        store.set_queue_paused(QUEUE, "activity", False)
        assert len(activity(store, clock)) == 1


class TestWorkflowCompletionMemory(MemoryBackend, WorkflowCompletionContract):
    pass


class TestWorkflowCompletionPostgres(PostgresBackend, WorkflowCompletionContract):
    pass
