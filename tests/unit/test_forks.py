"""The fork plan (dex/domain/forks.py, docs/reference/contract.md §11), checked against every golden history at every
point it can be forked: the copy is the original's prefix, replays against the same code, and
what the plan starts again is exactly what the copied history leaves pending."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import attrs
import pytest

import dex
from dex.domain import events as ev
from dex.domain.forks import child_run_id, fork_point, fork_points, plan_fork
from dex.domain.state import fold
from tests.golden import workflows as golden
from tests.golden.workflows import ACTIVITIES, GOLDEN_FILES, WORKFLOWS

GOLDEN_DIR = Path(golden.__file__).resolve().parent
NOW = datetime(2030, 1, 1, tzinfo=UTC)
FORK = "01900000-0000-7000-8000-000000000001"


def _history(name: str) -> list[ev.HistoryEvent]:
    return dex.testing.load_history((GOLDEN_DIR / f"{name}.binpb").read_bytes())


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_every_fork_point_of_a_golden_history_gives_a_copy_that_replays_and_restarts_what_was_pending(
    name: str,
) -> None:
    history = _history(name)
    points = fork_points(history)
    assert points[0] == 1 and list(points) == sorted(set(points))
    assert all(history[p - 1].kind == "WorkflowTaskCompleted" for p in points[1:])
    ending = max(i for i, item in enumerate(history) if item.kind == "RunCompleted")
    assert points[-1] < ending + 1  # never the task that ended the run
    assert fork_point(history, None, "r") == points[-1]
    for at in points:
        fork = plan_fork(history, at, run_id=FORK, forked_from="r", queue=None, code_version="v9", now=NOW)
        assert [item.sequence_number for item in fork.history] == list(range(1, at + 1))
        assert fork.created == attrs.evolve(history[0].event, parent_run_id=None, code_version="v9")
        state = fold(fork.history)
        assert {task.created_seq for task in fork.activity_tasks} == state.pending_activities
        timers = {m.event.created_seq for m in fork.messages if isinstance(m.event, ev.TimerElapsed)}
        assert timers == state.pending_timers
        assert {child.run_id for child in fork.child_runs} == set(state.pending_children)
        for child in fork.child_runs:  # renamed in the copy, as the fork's own code names them
            (seq,) = [i.sequence_number for i in fork.history if getattr(i.event, "child_run_id", None) == child.run_id]
            assert child.run_id == child_run_id(FORK, fork.created.generation, seq)
            assert child.created.parent_run_id == FORK
        renamed = {child.run_id for child in fork.child_runs}
        for copied, original in zip(fork.history[1:], history[1:at], strict=True):
            if getattr(copied.event, "child_run_id", None) not in renamed:
                assert copied == original
        again = [m.event for m in fork.messages if isinstance(m.event, ev.ExternalEventReceived)]
        assert again == [i.event for i in history[at:] if isinstance(i.event, ev.ExternalEventReceived)]
        if fork.started:  # the copy replays against the code that made the original
            dex.testing.replay(GOLDEN_FILES[name], list(fork.history), activities=ACTIVITIES, workflows=WORKFLOWS)
            result = fork.first_task(run_started=42)
            assert result.consumed == (42,) and result.expected_last_seq == 1 and result.started
            assert result.new_events == fork.history[1:]


def test_a_fork_on_another_queue_and_of_a_continued_run() -> None:
    history = _history("order")
    fork = plan_fork(history, 1, run_id=FORK, forked_from="r", queue="repairs", code_version=None, now=NOW)
    assert not fork.started and fork.created.queue == "repairs"
    assert fork.created.code_version == history[0].event.code_version  # type: ignore[union-attr]
    # a run that continued as new numbers on: its points start at its RunCreated
    shifted = [attrs.evolve(item, sequence_number=item.sequence_number + 40) for item in history]
    assert fork_points(shifted) == tuple(p + 40 for p in fork_points(history))
    with pytest.raises(ValueError, match="before the history of run r, which continued as new from 41"):
        fork_point(shifted, 3, "r")


@pytest.mark.parametrize(
    ("at", "error", "message"),
    [
        (0, ValueError, "at must be a sequence number"),
        (10**9, ValueError, "beyond the history of run r"),
        (False, TypeError, "at must be an int"),
        (1.5, TypeError, "at must be an int"),
        ("1", TypeError, "at must be an int"),
    ],
)
def test_bad_fork_points(at: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        fork_point(_history("order"), at, "r")


def test_a_run_that_failed_in_its_first_task_forks_from_its_start() -> None:
    created = ev.RunCreated(workflow_name="w", input=(), queue="default")
    failure = dex.FailureInfo(type="ValueError", message="boom")
    events: list[ev.Event] = [
        created,
        ev.WorkflowTaskStarted(),
        ev.RunStarted(),
        ev.RunCompleted(status=dex.RunStatus.FAILED, failure=failure),
        ev.WorkflowTaskCompleted(),
    ]
    history = [ev.HistoryEvent(sequence_number=n, timestamp=NOW, event=e) for n, e in enumerate(events, 1)]
    assert fork_points(history) == (1,)
    assert fork_point(history, None, "r") == 1
    with pytest.raises(ValueError, match=r"at=5 ends the workflow task that ended the run; run r can be forked at 1$"):
        fork_point(history, 5, "r")
    fork = plan_fork(history, 1, run_id=FORK, forked_from="r", queue=None, code_version=None, now=NOW)
    assert not fork.started and fork.history == (history[0],)
    assert fork.activity_tasks == () and fork.messages == () and fork.child_runs == ()
