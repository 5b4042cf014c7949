"""What a finished workflow task writes (dex.domain.writes), decided without a store."""

from __future__ import annotations

from datetime import UTC, datetime

import attrs
import pytest

from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.task import NewRun, OutgoingMessage, WorkflowTaskResult
from dex.domain.values import FailureInfo, Payload
from dex.domain.writes import (
    SURVIVING_KINDS,
    WAKING_KINDS,
    instance_clash,
    plan_write,
    survives_continue_as_new,
    wakes_suspended,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def history(first: int, *events: ev.Event) -> tuple[ev.HistoryEvent, ...]:
    return tuple(ev.HistoryEvent(sequence_number=first + i, timestamp=NOW, event=e) for i, e in enumerate(events))


def result(**fields: object) -> WorkflowTaskResult:
    return WorkflowTaskResult(run_id="r1", expected_last_seq=1, **fields)  # type: ignore[arg-type]


BLOCK = history(2, ev.WorkflowTaskStarted(), ev.WorkflowTaskCompleted())
DONE = ev.RunCompleted(status=RunStatus.COMPLETED, result=Payload(encoding="json", data=b"1"))


def test_a_block_is_appended_and_moves_the_last_sequence_number() -> None:
    plan = plan_write(result(new_events=BLOCK, consumed=(7, 8), custom_status="half"), RunStatus.RUNNING)
    assert (plan.events, plan.replaces_history, plan.last_seq, plan.consumed) == (BLOCK, False, 3, (7, 8))
    assert (plan.sets_custom_status, plan.custom_status) == (True, "half")
    assert (plan.status, plan.started, plan.ends_run) == (RunStatus.RUNNING, False, False)


def test_a_task_that_wrote_nothing_leaves_the_last_seq_and_the_custom_status() -> None:
    plan = plan_write(result(custom_status="ignored"), RunStatus.RUNNING)
    assert (plan.events, plan.last_seq, plan.sets_custom_status) == ((), None, False)


@pytest.mark.parametrize(
    ("status", "started", "after"),
    [
        (RunStatus.CREATED, True, RunStatus.RUNNING),
        (RunStatus.RUNNING, False, RunStatus.RUNNING),  # started already: its start time stays
        (RunStatus.SUSPENDED, False, RunStatus.SUSPENDED),
    ],
)
def test_a_run_starts_once(status: RunStatus, started: bool, after: RunStatus) -> None:
    plan = plan_write(result(new_events=BLOCK, started=True), status)
    assert (plan.started, plan.status) == (started, after)


@pytest.mark.parametrize("status", [RunStatus.CREATED, RunStatus.RUNNING, RunStatus.SUSPENDED])
def test_the_outcome_wins_over_any_live_status(status: RunStatus) -> None:
    failed = ev.RunCompleted(status=RunStatus.FAILED, failure=FailureInfo(type="E", message="m"))
    plan = plan_write(result(new_events=BLOCK, started=True, completion=failed), status)
    assert (plan.status, plan.ends_run, plan.completion) == (RunStatus.FAILED, True, failed)
    assert plan.started is (status is RunStatus.CREATED)


def test_continue_as_new_replaces_the_history() -> None:
    fresh = history(9, attrs.evolve(ev.RunCreated(workflow_name="w", input=(), queue="q"), generation=2))
    plan = plan_write(result(new_events=BLOCK, new_history=fresh), RunStatus.RUNNING)
    assert (plan.events, plan.replaces_history, plan.last_seq) == (fresh, True, 9)
    assert plan_write(result(new_history=()), RunStatus.RUNNING).last_seq == 0


def test_the_effects_are_passed_on_in_order() -> None:
    child = NewRun(run_id="c", created=ev.RunCreated(workflow_name="w", input=(), queue="q", instance_id="i"))
    sent = (OutgoingMessage(run_id="p", event=ev.RunResumed(), visible_from=NOW),)
    plan = plan_write(result(child_runs=(child,), messages=sent, completion=DONE), RunStatus.RUNNING)
    assert (plan.child_runs, plan.messages) == ((child,), sent)


def test_events_and_requests_to_the_run_survive_continue_as_new_its_old_generation_s_news_not() -> None:
    kept = {kind.__name__ for kind in ev.MESSAGE_TYPES if survives_continue_as_new(_blank(kind))}
    assert (
        kept
        == {"ExternalEventReceived", "RunCancelled", "RunSuspended", "RunResumed", "RunTerminated", "UpdateRequested"}
        == set(SURVIVING_KINDS)
    )


def test_only_a_cancel_or_a_terminate_wakes_a_suspended_run() -> None:
    waking = {kind.__name__ for kind in ev.MESSAGE_TYPES if wakes_suspended(_blank(kind))}
    assert waking == {"RunCancelled", "RunTerminated"} == set(WAKING_KINDS)


def test_a_clashing_child_fails_terminally_naming_its_instance_id() -> None:
    child = NewRun(run_id="c7", created=ev.RunCreated(workflow_name="w", input=(), queue="q", instance_id="inv-1"))
    news = instance_clash(child)
    assert news.child_run_id == "c7"
    assert news.failure == FailureInfo(
        type="InvalidStateError", message="instance id 'inv-1' is in use by a running run", terminal=True
    )


def _blank(kind: type) -> ev.Message:
    """An instance of a message kind, its required fields filled with anything."""
    fields = {a.name: None for a in attrs.fields(kind) if a.default is attrs.NOTHING}
    return kind(**fields)  # type: ignore[no-any-return]
