"""The run page's content: the run, its input and outcome pretty-printed, parent and children,
its steps as a timeline, its activity steps' attempts (how many, the newest failures, the next
retry), its pending activities and its full history with decoded payloads.

The history is shown a page of :data:`HISTORY_PAGE` events at a time (``?from=`` names the
first sequence number shown), and the timeline and its table show the steps scheduled among
those events: a run of fifty thousand activities made a page of 80 MB that took ten seconds
to render, and no browser shows it. The pager links to the first, previous, next and last page.

An ended run's page reads only what it shows: the history's bounds (the pager is arithmetic:
the history is numbered consecutively), the page's events, its first event (the input), at most
:data:`FOLLOWING` events after the page (where its timers and children ended) and its activity
steps' attempts and outcomes (:func:`~dex.app.facade.steps.steps_in`); its children are those
started among the events shown. A live run's page reads the whole history: its pending
activities may have been scheduled anywhere in it.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from dex.app.facade.steps import UNKNOWN, ActivityStep, steps_in
from dex.domain import events as ev
from dex.domain.errors import SerializationError
from dex.domain.values import Payload
from dex.views.attempts import attempts_text, visible, when_text
from dex.views.render import decode, jsonable, show_payload
from dex.views.timeline import stack_trace
from dex.web.charts import Step, steps_of, timeline
from dex.web.listing import children_of, created_event, event_document


def pretty(value: Any) -> str:
    """JSON data, indented for reading."""
    return json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False, default=repr)


def pretty_payload(payload: Payload | None) -> str:
    if payload is None:
        return "null"
    try:
        return pretty(jsonable(decode(payload)))
    except SerializationError:
        return show_payload(payload, limit=None)


HISTORY_PAGE = 500  # events shown at once
# events read after a page to find where the timers and children scheduled on it ended (a
# step that ends further on shows "not read"; activities' outcomes are looked for further)
FOLLOWING = 2_000
NOT_READ = "not-read"  # a step's outcome on the timeline when it lies beyond what was read


@attrs.frozen(kw_only=True)
class Pager:
    """Which events of the history a page shows, and where its links lead (``from`` values)."""

    first_seq: int  # shown: first_seq .. last_seq (0 and -1 for an empty history)
    last_seq: int
    total: int  # events in the whole history
    first: int | None  # the first page's ``from``, when this is not it
    previous: int | None
    next: int | None
    last: int | None  # the last page's ``from``, when this is not it

    @property
    def paged(self) -> bool:
        return self.first is not None or self.last is not None


def history_page(history: Sequence[ev.HistoryEvent], start: int | None, size: int = HISTORY_PAGE) -> tuple[int, Pager]:
    """The index of the first event shown (the page holding sequence number ``start``, or the
    first page) and the page's :class:`Pager`. Pages are cut at multiples of ``size`` events,
    so a link always leads to the same events whatever ``start`` was asked for."""
    total = len(history)
    if total == 0:
        return 0, Pager(first_seq=0, last_seq=-1, total=0, first=None, previous=None, next=None, last=None)
    seqs = [item.sequence_number for item in history]
    index = 0 if start is None else min(bisect_left(seqs, start), total - 1)
    index -= index % size
    end = min(index + size, total)
    last_index = (total - 1) - (total - 1) % size
    return index, Pager(
        first_seq=seqs[index],
        last_seq=seqs[end - 1],
        total=total,
        first=seqs[0] if index > 0 else None,
        previous=seqs[index - size] if index > 0 else None,
        next=seqs[end] if end < total else None,
        last=seqs[last_index] if index < last_index else None,
    )


def pager_of(first_seq: int, last_seq: int, start: int | None, size: int = HISTORY_PAGE) -> Pager:
    """:func:`history_page`'s pager for a history numbered ``first_seq`` to ``last_seq``,
    consecutively (as every stored history is), without its events."""
    total = last_seq - first_seq + 1
    index = 0 if start is None else min(max(start - first_seq, 0), total - 1)
    index -= index % size
    end = min(index + size, total)
    last_index = (total - 1) - (total - 1) % size
    return Pager(
        first_seq=first_seq + index,
        last_seq=first_seq + end - 1,
        total=total,
        first=first_seq if index > 0 else None,
        previous=first_seq + index - size if index > 0 else None,
        next=first_seq + end if end < total else None,
        last=first_seq + last_index if index < last_index else None,
    )


def run_view(web: Any, run_id: str, now: datetime, start: int | None = None) -> dict[str, Any]:
    """What the run page shows; ``start``: a sequence number on the history page to show."""
    run = web.record(run_id)
    live = not run.status.is_terminal
    history: list[ev.HistoryEvent] | None = None
    if live:  # its pending activities may have been scheduled anywhere in its history
        history = web.store.load_history(run_id)
        pending = web.insights.pending_activities(run_id, history)
        first_seq, last_seq = history[0].sequence_number, history[-1].sequence_number
    else:
        pending = []
        first_seq, last_seq = web.store.history_bounds(run_id)

    def read(after: int, limit: int) -> list[ev.HistoryEvent]:
        if history is not None:
            return history[after + 1 - first_seq : after + 1 - first_seq + limit] if after + 1 >= first_seq else []
        return web.store.load_history_after(run_id, after, limit)  # type: ignore[no-any-return]

    pager = pager_of(first_seq, last_seq, start)
    shown = read(pager.first_seq - 1, HISTORY_PAGE)
    created = created_event(shown if pager.first is None else read(first_seq - 1, 1))
    # the events after the page: a live run's all (read already), an ended run's first few
    following = read(pager.last_seq, last_seq if live else FOLLOWING) if pager.next is not None else []
    # the activity steps scheduled among the events shown, with their attempts: the attempts of
    # those steps only, their outcomes from the events read, then from the store further on
    activities = steps_in(web.store, run_id, shown, not live, following=following) if shown else []
    # the steps scheduled among the events shown, on an axis from the page's first event
    attempts = {s.seq: s.attempts for s in activities if s.attempts > 1}
    scheduled = [s for s in steps_of([*shown, *following], pending, attempts) if s.seq <= pager.last_seq]
    cut = bool(following) and following[-1].sequence_number < last_seq  # the history goes on past them
    by_seq = {step.seq: step for step in activities}
    steps = [_ended(step, by_seq, cut) for step in scheduled]
    origin = shown[0].timestamp if pager.first is not None else run.created_at
    end = run.completed_at or now
    return {
        "run": run,
        "title": f"{run.workflow_name} {run.run_id}",
        "inputs": [pretty_payload(p) for p in created.input] if created is not None else [],
        "result": pretty_payload(run.result) if run.result is not None else None,
        "failure": run.failure,
        "failure_trace": stack_trace(run.failure) if run.failure is not None else None,
        "task_failure": run.task_failure,
        "task_failure_trace": stack_trace(run.task_failure) if run.task_failure is not None else None,
        "children": children_of(shown),
        "timeline": timeline(steps, origin, end),
        "pager": pager,
        "pending": pending,
        "activity_steps": [_step_row(step) for step in activities],
        "history": [{**event_document(item), "text": pretty(event_document(item)["event"])} for item in shown],
        "live": live,
    }


def _ended(step: Step, activities: dict[int, ActivityStep], cut: bool) -> Step:
    """A timeline step with its end from where it was found: an activity's from its step (its
    outcome may lie past the events read); a timer or child still open when the events read
    stop short of the history's end shows its outcome as :data:`NOT_READ`."""
    if step.outcome != "pending":
        return step
    activity = activities.get(step.seq)
    if activity is not None and activity.ended_at is not None:
        return attrs.evolve(step, end=activity.ended_at, outcome=activity.status)
    if (activity is not None and activity.status == UNKNOWN) or (activity is None and cut):
        return attrs.evolve(step, outcome=NOT_READ)
    return step


def _step_row(step: ActivityStep) -> dict[str, Any]:
    """An activity step as the run page's attempts table shows it: its counts, what comes next,
    and each recent failed or lost attempt with its failure's first line and whole trace."""
    return {
        "step": step,
        "attempts": attempts_text(step),
        "next": when_text(step),
        "failures": [
            {
                "attempt": attempt,
                "summary": visible(f"{attempt.failure.type}: {attempt.failure.message}".split("\n", 1)[0])[:300],
                "trace": stack_trace(attempt.failure),
            }
            for attempt in step.recent
        ],
    }
