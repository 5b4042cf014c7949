"""The dashboard's two drawings, computed here as plain geometry and drawn as SVG by the
templates (so every text in them is escaped like the rest of the page, and nothing is loaded
from elsewhere): runs started and ended per minute over the last hour, and a run's timeline
of steps as bars.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import attrs

from dex.domain import events as ev
from dex.views.render import show_duration, show_time
from dex.web.insights import Minute, PendingActivity

CHART_WIDTH, CHART_HEIGHT, CHART_LEFT, CHART_BOTTOM = 720, 160, 36, 20
TIMELINE_WIDTH, TIMELINE_LABEL, ROW = 900, 260, 22


@attrs.frozen(kw_only=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    title: str
    css: str


@attrs.frozen(kw_only=True)
class Chart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    peak: int
    ticks: tuple[tuple[float, str], ...]  # x and the label (minutes ago)
    started: int
    ended: int


def minute_chart(minutes: Sequence[Minute]) -> Chart:
    """Two bars per minute (started, ended), scaled to the busiest minute."""
    peak = max((max(m.started, m.ended) for m in minutes), default=0)
    plot_width = CHART_WIDTH - CHART_LEFT
    plot_height = CHART_HEIGHT - CHART_BOTTOM - 6
    slot = plot_width / max(len(minutes), 1)
    bars = []
    for i, minute in enumerate(minutes):
        for j, (count, css, what) in enumerate(
            ((minute.started, "started", "started"), (minute.ended, "ended", "ended"))
        ):
            height = plot_height * count / peak if peak else 0
            bars.append(
                Bar(
                    x=CHART_LEFT + i * slot + j * slot / 2,
                    y=CHART_HEIGHT - CHART_BOTTOM - height,
                    width=max(slot / 2 - 1, 1),
                    height=height,
                    title=f"{minute.start.strftime('%H:%M')} UTC: {count} {what}",
                    css=css,
                )
            )
    ticks = (
        *((CHART_LEFT + i * slot, f"-{len(minutes) - i}m") for i in range(0, len(minutes), 10)),
        (CHART_LEFT + plot_width, "now"),
    )
    return Chart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        bars=tuple(bars),
        peak=peak,
        ticks=ticks,
        started=sum(m.started for m in minutes),
        ended=sum(m.ended for m in minutes),
    )


@attrs.frozen(kw_only=True)
class Step:
    seq: int
    kind: str  # activity, timer, child, side effect, update, suspension, or a mark: event, cancel, ...
    name: str
    attempt: int | None
    start: datetime
    end: datetime | None
    outcome: str  # completed, failed, pending, fired, cancelled, resumed; a mark's: received, requested, ...

    @property
    def duration(self) -> str:
        return show_duration(self.end - self.start) if self.end is not None else "-"


def steps_of(
    history: Sequence[ev.HistoryEvent],
    pending: Sequence[PendingActivity],
    attempts_made: Mapping[int, int] | None = None,
) -> list[Step]:
    """The run's steps (activities, timers, children, updates), each from the event that
    scheduled it to the one that answered it, a suspension from its start to the resume, and
    what happened to the run at one moment (an event received, a cancel asked for, a value
    published, a stream item, labels changed, a patch, a run started apart) as a mark of no
    length: every event a reader of the history looks for, but the workflow-task bookkeeping.
    An activity's attempt is the pending task's, else how many ``attempts_made`` says it took
    (a step retried looks like one bar: its label says so)."""
    attempts = {**(attempts_made or {}), **{p.seq: p.attempt for p in pending if p.attempt is not None}}
    opened: dict[int, tuple[str, str, datetime]] = {}
    closed: dict[int, tuple[datetime, str]] = {}
    children: dict[str, int] = {}
    updates: dict[str, int] = {}
    suspended: int | None = None

    def mark(seq: int, kind: str, name: str, at: datetime, outcome: str) -> None:
        opened[seq] = (kind, name, at)
        closed[seq] = (at, outcome)

    for item in history:
        event, seq, at = item.event, item.sequence_number, item.timestamp
        match event:
            case ev.ActivityTaskCreated():
                opened[seq] = ("activity", event.name, at)
            case ev.TimerCreated():
                opened[seq] = ("timer", f"timer until {show_time(event.fire_at)}", at)
            case ev.ChildRunCreated():
                opened[seq] = ("child", f"{event.workflow_name} ({event.child_run_id[:8]}…)", at)
                children[event.child_run_id] = seq
            case ev.SideEffectExecuted():
                opened[seq] = ("side effect", event.name, at)
                closed[seq] = (at, "completed")
            case ev.ActivityTaskCompleted() | ev.TimerElapsed():
                closed[event.created_seq] = (
                    at,
                    "completed" if isinstance(event, ev.ActivityTaskCompleted) else "fired",
                )
            case ev.ActivityTaskFailed():
                closed[event.created_seq] = (at, "failed")
            case ev.ChildRunCompleted() | ev.ChildRunFailed():
                created = children.get(event.child_run_id)
                if created is not None:
                    closed[created] = (at, "completed" if isinstance(event, ev.ChildRunCompleted) else "failed")
            case ev.UpdateAccepted():
                opened[seq] = ("update", f"update {event.name}", at)
                updates[event.update_id] = seq
            case ev.UpdateCompleted():
                accepted = updates.get(event.update_id)
                if accepted is not None:
                    closed[accepted] = (at, "failed" if event.failure is not None else "completed")
            case ev.CancelRequested():  # one step cancelled by the code
                if event.created_seq in opened and event.created_seq not in closed:
                    closed[event.created_seq] = (at, "cancelled")
            case ev.RunSuspended():
                opened[seq] = ("suspension", "suspended", at)
                suspended = seq
            case ev.RunResumed():
                if suspended is not None:
                    closed[suspended] = (at, "resumed")
                    suspended = None
            case ev.ExternalEventReceived():
                mark(seq, "event", f"event {event.event_id}", at, "received")
            case ev.RunCancelled():
                mark(seq, "cancel", "cancel requested" + (f": {event.reason}" if event.reason else ""), at, "requested")
            case ev.RunTerminated():
                mark(seq, "terminate", "terminated" + (f": {event.reason}" if event.reason else ""), at, "terminated")
            case ev.ValuePublished():
                mark(seq, "published", f"published {event.key}", at, "published")
            case ev.StreamItemWritten():
                mark(seq, "stream", f"stream {event.key}", at, "written")
            case ev.StreamClosed():
                mark(seq, "stream", f"stream {event.key} closed", at, "closed")
            case ev.LabelsChanged():
                mark(seq, "labels", "labels changed", at, "changed")
            case ev.PatchApplied():
                mark(seq, "patch", f"patch {event.patch_id}", at, "applied")
            case ev.DetachedRunCreated():
                mark(seq, "run", f"{event.workflow_name} ({event.run_id[:8]}…)", at, "started")
            case _:
                pass
    return [
        Step(
            seq=seq,
            kind=kind,
            name=name,
            attempt=attempts.get(seq),
            start=start,
            end=closed[seq][0] if seq in closed else None,
            outcome=closed[seq][1] if seq in closed else "pending",
        )
        for seq, (kind, name, start) in sorted(opened.items())
    ]


@attrs.frozen(kw_only=True)
class Timeline:
    width: int
    height: int
    label_width: int
    rows: tuple[tuple[Step, Bar], ...]


def timeline(steps: Sequence[Step], origin: datetime, now: datetime) -> Timeline:
    """Each step a bar from its start to its end (to ``now`` while pending), on one time axis
    from ``origin`` (the run's creation)."""
    end = max([now if s.end is None else s.end for s in steps] + [origin])
    span = max((end - origin).total_seconds(), 1e-3)
    plot = TIMELINE_WIDTH - TIMELINE_LABEL - 10
    rows = []
    for i, step in enumerate(steps):
        stop = step.end or now
        x = TIMELINE_LABEL + plot * (step.start - origin).total_seconds() / span
        width = max(plot * (stop - step.start).total_seconds() / span, 2)
        attempt = f", attempt {step.attempt}" if step.attempt is not None else ""
        title = f"#{step.seq} {step.name}{attempt}: started {show_time(step.start, millis=True)}, took {step.duration}, {step.outcome}"
        rows.append((step, Bar(x=x, y=i * ROW + 4, width=width, height=ROW - 8, title=title, css=step.outcome)))
    return Timeline(
        width=TIMELINE_WIDTH, height=max(len(steps), 1) * ROW + 8, label_width=TIMELINE_LABEL, rows=tuple(rows)
    )
