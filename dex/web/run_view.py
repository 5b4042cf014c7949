"""The run page's content: the run, its input and outcome pretty-printed, parent and children,
its steps as a timeline, its activity steps' attempts (how many, the newest failures, the next
retry), its pending activities and its full history with decoded payloads.

The history is shown a page of :data:`HISTORY_PAGE` events at a time (``?from=`` names the
first sequence number shown), and the timeline and its table show the steps scheduled among
those events: a run of fifty thousand activities made a page of 80 MB that took ten seconds
to render, and no browser shows it. The pager links to the first, previous, next and last page.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from dex.app.facade.steps import ActivityStep, steps_in
from dex.domain import events as ev
from dex.domain.errors import SerializationError
from dex.domain.values import Payload
from dex.views.attempts import attempts_text, visible, when_text
from dex.views.render import decode, jsonable, show_payload
from dex.views.timeline import stack_trace
from dex.web.charts import steps_of, timeline
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


def run_view(web: Any, run_id: str, now: datetime, start: int | None = None) -> dict[str, Any]:
    """What the run page shows; ``start``: a sequence number on the history page to show."""
    run = web.record(run_id)
    history = web.store.load_history(run_id)
    pending = web.insights.pending_activities(run_id, history) if not run.status.is_terminal else []
    created = created_event(history)
    index, pager = history_page(history, start)
    shown = history[index : index + HISTORY_PAGE]
    # the activity steps scheduled among the events shown, with their attempts: the attempts of
    # those steps only, their outcomes from the history read (what ends after it, from the store)
    following = history[index + HISTORY_PAGE :]
    activities = steps_in(web.store, run_id, shown, run.status.is_terminal, following=following) if shown else []
    # the steps scheduled among the events shown, on an axis from the page's first event
    attempts = {s.seq: s.attempts for s in activities if s.attempts > 1}
    steps = [s for s in steps_of(history, pending, attempts) if pager.first_seq <= s.seq <= pager.last_seq]
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
        "children": children_of(history),
        "timeline": timeline(steps, origin, end),
        "pager": pager,
        "pending": pending,
        "activity_steps": [_step_row(step) for step in activities],
        "history": [{**event_document(item), "text": pretty(event_document(item)["event"])} for item in shown],
        "live": not run.status.is_terminal,
    }


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
