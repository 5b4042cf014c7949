"""The WorkflowTaskQueue port's contract for answered steps (``AnsweredStep``): an activity's
outcome and the workflow step it answers, written in one transaction ("one write per activity").

A step applies only while nothing else happened to the run: the activity's claim holds, the
history ends where the step's executor stood, the run is RUNNING with no workflow task and no
visible message, and its workflow queue is not paused (its room does not count: the step takes
no slot). Then the outcome's message is in
the step's history, the activity task is gone, and the step's effects are carried out. In
every other case nothing of it is written and the activity task stays as it was, so that the
ordinary outcome write that follows applies.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dex.app.ports.store import ActivityOutcome, ActivityTask, AnsweredStep, Claim, Lease, Store
from dex.domain import events as ev
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.task import NewActivityTask, WorkflowTaskResult, activity_task
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    LEASE,
    LOCK_TIMEOUT,
    QUEUE,
    WF,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    activity,
    done,
    event,
    inbox_of,
    payload,
    start,
    step,
)


def _running(store: Store, clock: VirtualClock, run_id: str = "r1") -> ActivityTask:
    """A started run waiting for its one activity, whose attempt is claimed."""
    start(store, clock, run_id)
    step(store, clock, run_id, activities=[ACT])
    (task,) = [t for t in activity(store, clock) if t.run_id == run_id]
    return task


def _answer(
    store: Store, clock: VirtualClock, outcome: ActivityOutcome, *, then: str = "activity"
) -> tuple[AnsweredStep, WorkflowTaskResult]:
    """The step ``outcome`` answers, as the engine holding the run's executor decides it: the
    outcome's message, then another activity (``then="activity"``) or the run's end."""
    run_id, now = outcome.task.run_id, clock.now()
    history = store.load_history(run_id)
    last = history[-1].sequence_number
    message = outcome.message
    assert message is not None and isinstance(history[0].event, ev.RunCreated)
    events: list[ev.Event] = [ev.WorkflowTaskStarted(), message]
    specs: list[NewActivityTask] = []
    completion = None
    if then == "activity":
        created = ev.ActivityTaskCreated(
            name=ACT,
            input=(payload(2),),
            queue=QUEUE,
            priority=0,
            retry_policy=RetryPolicy(),
            lock_timeout=LOCK_TIMEOUT,
        )
        events.append(created)
        specs.append(activity_task(run_id, last + 3, created, history[0].event, now))  # as the core makes it
    else:
        completion = ev.RunCompleted(status=RunStatus.COMPLETED, result=payload("done"))
        events.append(completion)
    events.append(ev.WorkflowTaskCompleted())
    answered = AnsweredStep(
        task_id=-outcome.task.task_id,
        run_id=run_id,
        workflow_name=WF,
        queue=QUEUE,
        lease=Lease(owner="w1", until=now + LEASE, version=outcome.task.lease.version),
        outcome=outcome,
        last_seq=last,
    )
    result = WorkflowTaskResult(
        run_id=run_id,
        expected_last_seq=last,
        new_events=tuple(
            ev.HistoryEvent(sequence_number=last + 1 + i, timestamp=now, event=e) for i, e in enumerate(events)
        ),
        completion=completion,
        activity_tasks=tuple(specs),
    )
    return answered, result


def _claims(store: Store, clock: VirtualClock) -> list[ActivityTask]:
    return activity(store, clock, owner="a9")


# what may have happened to the run (or its claim) while the step was decided: each declines it
def _lease_lost(store: Store, clock: VirtualClock, task: ActivityTask) -> None:
    clock.advance(LOCK_TIMEOUT + LEASE)
    assert [t.task_id for t in activity(store, clock, owner="a2")] == [task.task_id]


def _history_moved(store: Store, clock: VirtualClock, task: ActivityTask) -> None:
    store.send_message(task.run_id, event("meanwhile"), clock.now())
    step(store, clock, task.run_id)


def _message_waiting(store: Store, clock: VirtualClock, task: ActivityTask) -> None:
    store.send_message(task.run_id, event("meanwhile"), clock.now())


def _suspended(store: Store, clock: VirtualClock, task: ActivityTask) -> None:
    store.request_transition(task.run_id, RunStatus.SUSPENDED, ev.RunSuspended(), clock.now())


def _queue_paused(store: Store, clock: VirtualClock, task: ActivityTask) -> None:
    store.set_queue_paused(QUEUE, "workflow", True)


def _queue_full(store: Store, clock: VirtualClock, task: ActivityTask) -> None:
    store.set_queue_capacity(QUEUE, "workflow", 1)
    start(store, clock, "other")
    assert store.schedule_workflow_tasks(clock.now(), 10) == 1  # the one slot is taken


SPOILERS: dict[str, Callable[[Store, VirtualClock, ActivityTask], None]] = {
    "lease lost": _lease_lost,
    "history moved on": _history_moved,
    "a message waits": _message_waiting,
    "suspended": _suspended,
    "queue paused": _queue_paused,
}


class AnsweredStepContract(PortContract):
    def test_an_answered_step_writes_the_outcome_and_the_step_together(self, store: Store, clock: VirtualClock) -> None:
        task = _running(store, clock)
        answered, result = _answer(store, clock, done(task, 7))
        before = store.load_history("r1")
        assert store.complete_workflow_tasks([(answered, result)], clock.now()) == [True]
        history = store.load_history("r1")
        assert history == before + list(result.new_events)
        completed = [e.event for e in history if isinstance(e.event, ev.ActivityTaskCompleted)]
        assert completed == [ev.ActivityTaskCompleted(created_seq=task.created_seq, result=payload(7))]
        assert inbox_of(store, clock, "r1") == []  # the message never went through the inbox
        assert store.schedule_workflow_tasks(clock.now(), 10) == 0  # and made no workflow task
        (following,) = _claims(store, clock)  # the answered task is gone; the step's own is due
        assert (following.task_id != task.task_id, following.created_seq) == (
            True,
            result.new_events[2].sequence_number,
        )
        # the attempt's claim is used up: its outcome written the ordinary way too is discarded
        assert store.complete_activity_tasks([done(task, 7)], clock.now()) == [False]
        assert store.load_history("r1") == history

    def test_a_second_delivery_of_an_answered_step_is_discarded(self, store: Store, clock: VirtualClock) -> None:
        task = _running(store, clock)
        item = _answer(store, clock, done(task))
        assert store.complete_workflow_tasks([item], clock.now()) == [True]
        history = store.load_history("r1")
        assert store.complete_workflow_tasks([item], clock.now()) == [False]
        assert store.load_history("r1") == history

    def test_an_answered_step_may_end_the_run(self, store: Store, clock: VirtualClock) -> None:
        task = _running(store, clock)
        assert store.complete_workflow_tasks([_answer(store, clock, done(task), then="end")], clock.now()) == [True]
        run = store.get_run("r1")
        assert run is not None and run.status is RunStatus.COMPLETED and run.result == payload("done")
        assert _claims(store, clock) == []

    @pytest.mark.parametrize("spoiler", sorted(SPOILERS))
    def test_a_step_the_run_moved_past_writes_nothing_and_the_outcome_goes_the_ordinary_way(
        self, store: Store, clock: VirtualClock, spoiler: str
    ) -> None:
        task = _running(store, clock)
        item = _answer(store, clock, done(task, 5))
        SPOILERS[spoiler](store, clock, task)
        history = store.load_history("r1")
        assert store.complete_workflow_tasks([item], clock.now()) == [False]
        assert store.load_history("r1") == history
        # the activity task stayed as it was: the ordinary write applies under the same claim
        # (unless the claim itself was lost), and the message reaches the inbox
        applied = store.complete_activity_tasks([done(task, 5)], clock.now())
        assert applied == [spoiler != "lease lost"]
        if applied[0]:
            assert "ActivityTaskCompleted" in inbox_of(store, clock, "r1")

    def test_a_full_workflow_queue_does_not_hold_an_answered_step_back(self, store: Store, clock: VirtualClock) -> None:
        # the step takes no slot of its queue: the runs waiting for one lose nothing to it
        task = _running(store, clock)
        _queue_full(store, clock, task)
        assert store.complete_workflow_tasks([_answer(store, clock, done(task))], clock.now()) == [True]
        assert store.schedule_workflow_tasks(clock.now(), 10) == 0  # still full: the other run's task holds it
        assert [t.run_id for t in store.claim_workflow_tasks({WF}, "w1", clock.now(), LEASE, 10)] == ["other"]

    def test_a_retry_is_not_a_step(self, store: Store, clock: VirtualClock) -> None:
        task = _running(store, clock)
        answered, result = _answer(store, clock, done(task))
        retry = ActivityOutcome(task=task, failure=None, retry_at=clock.now() + LEASE)
        declined = AnsweredStep(
            task_id=answered.task_id,
            run_id=answered.run_id,
            workflow_name=WF,
            queue=QUEUE,
            lease=answered.lease,
            outcome=retry,
            last_seq=answered.last_seq,
        )
        assert store.complete_workflow_tasks([(declined, result)], clock.now()) == [False]
        assert store.complete_activity_tasks([done(task)], clock.now()) == [True]

    def test_answered_steps_and_ordinary_results_share_a_batch(self, store: Store, clock: VirtualClock) -> None:
        task = _running(store, clock, "r1")
        start(store, clock, "r2")
        store.schedule_workflow_tasks(clock.now(), 10)
        (ordinary,) = store.claim_workflow_tasks({WF}, "w1", clock.now(), LEASE, 10)
        from tests.contract.ports.support import decide

        ordinary_result = decide(store, ordinary, clock.now(), activities=[ACT])
        answered = _answer(store, clock, done(task))
        claim = Claim(names=frozenset({ACT}), owner="eager", limit=8, lease=LEASE)
        applied, claimed = store.complete_workflow_tasks_then_claim(
            [(ordinary, ordinary_result), answered], clock.now(), claim
        )
        assert applied == [True, True]
        # both steps' activity tasks are claimed in the same transaction
        assert sorted(t.run_id for t in claimed) == ["r1", "r2"]
        assert store.load_history("r1")[-3].event == done(task).message


class TestAnsweredStepsMemory(MemoryBackend, AnsweredStepContract):
    pass


class TestAnsweredStepsPostgres(PostgresBackend, AnsweredStepContract):
    pass
