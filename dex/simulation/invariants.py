"""The invariants a simulation must keep, as checkers that raise :class:`InvariantViolation`.

Two kinds. Checkers over one history (a list of events) are pure functions; the simulator
runs them on every history it sees written and on every history at the end. Ledgers keep
what the store handed out (task leases, the leadership lease, run statuses) and object the
moment a new grant contradicts an earlier one. Each can be fed a doctored history or call
sequence, which is how the tests show that it catches what it must.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

import dex
from dex.app.ports import Lease, RunRecord
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter
from dex.domain.status import ALLOWED_TRANSITIONS, RunStatus
from dex.domain.task import split_blocks
from dex.serialization.history import encode_history
from dex.simulation.workload import args_key


class InvariantViolation(AssertionError):
    """An invariant broke; ``invariant`` names which one."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"[{invariant}] {detail}")
        self.invariant = invariant
        self.detail = detail


# -- one history ----------------------------------------------------------------------------------


def check_sequence_numbers(run_id: str, history: Sequence[ev.HistoryEvent]) -> None:
    """Sequence numbers run 1, 2, 3, ... : none used twice, none skipped."""
    numbers = [item.sequence_number for item in history]
    if numbers != list(range(1, len(history) + 1)):
        twice = sorted(n for n, count in Counter(numbers).items() if count > 1)
        raise InvariantViolation(
            "unique-sequence-numbers",
            f"run {run_id}: sequence numbers {numbers}" + (f" use {twice} twice" if twice else " have gaps"),
        )


def check_blocks(run_id: str, history: Sequence[ev.HistoryEvent]) -> None:
    """The history is RunCreated then whole workflow-task blocks, RunStarted first."""
    try:
        _created, blocks = split_blocks(history)
    except ValueError as exc:
        raise InvariantViolation("history-shape", f"run {run_id}: {exc}") from None
    if blocks and not all(block.completed for block in blocks):
        raise InvariantViolation("history-shape", f"run {run_id}: a workflow task block was left open")
    starts = [item for item in history if isinstance(item.event, ev.RunStarted)]
    if len(starts) > 1:
        raise InvariantViolation("history-shape", f"run {run_id}: RunStarted {len(starts)} times")


def check_single_completion(run_id: str, history: Sequence[ev.HistoryEvent], *, finished: bool) -> None:
    """At most one RunCompleted, as the last command; exactly one once the run has finished."""
    completions = [item for item in history if isinstance(item.event, ev.RunCompleted)]
    if len(completions) > 1:
        seqs = [item.sequence_number for item in completions]
        raise InvariantViolation("one-terminal-state", f"run {run_id}: RunCompleted at events {seqs}")
    if finished and not completions:
        raise InvariantViolation("one-terminal-state", f"run {run_id}: finished without a RunCompleted")
    if completions and history[-2].sequence_number != completions[0].sequence_number:
        raise InvariantViolation(
            "one-terminal-state",
            f"run {run_id}: events follow RunCompleted (event {completions[0].sequence_number})",
        )


def check_timers(run_id: str, history: Sequence[ev.HistoryEvent]) -> None:
    """A timer's TimerElapsed is consumed by a task that started at or after its fire_at."""
    fire_at = {item.sequence_number: item.event.fire_at for item in history if isinstance(item.event, ev.TimerCreated)}
    started: datetime | None = None
    for item in history:
        if isinstance(item.event, ev.WorkflowTaskStarted):
            started = item.timestamp
        elif isinstance(item.event, ev.TimerElapsed):
            due = fire_at.get(item.event.created_seq)
            if due is None:
                raise InvariantViolation(
                    "timers-not-early", f"run {run_id}: event {item.sequence_number} elapses an unknown timer"
                )
            if started is None or started < due:
                raise InvariantViolation(
                    "timers-not-early",
                    f"run {run_id}: timer {item.event.created_seq} due {due.isoformat()} fired in a task "
                    f"started {started.isoformat() if started else 'never'} (event {item.sequence_number})",
                )


def check_outcomes_once(run_id: str, history: Sequence[ev.HistoryEvent]) -> None:
    """Each activity, timer and child has at most one outcome, and it names a step that exists."""
    kinds = {item.sequence_number: type(item.event) for item in history}
    children = {item.event.child_run_id for item in history if isinstance(item.event, ev.ChildRunCreated)}
    seen: set[tuple[str, object]] = set()
    for item in history:
        event = item.event
        key: tuple[str, object]
        match event:
            case ev.ActivityTaskCompleted() | ev.ActivityTaskFailed():
                key, ok = ("activity", event.created_seq), kinds.get(event.created_seq) is ev.ActivityTaskCreated
            case ev.TimerElapsed():
                key, ok = ("timer", event.created_seq), kinds.get(event.created_seq) is ev.TimerCreated
            case ev.ChildRunCompleted() | ev.ChildRunFailed():
                key, ok = ("child", event.child_run_id), event.child_run_id in children
            case _:
                continue
        if not ok:
            raise InvariantViolation(
                "outcomes-once", f"run {run_id}: event {item.sequence_number} ({item.kind}) names no such step"
            )
        if key in seen:
            raise InvariantViolation(
                "outcomes-once", f"run {run_id}: a second outcome for {key[0]} {key[1]} at event {item.sequence_number}"
            )
        seen.add(key)


def check_cancel_stops(run_id: str, history: Sequence[ev.HistoryEvent]) -> None:
    """A task that consumes RunCancelled ends the run CANCELLED in that very task."""
    _created, blocks = split_blocks(history)
    for block in blocks:
        if any(isinstance(event, ev.RunCancelled) for _seq, event in block.messages):
            ends = [c.event for c in block.commands if isinstance(c.event, ev.RunCompleted)]
            if not ends or ends[0].status is not RunStatus.CANCELLED:
                raise InvariantViolation(
                    "cancel-stops-the-run",
                    f"run {run_id}: the task at event {block.started.sequence_number} took the cancel "
                    f"but ended {ends[0].status.value if ends else 'nothing'}",
                )


def check_history(run_id: str, history: Sequence[ev.HistoryEvent], *, finished: bool = False) -> None:
    """Every single-history invariant."""
    check_sequence_numbers(run_id, history)
    check_blocks(run_id, history)
    check_single_completion(run_id, history, finished=finished)
    check_timers(run_id, history)
    check_outcomes_once(run_id, history)
    check_cancel_stops(run_id, history)


def check_appended(run_id: str, before: Sequence[ev.HistoryEvent], after: Sequence[ev.HistoryEvent]) -> None:
    """A history only grows: what was written at a sequence number stays written."""
    if list(after[: len(before)]) != list(before):
        first = next(
            (i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after))
        )
        raise InvariantViolation(
            "unique-sequence-numbers",
            f"run {run_id}: event {first + 1} was rewritten "
            f"({before[first].kind if first < len(before) else 'nothing'} -> "
            f"{after[first].kind if first < len(after) else 'nothing'})",
        )


def check_replays(
    workflow_fn: Callable[..., Any],
    run_id: str,
    history: Sequence[ev.HistoryEvent],
    *,
    activities: Iterable[Callable[..., Any]],
    workflows: Iterable[Callable[..., Any]],
) -> None:
    """The workflow code replays the history (exported and read back, with its own run id)."""
    created = history[0].event
    assert isinstance(created, ev.RunCreated)
    try:
        dex.testing.replay(
            workflow_fn,
            encode_history(run_id, created.workflow_name, history),
            activities=activities,
            workflows=workflows,
        )
    except dex.NonDeterminismError as exc:
        raise InvariantViolation("replays-deterministically", f"run {run_id}: {exc}") from None


def check_activity_results(
    run_id: str,
    history: Sequence[ev.HistoryEvent],
    executions: Mapping[tuple[str, str, str], int],
    expected: Callable[[str, list[Any]], Any],
    converter: PayloadConverter,
) -> None:
    """Every recorded activity result came from at least one real execution, and is its result."""
    created = {item.sequence_number: item.event for item in history if isinstance(item.event, ev.ActivityTaskCreated)}
    for item in history:
        if not isinstance(item.event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed)):
            continue
        step = created[item.event.created_seq]
        args = [converter.decode(p) for p in step.input]
        if executions.get((run_id, step.name, args_key(args)), 0) < 1:
            raise InvariantViolation(
                "activities-at-least-once",
                f"run {run_id}: {item.kind} for {step.name}{tuple(args)} (event {item.sequence_number}) "
                "but the activity never executed",
            )
        if isinstance(item.event, ev.ActivityTaskCompleted):
            got = converter.decode(item.event.result)
            if got != expected(step.name, args):
                raise InvariantViolation(
                    "activities-at-least-once",
                    f"run {run_id}: {step.name}{tuple(args)} recorded {got!r}, which no execution returns",
                )


def check_events_received(
    run_id: str, history: Sequence[ev.HistoryEvent], sent: Counter[tuple[str, bytes]]
) -> None:
    """A run receives only events that were sent to it, each at most as often as it was sent."""
    received = Counter(
        (item.event.event_id, item.event.payload.data)
        for item in history
        if isinstance(item.event, ev.ExternalEventReceived)
    )
    extra = received - sent
    if extra:
        raise InvariantViolation("events-delivered-once", f"run {run_id}: received {dict(extra)} never sent")


# -- ledgers ----------------------------------------------------------------------------------------


@attrs.define
class _Claim:
    run_id: str
    owner: str
    version: int
    until: datetime
    released: bool = False

    def live(self, now: datetime) -> bool:
        return not self.released and self.until > now


class LeaseLedger:
    """Every task lease the store granted; a grant must never overlap a live one."""

    def __init__(self) -> None:
        self._claims: dict[tuple[str, int], _Claim] = {}
        self._workflow_task_of_run: dict[str, int] = {}

    def claimed(self, kind: str, task_id: int, run_id: str, lease: Lease, now: datetime) -> None:
        previous = self._claims.get((kind, task_id))
        if previous is not None and previous.live(now):
            raise InvariantViolation(
                "no-two-live-leases",
                f"{kind} task {task_id} of run {run_id} granted to {lease.owner} (v{lease.version}) while "
                f"{previous.owner}'s lease v{previous.version} holds until {previous.until.isoformat()}",
            )
        if previous is not None and lease.version <= previous.version:
            raise InvariantViolation(
                "no-two-live-leases", f"{kind} task {task_id}: lease version {lease.version} did not grow"
            )
        if kind == "workflow":
            other = self._workflow_task_of_run.get(run_id)
            if other is not None and other != task_id and not self._claims[("workflow", other)].released:
                raise InvariantViolation(
                    "no-two-live-leases", f"run {run_id} has workflow tasks {other} and {task_id} at once"
                )
            self._workflow_task_of_run[run_id] = task_id
        self._claims[(kind, task_id)] = _Claim(run_id, lease.owner, lease.version, lease.until)

    def extended(self, kind: str, task_id: int, lease: Lease, until: datetime) -> None:
        claim = self._claims.get((kind, task_id))
        if claim is None or (claim.owner, claim.version) != (lease.owner, lease.version):
            raise InvariantViolation("no-two-live-leases", f"{kind} task {task_id}: a lost lease was extended")
        claim.until = until

    def completed(self, kind: str, task_id: int, lease: Lease, applied: bool) -> None:
        """A completion came back; the store's answer must fit the latest grant."""
        claim = self._claims.get((kind, task_id))
        latest = claim is not None and (claim.owner, claim.version) == (lease.owner, lease.version)
        if applied and not latest:
            raise InvariantViolation(
                "no-two-live-leases",
                f"{kind} task {task_id}: a completion under lost lease {lease.owner} v{lease.version} was applied",
            )
        if latest and claim is not None:
            claim.released = True  # the task is done, retried or dropped: the lease ends here


class LeaderLedger:
    """Leadership leases: never two nodes whose leases overlap."""

    def __init__(self) -> None:
        self._holder: tuple[str, datetime] | None = None

    def granted(self, node_id: str, now: datetime, ttl: timedelta) -> None:
        if self._holder is not None and self._holder[0] != node_id and self._holder[1] > now:
            raise InvariantViolation(
                "one-leader",
                f"{node_id} took the leadership at {now.isoformat()} while {self._holder[0]} "
                f"holds it until {self._holder[1].isoformat()}",
            )
        self._holder = (node_id, now + ttl)

    def released(self, node_id: str) -> None:
        if self._holder is not None and self._holder[0] == node_id:
            self._holder = None


def _reachable(start: RunStatus) -> set[RunStatus]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in ALLOWED_TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


REACHABLE = {status: _reachable(status) for status in RunStatus}


class StatusWatch:
    """Run statuses as seen between steps: legal moves only, none out of a terminal status,
    one live run per instance id and one started run per concurrency key, and deletions by
    retention only."""

    def __init__(self, retention: timedelta) -> None:
        self.retention = retention
        self.last: dict[str, RunRecord] = {}
        self.deleted: set[str] = set()

    def observe(self, records: Mapping[str, RunRecord | None], now: datetime) -> None:
        holders: dict[str, str] = {}
        instances: dict[str, str] = {}
        for run_id, record in records.items():
            before = self.last.get(run_id)
            if record is None:
                self._vanished(run_id, before, now)
                continue
            if run_id in self.deleted:
                raise InvariantViolation("terminal-is-final", f"run {run_id} came back after it was deleted")
            if before is not None and record.status not in REACHABLE[before.status]:
                raise InvariantViolation(
                    "terminal-is-final", f"run {run_id} went from {before.status.value} to {record.status.value}"
                )
            if before is not None and before.status.is_terminal and record != before:
                raise InvariantViolation("terminal-is-final", f"run {run_id} changed after it ended: {record}")
            if record.status.is_terminal and record.completed_at is None:
                raise InvariantViolation("terminal-is-final", f"run {run_id} ended without completed_at")
            self.last[run_id] = record
            if record.status in (RunStatus.RUNNING, RunStatus.SUSPENDED) and record.concurrency_key is not None:
                other = holders.setdefault(record.concurrency_key, run_id)
                if other != run_id:
                    raise InvariantViolation(
                        "concurrency-key", f"runs {other} and {run_id} both run under key {record.concurrency_key!r}"
                    )
            if not record.status.is_terminal and record.instance_id is not None:
                other = instances.setdefault(record.instance_id, run_id)
                if other != run_id:
                    raise InvariantViolation(
                        "instance-id", f"runs {other} and {run_id} both live with instance id {record.instance_id!r}"
                    )

    def _vanished(self, run_id: str, before: RunRecord | None, now: datetime) -> None:
        if run_id in self.deleted:
            return
        if before is None or not before.status.is_terminal or before.completed_at is None:
            raise InvariantViolation("retention", f"run {run_id} vanished while {before.status.value if before else '?'}")
        if before.completed_at >= now - self.retention:
            raise InvariantViolation(
                "retention", f"run {run_id} deleted at {now.isoformat()}, only {now - before.completed_at} after it ended"
            )
        self.deleted.add(run_id)
