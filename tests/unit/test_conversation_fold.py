"""The fold rules of the events of docs/reference/contract.md §14 (dex/domain/state.py), and the
invariant that nothing is recorded after a run's terminal event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dex.domain import events as ev
from dex.domain.errors import InvalidStateError
from dex.domain.retry import RetryPolicy
from dex.domain.state import fold
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo, Payload

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def value(text: str) -> Payload:
    return Payload(encoding="json/plain", data=f'"{text}"'.encode())


def history(*events: ev.Event) -> list[ev.HistoryEvent]:
    created = ev.RunCreated(
        workflow_name="wf", input=(), queue="default", labels=(("team", "a"),), deadline=T0 + timedelta(hours=1)
    )
    items = [created, ev.WorkflowTaskStarted(), ev.RunStarted(), *events]
    return [ev.HistoryEvent(sequence_number=i + 1, timestamp=T0, event=e) for i, e in enumerate(items)]


def test_published_values_keep_the_latest_per_key_and_streams_count_their_items() -> None:
    state = fold(
        history(
            ev.ValuePublished(key="stage", value=value("collecting")),
            ev.StreamItemWritten(key="progress", value=value("0")),
            ev.ValuePublished(key="total", value=value("3")),
            ev.StreamItemWritten(key="progress", value=value("1")),
            ev.ValuePublished(key="stage", value=value("paying")),
            ev.StreamClosed(key="progress"),
        )
    )
    assert state.published == (("stage", value("paying")), ("total", value("3")))
    assert state.streams == (("progress", 2),)
    assert state.closed_streams == {"progress"}


def test_a_stream_written_after_it_was_closed_is_an_impossible_history() -> None:
    with pytest.raises(InvalidStateError, match="stream 'log' written after it was closed"):
        fold(history(ev.StreamClosed(key="log"), ev.StreamItemWritten(key="log", value=value("late"))))


def test_labels_start_from_the_run_and_follow_every_change() -> None:
    state = fold(
        history(
            ev.LabelsChanged(set=(("stage", "one"),)),
            ev.LabelsChanged(set=(("stage", "two"), ("zone", "eu")), removed=("team",)),
        )
    )
    assert state.labels == (("stage", "two"), ("zone", "eu"))
    assert state.deadline == T0 + timedelta(hours=1)


def test_each_accepted_update_is_answered_exactly_once() -> None:
    accepted = ev.UpdateAccepted(update_id="u1", name="add", args=(value("x"),))
    state = fold(history(accepted))
    assert state.pending_updates == ("u1",) and not state.answered_updates
    state = fold(history(accepted, ev.UpdateCompleted(update_id="u1", result=value("1"))))
    assert not state.pending_updates and state.answered_updates == {"u1"}
    with pytest.raises(InvalidStateError, match="answered without being accepted, or twice"):
        fold(history(accepted, ev.UpdateCompleted(update_id="u1"), ev.UpdateCompleted(update_id="u1")))
    with pytest.raises(InvalidStateError, match="accepted twice"):
        fold(history(accepted, ev.UpdateCompleted(update_id="u1"), accepted))
    with pytest.raises(InvalidStateError, match="never history"):
        fold(history(ev.UpdateRequested(update_id="u2", name="add")))


def test_cancelling_a_step_ends_its_wait_but_a_child_stays_pending_until_its_outcome() -> None:
    activity = ev.ActivityTaskCreated(
        name="a", input=(), queue="default", priority=0, retry_policy=RetryPolicy(), lock_timeout=timedelta(minutes=1)
    )
    events = [
        activity,  # seq 4
        ev.TimerCreated(fire_at=T0),  # seq 5
        ev.ChildRunCreated(child_run_id="c1", workflow_name="child", input=(), queue="default"),  # seq 6
    ]
    state = fold(history(*events))
    assert state.pending_activities == {4} and state.pending_timers == {5} and state.pending_children == ("c1",)
    state = fold(history(*events, ev.CancelRequested(created_seq=4), ev.CancelRequested(created_seq=5)))
    assert not state.pending_activities and not state.pending_timers and state.pending_children == ("c1",)


def test_a_run_cancel_request_cancels_what_is_pending_then_but_not_the_cleanup_after_it() -> None:
    def created(name: str) -> ev.ActivityTaskCreated:
        return ev.ActivityTaskCreated(
            name=name,
            input=(),
            queue="default",
            priority=0,
            retry_policy=RetryPolicy(),
            lock_timeout=timedelta(minutes=1),
        )

    state = fold(
        history(
            created("charge"),  # seq 4, pending when the cancel arrives
            ev.WorkflowTaskCompleted(),
            ev.WorkflowTaskStarted(),
            ev.RunCancelled(reason="changed my mind"),
            created("release"),  # seq 8: cleanup, run live
            ev.WorkflowTaskCompleted(),
            ev.WorkflowTaskStarted(),
            ev.RunCancelled(reason="again"),
        )
    )
    assert state.cancel_requested and state.pending_activities == {8}


def test_a_terminated_run_ends_terminated_and_only_after_a_run_terminated() -> None:
    state = fold(
        history(
            ev.RunTerminated(reason="stuck"), ev.RunCompleted(status=RunStatus.TERMINATED), ev.WorkflowTaskCompleted()
        )
    )
    assert state.status is RunStatus.TERMINATED and state.terminate_reason == "stuck"
    assert state.status.is_terminal
    with pytest.raises(InvalidStateError, match="exactly when a RunTerminated precedes"):
        fold(history(ev.RunCompleted(status=RunStatus.TERMINATED)))
    with pytest.raises(InvalidStateError, match="exactly when a RunTerminated precedes"):
        fold(history(ev.RunTerminated(), ev.RunCompleted(status=RunStatus.CANCELLED)))


@pytest.mark.parametrize(
    "late",
    [
        ev.ActivityTaskCreated(
            name="cleanup", input=(), queue="default", priority=0, retry_policy=RetryPolicy(), lock_timeout=timedelta(1)
        ),
        ev.UpdateCompleted(update_id="u1", failure=FailureInfo(type="X", message="late")),
        ev.ValuePublished(key="stage", value=value("after")),
        ev.RunCancelled(reason="too late"),
        ev.WorkflowTaskStarted(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_nothing_is_recorded_after_the_terminal_event(late: ev.Event) -> None:
    ended = [ev.RunCompleted(status=RunStatus.CANCELLED)]
    assert fold(history(*ended, ev.WorkflowTaskCompleted())).status is RunStatus.CANCELLED
    with pytest.raises(InvalidStateError, match="recorded after the run ended CANCELLED"):
        fold(history(*ended, late))
