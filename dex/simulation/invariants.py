"""The invariants of one history, as checkers that raise :class:`InvariantViolation`.

Each checker is a pure function of a history (a list of events) and what else it names; the
simulator runs them on every history it sees written and on every history at the end. The
ledgers in :mod:`.ledgers` watch what the store hands out over time. Each checker can be fed
a doctored history, which is how the tests show that it catches what it must.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import dex
from dex.app.definitions.registry import ACTIVITY_ATTRIBUTE, WORKFLOW_ATTRIBUTE
from dex.domain import commands as cmd
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter, WorkflowDefinition
from dex.domain.replay import ContinueAsNewRequest
from dex.domain.status import RunStatus
from dex.domain.task import UpdateAnswer, replay_history, split_blocks
from dex.domain.values import FailureInfo, Payload
from dex.serialization.history import decode_history, encode_history
from dex.serialization.payloads import PayloadConverter as DefaultPayloadConverter
from dex.simulation.workload import args_key


class InvariantViolation(AssertionError):
    """An invariant broke; ``invariant`` names which one."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"[{invariant}] {detail}")
        self.invariant = invariant
        self.detail = detail


# -- one history ----------------------------------------------------------------------------------


def check_sequence_numbers(run_id: str, history: Sequence[ev.HistoryEvent], *, first: int | None = None) -> None:
    """Sequence numbers run on without a gap or a repeat, from 1 in a run's first generation
    (a generation that continues as new numbers on from its predecessor: ``first``)."""
    created = history[0].event if history else None
    if first is None:
        first = 1 if not isinstance(created, ev.RunCreated) or created.generation == 1 else history[0].sequence_number
    numbers = [item.sequence_number for item in history]
    if numbers != list(range(first, first + len(history))):
        twice = sorted(n for n, count in Counter(numbers).items() if count > 1)
        raise InvariantViolation(
            "unique-sequence-numbers",
            f"run {run_id}: sequence numbers {numbers} (from {first})"
            + (f" use {twice} twice" if twice else " have gaps"),
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


def check_cancel_stops(run_id: str, history: Sequence[ev.HistoryEvent], *, cleanup: str | None = None) -> None:
    """A task that consumes RunCancelled ends the run CANCELLED in that very task; for code that
    catches the cancel to clean up (``cleanup``: its cleanup step), the first such task either
    does or schedules that step (a later cancel, a deadline during the cleanup, changes nothing)."""
    _created, blocks = split_blocks(history)
    for block in blocks:
        if any(isinstance(event, ev.RunCancelled) for _seq, event in block.messages):
            ends = [c.event for c in block.commands if isinstance(c.event, ev.RunCompleted)]
            if ends and ends[0].status is RunStatus.CANCELLED:
                if cleanup is None:
                    continue
                return
            if cleanup is not None and not ends:
                if any(isinstance(c.event, ev.ActivityTaskCreated) and c.event.name == cleanup for c in block.commands):
                    return
            raise InvariantViolation(
                "cancel-stops-the-run",
                f"run {run_id}: the task at event {block.started.sequence_number} took the cancel "
                f"but ended {ends[0].status.value if ends else 'nothing'}"
                + (f" and scheduled no {cleanup!r}" if cleanup is not None and not ends else ""),
            )


def check_history(
    run_id: str, history: Sequence[ev.HistoryEvent], *, finished: bool = False, cleanup: str | None = None
) -> None:
    """Every single-history invariant (``cleanup``: the cleanup step of code that catches a cancel)."""
    check_sequence_numbers(run_id, history)
    check_blocks(run_id, history)
    check_single_completion(run_id, history, finished=finished)
    check_timers(run_id, history)
    check_outcomes_once(run_id, history)
    check_cancel_stops(run_id, history, cleanup=cleanup)


def check_appended(run_id: str, before: Sequence[ev.HistoryEvent], after: Sequence[ev.HistoryEvent]) -> None:
    """A history only grows: what was written at a sequence number stays written."""
    if list(after[: len(before)]) != list(before):
        first = next(
            (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), min(len(before), len(after))
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
    continued_with: tuple[Payload, ...] | None = None,
    converter: PayloadConverter | None = None,
) -> None:
    """The workflow code replays the history (exported and read back, with its own run id)
    and, replayed, reaches the outcome the history recorded: the same result or failure, or
    for a generation that continued as new, the next generation's input."""
    created = history[0].event
    assert isinstance(created, ev.RunCreated)
    exported = encode_history(run_id, created.workflow_name, history)
    activities, workflows = tuple(activities), tuple(workflows)
    converter = converter or DefaultPayloadConverter()
    try:
        dex.testing.replay(workflow_fn, exported, activities=activities, workflows=workflows, converter=converter)
    except dex.NonDeterminismError as exc:
        raise InvariantViolation("replays-deterministically", f"run {run_id}: {exc}") from None
    read_back = decode_history(exported)
    if read_back != list(history):
        raise InvariantViolation("replays-deterministically", f"run {run_id}: the exported history reads back changed")
    definition: WorkflowDefinition = getattr(workflow_fn, WORKFLOW_ATTRIBUTE)
    executor = replay_history(
        definition,
        run_id,
        read_back,
        converter,
        activities={getattr(fn, ACTIVITY_ATTRIBUTE).name: getattr(fn, ACTIVITY_ATTRIBUTE) for fn in activities}.get,
        workflows={getattr(fn, WORKFLOW_ATTRIBUTE).name: getattr(fn, WORKFLOW_ATTRIBUTE) for fn in workflows}.get,
    )
    outcome = executor.outcome
    executor.close()
    recorded = [item.event for item in history if isinstance(item.event, ev.RunCompleted)]
    if continued_with is not None:
        if not isinstance(outcome, ContinueAsNewRequest) or outcome.input != continued_with:
            raise InvariantViolation(
                "replays-deterministically",
                f"run {run_id}: generation {created.generation} continued as new with {_texts(continued_with)}, "
                f"but its code, replayed, {_describe_outcome(outcome)}",
            )
    elif recorded and recorded[0].status is not RunStatus.CANCELLED:  # a cancel ends no code path
        end = recorded[0]
        same = (
            isinstance(outcome, cmd.CompleteRun)
            and outcome.result == end.result
            and _failure_key(outcome.failure) == _failure_key(end.failure)
        )
        if not same:
            raise InvariantViolation(
                "replays-deterministically",
                f"run {run_id}: the history recorded {end.status.value} "
                f"{_texts((end.result,)) if end.result else _failure_key(end.failure)}, "
                f"but its code, replayed, {_describe_outcome(outcome)}",
            )


def _texts(payloads: tuple[Payload | None, ...]) -> str:
    return ", ".join(p.data.decode(errors="replace") if p is not None else "None" for p in payloads)


def _failure_key(failure: FailureInfo | None) -> tuple[str, str] | None:
    return None if failure is None else (failure.type, failure.message)


def _describe_outcome(outcome: object) -> str:
    if isinstance(outcome, ContinueAsNewRequest):
        return f"continues as new with {_texts(outcome.input)}"
    if isinstance(outcome, cmd.CompleteRun):
        detail = _texts((outcome.result,)) if outcome.result is not None else _failure_key(outcome.failure)
        return f"ends {outcome.status.value} {detail}"
    return "does not end"


def check_activity_results(
    run_id: str,
    history: Sequence[ev.HistoryEvent],
    executions: Mapping[tuple[str, str, str], int],
    expected: Callable[[str, list[Any]], Any],
    converter: PayloadConverter,
) -> None:
    """Every recorded activity result came from at least one real execution, and is its result.

    The one exception: a failure with ``LeaseExpiredError``, which records that the attempts
    the retry policy allows were all lost with their workers (a lost attempt counts), so the
    activity may never have run to the end."""
    created = {item.sequence_number: item.event for item in history if isinstance(item.event, ev.ActivityTaskCreated)}
    for item in history:
        if not isinstance(item.event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed)):
            continue
        step = created[item.event.created_seq]
        args = [converter.decode(p) for p in step.input]
        if isinstance(item.event, ev.ActivityTaskFailed) and item.event.failure.type == "LeaseExpiredError":
            continue
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


def check_events_received(run_id: str, history: Sequence[ev.HistoryEvent], sent: Counter[tuple[str, bytes]]) -> None:
    """A run receives only events that were sent to it, each at most as often as it was sent."""
    received = Counter(
        (item.event.event_id, item.event.payload.data)
        for item in history
        if isinstance(item.event, ev.ExternalEventReceived)
    )
    extra = received - sent
    if extra:
        raise InvariantViolation("events-delivered-once", f"run {run_id}: received {dict(extra)} never sent")


# -- conversations and endings (docs/reference/contract.md §14) ------------------------------------


def check_updates_answered(
    run_id: str,
    generations: Sequence[Sequence[ev.HistoryEvent]],
    told: Mapping[str, Sequence[UpdateAnswer]],
    *,
    ended: bool,
) -> None:
    """Every accepted update is answered exactly once (one ``UpdateCompleted`` after its
    ``UpdateAccepted``, in the same generation), and its callers were told just that; an update
    never accepted was refused, never lost. ``told``: what the callers of each update id sent to
    the run were told, in order; ``ended``: the run has ended (every request has its answer)."""
    completed: dict[str, ev.UpdateCompleted] = {}
    accepted: set[str] = set()
    for history in generations:
        open_here: set[str] = set()
        for item in history:
            event = item.event
            if isinstance(event, ev.UpdateAccepted):
                if event.update_id in accepted:
                    raise InvariantViolation(
                        "updates-answered-once", f"run {run_id}: update {event.update_id!r} accepted twice"
                    )
                accepted.add(event.update_id)
                open_here.add(event.update_id)
            elif isinstance(event, ev.UpdateCompleted):
                if event.update_id not in open_here:
                    twice = "answered twice" if event.update_id in completed else "answered, never accepted"
                    raise InvariantViolation(
                        "updates-answered-once",
                        f"run {run_id}: update {event.update_id!r} {twice} (event {item.sequence_number})",
                    )
                open_here.discard(event.update_id)
                completed[event.update_id] = event
        if open_here and (ended or history is not generations[-1]):
            raise InvariantViolation(
                "updates-answered-once",
                f"run {run_id}: accepted updates {sorted(open_here)} were never answered, though the "
                + ("run ended" if history is generations[-1] else "generation ended"),
            )
    for update_id, answers in sorted(told.items()):
        if not answers:
            if ended:
                raise InvariantViolation(
                    "updates-answered-once", f"run {run_id}: the caller of update {update_id!r} never got an answer"
                )
            continue
        answer = completed.get(update_id)
        for got in answers:
            if not got.rejected and (answer is None or (got.result, got.failure) != (answer.result, answer.failure)):
                recorded = (
                    "nothing" if answer is None else _texts((answer.result,)) + f" {_failure_key(answer.failure)}"
                )
                raise InvariantViolation(
                    "updates-answered-once",
                    f"run {run_id}: the caller of update {update_id!r} was told {_texts((got.result,))} "
                    f"{_failure_key(got.failure)}, the history answered {recorded}",
                )
        if update_id in accepted and answers[-1].rejected and ended:
            raise InvariantViolation(
                "updates-answered-once",
                f"run {run_id}: update {update_id!r} was accepted, its caller last told it was refused",
            )
        if update_id not in accepted and not answers[-1].rejected:
            raise InvariantViolation(
                "updates-answered-once", f"run {run_id}: update {update_id!r} never accepted, yet answered"
            )


def check_events_not_lost(
    run_id: str, history: Sequence[ev.HistoryEvent], event_id: str, read: Sequence[Any], unread: int, converter: Any
) -> None:
    """No event is taken by a wait that lost a ``ctx.first``: the events ``event_id`` that the
    run's code read (``read``, in order, from its result) are the first ones it received, in
    arrival order, none skipped; those it received and never read are the run's
    ``unread_events``. (A losing wait that took an event would skip one, and miscount.)"""
    received = [
        converter.decode(item.event.payload)
        for item in history
        if isinstance(item.event, ev.ExternalEventReceived) and item.event.event_id == event_id
    ]
    if list(read) != received[: len(read)]:
        raise InvariantViolation(
            "events-not-taken-by-losers",
            f"run {run_id}: its code read {list(read)!r} of the {event_id!r} events, which arrived as {received!r}",
        )
    if unread != len(received) - len(read):
        raise InvariantViolation(
            "events-not-taken-by-losers",
            f"run {run_id}: {len(received)} {event_id!r} events received, {len(read)} read, "
            f"but {unread} counted unread",
        )


def check_nothing_after_end(
    run_id: str, generations: Sequence[Sequence[ev.HistoryEvent]], streams: Mapping[str, Sequence[Payload]] | None
) -> None:
    """Nothing is recorded after a run's terminal event: only the closing WorkflowTaskCompleted
    follows RunCompleted, and the streams the store keeps for the run hold exactly the items its
    histories wrote (none written after its end, none lost). ``streams``: the store's items by
    key (None when the store no longer has the run)."""
    history = generations[-1]
    ends = [i for i, item in enumerate(history) if isinstance(item.event, ev.RunCompleted)]
    if ends and [item.kind for item in history[ends[0] + 1 :]] != ["WorkflowTaskCompleted"]:
        after = [item.kind for item in history[ends[0] + 1 :]]
        raise InvariantViolation("nothing-after-the-end", f"run {run_id}: {after} recorded after its terminal event")
    if streams is None:
        return
    written: dict[str, list[Payload]] = {}
    for generation in generations:
        for item in generation:
            if isinstance(item.event, ev.StreamItemWritten):
                written.setdefault(item.event.key, []).append(item.event.value)
    for key in sorted(set(written) | set(streams)):
        kept = list(streams.get(key, ()))
        if kept != written.get(key, []):
            raise InvariantViolation(
                "nothing-after-the-end",
                f"run {run_id}: the store keeps {len(kept)} items of stream {key!r}, "
                f"its history wrote {len(written.get(key, []))}",
            )


def check_cleanup_before_end(run_id: str, history: Sequence[ev.HistoryEvent], cleanup: str) -> None:
    """A run whose code a cancel reached (it ended CANCELLED naming the request) ran its cleanup
    step, ``cleanup``, after the cancel and recorded its outcome before the run's terminal event."""
    cancelled = next((i for i, item in enumerate(history) if isinstance(item.event, ev.RunCancelled)), None)
    end = next((i for i, item in enumerate(history) if isinstance(item.event, ev.RunCompleted)), None)
    if cancelled is None or end is None:
        return
    completion = history[end].event
    assert isinstance(completion, ev.RunCompleted)
    if completion.status is not RunStatus.CANCELLED or completion.failure is None:
        # the cancel closed code that never started, or the code ended otherwise as it came
        return
    _created, blocks = split_blocks(history)
    first = blocks[0].messages if blocks else ()
    if any(isinstance(m, ev.RunStarted) for _s, m in first) and any(isinstance(m, ev.RunCancelled) for _s, m in first):
        return  # it came with the start: the code had reached no line, no try, to clean up from
    steps = {
        item.sequence_number
        for item in history[cancelled:end]
        if isinstance(item.event, ev.ActivityTaskCreated) and item.event.name == cleanup
    }
    outcomes = [
        item
        for item in history[cancelled:end]
        if isinstance(item.event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed)) and item.event.created_seq in steps
    ]
    if not outcomes:
        raise InvariantViolation(
            "cleanup-before-the-end",
            f"run {run_id}: cancelled at event {history[cancelled].sequence_number}, ended "
            f"{completion.status.value} at event {history[end].sequence_number} "
            + ("without its cleanup step " if not steps else "before its cleanup step's outcome ")
            + repr(cleanup),
        )
