"""``dex runs show``: a run's metadata, outcome and history, as text a person reads top to bottom.

Each history event becomes one line: its sequence number, the time of day (UTC), the time
since the run was created, its kind and what matters about it (the activity and its
arguments, when a timer fires, which event arrived with what payload, the child run, the
failure). Outcomes name the step they answer (``#5 reserve-stock``), so the reader need not
look the sequence number up.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import assert_never

from dex.app.ports.store import RunRecord
from dex.domain import events as ev
from dex.domain.state import fold
from dex.domain.values import FailureInfo
from dex.views.render import (
    fields,
    show_args,
    show_duration,
    show_failure,
    show_labels,
    show_payload,
    show_time,
)

# the bookkeeping around each workflow task; shown with --all
QUIET_KINDS = frozenset({"WorkflowTaskStarted", "WorkflowTaskCompleted"})


def run_details(record: RunRecord, history: Sequence[ev.HistoryEvent]) -> str:
    """The run's metadata and outcome as aligned ``key  value`` lines."""
    created = next((item.event for item in history if isinstance(item.event, ev.RunCreated)), None)
    status = record.status.value
    pairs = [
        ("run", record.run_id),
        ("workflow", record.workflow_name),
        ("status", status + (f"  ({record.custom_status})" if record.custom_status else "")),
        ("instance id", record.instance_id or "-"),
        ("queue", record.queue),
        ("priority", str(record.priority)),
        ("concurrency key", record.concurrency_key or "-"),
        ("labels", show_labels(record.labels)),
        ("parent run", record.parent_run_id or "-"),
        ("code version", record.code_version or "-"),
        *([("forked from", record.forked_from)] if record.forked_from is not None else []),
        ("created", show_time(record.created_at)),
        ("started", show_time(record.started_at)),
        ("completed", _completed(record)),
        *([("deadline", show_time(record.deadline))] if record.deadline is not None else []),
        *([("unread events", str(record.unread_events))] if record.unread_events else []),
    ]
    if created is not None:
        pairs.append(("input", show_args(created.input, limit=None)))
    if record.result is not None:
        pairs.append(("result", show_payload(record.result, limit=None)))
    if record.failure is not None:
        pairs.append(("failure", show_failure(record.failure)))
    if record.task_failure is not None:  # a held run (docs/reference/contract.md §11): why its task keeps failing
        pairs.append(("held", show_failure(record.task_failure)))
    waiting = pending_activities(history) if not record.status.is_terminal else []
    if waiting:  # a name no Python engine registers waits here for a remote worker (docs/reference/contract.md §13)
        pairs.append(("pending", ", ".join(f"#{seq} {name}" for seq, name in waiting)))
    return fields(pairs)


def pending_activities(history: Sequence[ev.HistoryEvent]) -> list[tuple[int, str]]:
    """The activities the run waits for, as (sequence number of their creation, name)."""
    names = {
        item.sequence_number: item.event.name for item in history if isinstance(item.event, ev.ActivityTaskCreated)
    }
    return [(seq, names.get(seq, "?")) for seq in sorted(fold(history).pending_activities)]


def _completed(record: RunRecord) -> str:
    if record.completed_at is None:
        return "-"
    return f"{show_time(record.completed_at)}  (took {show_duration(record.completed_at - record.created_at)})"


def stack_trace(failure: FailureInfo) -> str:
    """The failure's stack traces, innermost cause last, for ``--stack``."""
    parts = []
    current: FailureInfo | None = failure
    while current is not None:
        parts.append(current.stack_trace.rstrip() or f"{current.type}: {current.message}")
        current = current.cause
    return "\n\nCaused by:\n".join(parts)


def timeline(history: Sequence[ev.HistoryEvent], *, show_all: bool = False) -> str:
    """One line per history event (workflow-task bookkeeping left out unless ``show_all``)."""
    if not history:
        return ""
    by_seq = {item.sequence_number: item.event for item in history}
    start = history[0].timestamp
    width = len(str(history[-1].sequence_number))
    lines = []
    for item in history:
        if item.kind in QUIET_KINDS and not show_all:
            continue
        moment = item.timestamp.astimezone(UTC)
        clock = moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
        since = "+" + show_duration(item.timestamp - start)
        detail = describe(item, by_seq)
        lines.append(f"{item.sequence_number:>{width}}  {clock}  {since:>8}  {item.kind:<22} {detail}".rstrip())
    return "\n".join(lines)


def describe(item: ev.HistoryEvent, by_seq: dict[int, ev.Event]) -> str:
    """What matters about one event, on one line."""
    event = item.event
    match event:
        case ev.RunCreated():
            text = f"{event.workflow_name}{show_args(event.input)} on queue {event.queue}"
            return text + (f", generation {event.generation}" if event.generation > 1 else "")
        case ev.RunStarted() | ev.WorkflowTaskStarted() | ev.WorkflowTaskCompleted():
            return ""
        case ev.RunSuspended() | ev.RunResumed():
            return ""
        case ev.ActivityTaskCreated():
            return f"{event.name}{show_args(event.input)} on queue {event.queue}"
        case ev.ActivityTaskCompleted():
            return f"{_step(event.created_seq, by_seq)} -> {show_payload(event.result)}"
        case ev.ActivityTaskFailed():
            return f"{_step(event.created_seq, by_seq)}: {show_failure(event.failure)}"
        case ev.TimerCreated():
            return f"fires at {show_time(event.fire_at, millis=True)} (after {show_duration(event.fire_at - item.timestamp)})"
        case ev.TimerElapsed():
            return f"timer #{event.created_seq}"
        case ev.ExternalEventReceived():
            return f"{event.event_id}: {show_payload(event.payload)}"
        case ev.ChildRunCreated():
            return f"{event.workflow_name}{show_args(event.input)} as run {event.child_run_id}"
        case ev.ChildRunCompleted():
            return f"run {event.child_run_id} -> {show_payload(event.result)}"
        case ev.ChildRunFailed():
            return f"run {event.child_run_id}: {show_failure(event.failure)}"
        case ev.SideEffectExecuted():
            return f"{event.name} -> {show_payload(event.result)}"
        case ev.PatchApplied():
            return event.patch_id
        case ev.RunCancelled():
            return f"reason: {event.reason}" if event.reason else ""
        case ev.RunCompleted():
            if event.failure is not None:
                return f"{event.status.value}: {show_failure(event.failure)}"
            if event.result is not None:
                return f"{event.status.value} -> {show_payload(event.result)}"
            return event.status.value
        case ev.RunTerminated():
            return f"reason: {event.reason}" if event.reason else ""
        case ev.UpdateRequested() | ev.UpdateAccepted():
            return f"{event.name}{show_args(event.args)} as update {event.update_id}"
        case ev.UpdateCompleted():
            if event.failure is not None:
                return f"update {event.update_id}: {show_failure(event.failure)}"
            return f"update {event.update_id} -> {show_payload(event.result) if event.result is not None else ''}"
        case ev.ValuePublished() | ev.StreamItemWritten():
            return f"{event.key}: {show_payload(event.value)}"
        case ev.StreamClosed():
            return event.key
        case ev.LabelsChanged():
            changes = [f"{key}={value}" for key, value in event.set] + [f"-{key}" for key in event.removed]
            return ", ".join(changes)
        case ev.CancelRequested():
            return f"step #{event.created_seq}"
        case ev.DetachedRunCreated():
            return f"{event.workflow_name}{show_args(event.input)} as run {event.run_id}"
        case _:
            assert_never(event)


def _step(created_seq: int, by_seq: dict[int, ev.Event]) -> str:
    created = by_seq.get(created_seq)
    name = created.name if isinstance(created, ev.ActivityTaskCreated) else "?"
    return f"#{created_seq} {name}"
