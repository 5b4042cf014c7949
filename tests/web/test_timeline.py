"""The run page's timeline shows every event a reader of the history looks for: the steps as
bars, a suspension from its start to the resume, and what happened at one moment (an event
received, a cancel asked for, a value published, ...) as a mark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import dex
from dex.domain import events as ev
from dex.domain.values import Payload
from dex.web.charts import steps_of
from tests.web.conftest import waiting

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
VALUE = Payload(data=b"1", encoding="json")


def _history(*events: ev.Event) -> list[ev.HistoryEvent]:
    return [
        ev.HistoryEvent(sequence_number=i, timestamp=T0 + timedelta(seconds=i), event=event)
        for i, event in enumerate(events, start=1)
    ]


def test_events_suspensions_cancels_and_updates_are_on_the_timeline() -> None:
    history = _history(
        ev.RunStarted(),  # 1
        ev.ExternalEventReceived(event_id="go", payload=VALUE),  # 2
        ev.RunSuspended(),  # 3
        ev.RunResumed(),  # 4
        ev.UpdateAccepted(update_id="u-1", name="add-item"),  # 5
        ev.UpdateCompleted(update_id="u-1", result=VALUE),  # 6
        ev.ValuePublished(key="stage", value=VALUE),  # 7
        ev.LabelsChanged(set=(("tier", "gold"),)),  # 8
        ev.RunCancelled(reason="customer asked"),  # 9
    )
    steps = {step.seq: step for step in steps_of(history, ())}
    assert 1 not in steps  # bookkeeping stays out
    assert (steps[2].kind, steps[2].name, steps[2].outcome) == ("event", "event go", "received")
    assert steps[2].end == steps[2].start  # a mark: no length
    assert (steps[3].kind, steps[3].outcome, steps[3].end) == ("suspension", "resumed", T0 + timedelta(seconds=4))
    assert (steps[5].name, steps[5].outcome, steps[5].end) == (
        "update add-item",
        "completed",
        T0 + timedelta(seconds=6),
    )
    assert steps[7].name == "published stage" and steps[8].kind == "labels"
    assert (steps[9].name, steps[9].outcome) == ("cancel requested: customer asked", "requested")


def test_a_suspension_not_yet_resumed_is_pending() -> None:
    steps = steps_of(_history(ev.RunStarted(), ev.RunSuspended()), ())
    assert [(s.kind, s.outcome, s.end) for s in steps] == [("suspension", "pending", None)]


def test_the_run_page_shows_the_event_it_received(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(waiting)
    engine.drain()
    engine.send_event(run_id, "go", 5)
    engine.drain()
    page = http.get(f"/runs/{run_id}").text
    timeline = page[page.index('id="timeline"') :]
    assert "event go" in timeline and "received" in timeline
