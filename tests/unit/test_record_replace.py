"""The hand-written ``replace`` of the two records a started engine copies most often
(``State.replace``, ``WorkflowTaskResult.replaced``) agrees with ``attrs.evolve`` on every field:
a field added to either record and forgotten there fails here."""

from __future__ import annotations

from datetime import UTC, datetime

import attrs
import pytest

from dex.app.runtime.coordinator import State
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.task import NewActivityTask, NewRun, OutgoingMessage, RunEffects, WorkflowTaskResult
from dex.domain.values import Payload

NOW = datetime(2026, 1, 2, tzinfo=UTC)


def busy_state() -> State:
    """A state whose every field differs from its default."""
    return State(
        stopping=True,
        wanted=frozenset({"workflow"}),
        claimed_at={"workflow": 1.0},
        worked_at={"w": 2.0},
        full_at={"w": 3.0},
        used=4,
        running={("q", 1): None},  # type: ignore[dict-item]
        backlog=True,
        activities_scheduled_at=5.0,
        depths_at=6.0,
    )


def test_every_field_of_state_is_carried_over() -> None:
    defaults = State()
    busy = busy_state()
    for field in attrs.fields(State):
        assert getattr(busy, field.name) != getattr(defaults, field.name), field.name
    assert busy.replace() == busy
    for field in attrs.fields(State):
        value = getattr(defaults, field.name)
        assert busy.replace(**{field.name: value}) == attrs.evolve(busy, **{field.name: value})


def test_a_field_state_does_not_have_is_refused_as_evolve_refuses_it() -> None:
    with pytest.raises(TypeError, match="no field"):
        busy_state().replace(bakclog=False)


def busy_result() -> WorkflowTaskResult:
    done = ev.RunCompleted(status=RunStatus.COMPLETED, result=Payload(encoding="json/plain", data=b"1"))
    return WorkflowTaskResult(
        run_id="r",
        expected_last_seq=7,
        new_events=(ev.HistoryEvent(sequence_number=8, timestamp=NOW, event=ev.WorkflowTaskStarted()),),
        consumed=(3,),
        started=True,
        completion=done,
        custom_status="busy",
        activity_tasks=(
            NewActivityTask(
                run_id="r",
                created_seq=9,
                name="a",
                input=(),
                queue="default",
                priority=0,
                retry_policy=None,  # type: ignore[arg-type]
                lock_timeout=None,  # type: ignore[arg-type]
                visible_from=NOW,
            ),
        ),
        messages=(OutgoingMessage(run_id="r", event=ev.TimerElapsed(created_seq=2), visible_from=NOW),),
        child_runs=(NewRun(run_id="c", created=ev.RunCreated(workflow_name="w", input=(), queue="default")),),
        new_history=(),
        effects=RunEffects(unread_events=1),
    )


def test_every_field_of_a_result_is_carried_over() -> None:
    busy = busy_result()
    assert busy.replaced() == busy
    assert busy.replaced(consumed=()) == attrs.evolve(busy, consumed=())
    assert busy.replaced(new_events=()) == attrs.evolve(busy, new_events=())
    defaults = WorkflowTaskResult(run_id="", expected_last_seq=0)
    for field in attrs.fields(WorkflowTaskResult):
        assert getattr(busy, field.name) != getattr(defaults, field.name), field.name
