"""One workflow task, decided purely: history + inbox + time in, new events and effects out.

:func:`decide` is everything a worker does between loading a run and writing the result. The
result says which history events to append (after ``expected_last_seq``, so that a racing
duplicate task loses on the unique (run, sequence) key), which inbox messages were consumed,
and what the new events cause elsewhere: activity tasks, timers, child runs, messages to the
parent and children. Adapters carry out a result; they do not interpret workflow semantics."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

import attrs

from dex.domain import commands as cmd
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter, WorkflowDefinition
from dex.domain.errors import NonDeterminismError
from dex.domain.replay import ContinueAsNewRequest, WorkflowExecutor
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.steps import ActivityLookup, WorkflowLookup
from dex.domain.values import FailureInfo, Payload


@attrs.frozen(kw_only=True)
class InboxMessage:
    """A message waiting for a run's next workflow task."""

    message_id: int
    event: ev.Message


@attrs.frozen(kw_only=True)
class NewActivityTask:
    run_id: str
    created_seq: int
    name: str
    input: tuple[Payload, ...]
    queue: str
    priority: int
    retry_policy: RetryPolicy
    lock_timeout: timedelta
    visible_from: datetime
    trace_context: ev.Labels = ()
    attempt: int = 1  # above 1 for a retry of a first attempt that ran inside the workflow task


@attrs.frozen(kw_only=True)
class OutgoingMessage:
    """A message for some run's inbox, visible from ``visible_from`` (timers wait there)."""

    run_id: str
    event: ev.Message
    visible_from: datetime


@attrs.frozen(kw_only=True)
class NewRun:
    """A run to create (a child): its first history event; its inbox gets RunStarted."""

    run_id: str
    created: ev.RunCreated


@attrs.frozen(kw_only=True)
class WorkflowTaskResult:
    run_id: str
    expected_last_seq: int
    new_events: tuple[ev.HistoryEvent, ...] = ()
    consumed: tuple[int, ...] = ()
    started: bool = False
    completion: ev.RunCompleted | None = None
    custom_status: str | None = None
    activity_tasks: tuple[NewActivityTask, ...] = ()
    messages: tuple[OutgoingMessage, ...] = ()
    child_runs: tuple[NewRun, ...] = ()
    # continue-as-new: the history is replaced by this one and the inbox gets `messages`
    new_history: tuple[ev.HistoryEvent, ...] | None = None


@attrs.frozen(kw_only=True)
class Block:
    """One recorded workflow task: when it ran, what it consumed, what it issued."""

    started: ev.HistoryEvent
    messages: tuple[tuple[int, ev.Event], ...]
    commands: tuple[ev.HistoryEvent, ...]
    completed: bool


def split_blocks(history: Sequence[ev.HistoryEvent]) -> tuple[ev.RunCreated, list[Block]]:
    """The run's creation event and its workflow-task blocks, in order."""
    if not history or not isinstance(history[0].event, ev.RunCreated):
        raise ValueError("a history starts with RunCreated")
    blocks: list[Block] = []
    current: ev.HistoryEvent | None = None
    messages: list[tuple[int, ev.Event]] = []
    commands: list[ev.HistoryEvent] = []
    for item in history[1:]:
        event = item.event
        if isinstance(event, ev.WorkflowTaskStarted):
            if current is not None:
                raise ValueError(f"event {item.sequence_number}: a workflow task started inside another")
            current, messages, commands = item, [], []
        elif current is None:
            raise ValueError(f"event {item.sequence_number}: {item.kind} outside a workflow task")
        elif isinstance(event, ev.WorkflowTaskCompleted):
            blocks.append(Block(started=current, messages=tuple(messages), commands=tuple(commands), completed=True))
            current = None
        elif isinstance(event, ev.COMMAND_EVENT_TYPES):
            commands.append(item)
        elif isinstance(event, ev.RECORDED_MESSAGE_TYPES):
            if commands:
                raise ValueError(f"event {item.sequence_number}: message {item.kind} after a command")
            messages.append((item.sequence_number, event))
        else:
            raise ValueError(f"event {item.sequence_number}: unexpected {item.kind}")
    if current is not None:
        blocks.append(Block(started=current, messages=tuple(messages), commands=tuple(commands), completed=False))
    return history[0].event, blocks


def replay_history(
    definition: WorkflowDefinition,
    run_id: str,
    history: Sequence[ev.HistoryEvent],
    converter: PayloadConverter,
    *,
    activities: ActivityLookup = lambda _n: None,
    workflows: WorkflowLookup = lambda _n: None,
) -> WorkflowExecutor:
    """An executor that has replayed every recorded block of ``history``."""
    created, blocks = split_blocks(history)
    executor = WorkflowExecutor(
        run_id=run_id,
        definition=definition,
        created=created,
        converter=converter,
        activities=activities,
        workflows=workflows,
    )
    executor.replay((block.started.timestamp, block.messages, block.commands) for block in blocks)
    return executor


def check_replay(
    definition: WorkflowDefinition,
    run_id: str,
    history: Sequence[ev.HistoryEvent],
    converter: PayloadConverter,
    **lookups: ActivityLookup | WorkflowLookup,
) -> None:
    """Raise NonDeterminismError when the code no longer produces ``history``."""
    executor = replay_history(definition, run_id, history, converter, **lookups)  # type: ignore[arg-type]
    nondeterminism = executor.nondeterminism
    executor.close()  # its code, where the history leaves it, runs no further
    if nondeterminism is not None:
        raise NonDeterminismError(nondeterminism)


def select_messages(suspended: bool, inbox: Sequence[InboxMessage]) -> list[InboxMessage]:
    """The inbox messages a task consumes now, in the order it applies them.

    While the run is suspended (``suspended`` says whether its history ends so), only control
    messages (resume, cancel) are taken; the others stay in the inbox and follow a resume in
    their original order."""
    taken: list[InboxMessage] = []
    held: list[InboxMessage] = []
    # a generation's start precedes everything else: a request that arrived while the run was
    # continuing as new (a suspend, a cancel) applies to the generation that has started
    starts_first = sorted(inbox, key=lambda m: not isinstance(m.event, ev.RunStarted))
    for message in starts_first:
        match message.event:
            case ev.RunSuspended():
                taken.append(message)
                suspended = True
            case ev.RunResumed():
                taken.append(message)
                suspended = False
                taken.extend(held)
                held.clear()
            case ev.RunCancelled():
                taken.append(message)
            case _:
                (held if suspended else taken).append(message)
    return taken


def decide(
    definition: WorkflowDefinition,
    run_id: str,
    history: Sequence[ev.HistoryEvent],
    inbox: Sequence[InboxMessage],
    now: datetime,
    converter: PayloadConverter,
    *,
    activities: ActivityLookup = lambda _n: None,
    workflows: WorkflowLookup = lambda _n: None,
) -> WorkflowTaskResult:
    """Decide one workflow task of run ``run_id`` from its whole history."""
    executor = replay_history(definition, run_id, history, converter, activities=activities, workflows=workflows)
    try:
        return advance(executor, history[-1].sequence_number, inbox, now)
    finally:
        executor.close()


def advance(
    executor: WorkflowExecutor, last_seq: int, inbox: Sequence[InboxMessage], now: datetime
) -> WorkflowTaskResult:
    """Decide the next workflow task with an executor that has replayed the history up to
    ``last_seq`` (freshly, or kept from the run's previous task); the executor moves on with it."""
    run_id = executor.run_id
    if executor.completed_in_history:
        # a finished run: whatever still arrives is dropped
        return WorkflowTaskResult(
            run_id=run_id, expected_last_seq=last_seq, consumed=tuple(m.message_id for m in inbox)
        )
    taken = select_messages(executor.suspended, inbox)
    if not taken:
        return WorkflowTaskResult(run_id=run_id, expected_last_seq=last_seq)
    created = executor.created

    seq = last_seq + 1
    new_events = [ev.HistoryEvent(sequence_number=seq, timestamp=now, event=ev.WorkflowTaskStarted())]
    numbered: list[tuple[int, ev.Event]] = []
    for message in taken:
        seq += 1
        numbered.append((seq, message.event))
        new_events.append(ev.HistoryEvent(sequence_number=seq, timestamp=now, event=message.event))
    issued = executor.apply_block(now, numbered, None, next_seq=seq + 1)

    activity_tasks: list[NewActivityTask] = []
    messages: list[OutgoingMessage] = []
    child_runs: list[NewRun] = []
    completion: ev.RunCompleted | None = None
    for command_seq, command in issued:
        event = cmd.to_event(command)
        new_events.append(ev.HistoryEvent(sequence_number=command_seq, timestamp=now, event=event))
        match event:
            case ev.ActivityTaskCreated():
                activity_tasks.append(activity_task(run_id, command_seq, event, created, now))
            case ev.TimerCreated():
                messages.append(
                    OutgoingMessage(
                        run_id=run_id, event=ev.TimerElapsed(created_seq=command_seq), visible_from=event.fire_at
                    )
                )
            case ev.ChildRunCreated():
                child_runs.append(NewRun(run_id=event.child_run_id, created=child_created(run_id, event, created)))
            case ev.RunCompleted():
                completion = event
    next_seq = new_events[-1].sequence_number + 1
    new_events.append(ev.HistoryEvent(sequence_number=next_seq, timestamp=now, event=ev.WorkflowTaskCompleted()))

    new_history: tuple[ev.HistoryEvent, ...] | None = None
    if isinstance(executor.outcome, ContinueAsNewRequest):
        new_history, messages, activity_tasks, child_runs = _continue_as_new(
            executor, executor.outcome, now, first_seq=next_seq + 1
        )
    elif completion is not None:
        messages.extend(_completion_messages(run_id, created, completion, executor.pending_children(), now))
    return WorkflowTaskResult(
        run_id=run_id,
        expected_last_seq=last_seq,
        new_events=tuple(new_events),
        consumed=tuple(m.message_id for m in taken),
        started=any(isinstance(m.event, ev.RunStarted) for m in taken),
        completion=completion,
        custom_status=executor.custom_status,
        activity_tasks=tuple(activity_tasks),
        messages=tuple(messages),
        child_runs=tuple(child_runs),
        new_history=new_history,
    )


def activity_task(
    run_id: str, seq: int, event: ev.ActivityTaskCreated, created: ev.RunCreated, now: datetime
) -> NewActivityTask:
    """The task a run's ``ActivityTaskCreated`` (at ``seq``) makes, due ``now``."""
    return NewActivityTask(
        run_id=run_id,
        created_seq=seq,
        name=event.name,
        input=event.input,
        queue=event.queue,
        priority=event.priority,
        retry_policy=event.retry_policy,
        lock_timeout=event.lock_timeout,
        visible_from=now,
        trace_context=created.trace_context,
    )


def child_created(parent: str, event: ev.ChildRunCreated, created: ev.RunCreated) -> ev.RunCreated:
    """The creation event of the child ``event`` starts (its seed comes from its id)."""
    return ev.RunCreated(
        workflow_name=event.workflow_name,
        input=event.input,
        queue=event.queue,
        instance_id=event.instance_id,
        priority=event.priority,
        concurrency_key=event.concurrency_key,
        labels=event.labels,
        parent_run_id=parent,
        random_seed=uuid.UUID(event.child_run_id).int >> 64,
        trace_context=created.trace_context,
        code_version=created.code_version,
    )


def can_continue(executor: WorkflowExecutor, result: WorkflowTaskResult) -> bool:
    """Whether ``result``'s task may go on with outcomes of its own activities (see
    :func:`continue_task`): the run is live, not suspended, and scheduled activities."""
    return (
        bool(result.activity_tasks)
        and result.completion is None
        and result.new_history is None
        and not executor.finished
        and not executor.suspended
    )


def continue_task(
    executor: WorkflowExecutor,
    result: WorkflowTaskResult,
    outcomes: Sequence[ev.ActivityTaskCompleted | ev.ActivityTaskFailed],
    retries: Sequence[NewActivityTask],
    now: datetime,
) -> WorkflowTaskResult:
    """``result`` extended within the same workflow task by the first attempts of its activities
    that ran at once ("inline"): ``outcomes`` are the messages those attempts produced (applied
    as the next block, exactly as if they had come through the inbox), ``retries`` replace the
    tasks whose inline attempt failed and will be retried later as ordinary tasks.

    The history written is the one the ordinary path writes (one block per step), only in one
    write: replay cannot tell the two apart. Requires :func:`can_continue`.
    """
    answered = {m.created_seq for m in outcomes} | {r.created_seq for r in retries}
    kept = tuple(t for t in result.activity_tasks if t.created_seq not in answered) + tuple(retries)
    if not outcomes:
        return attrs.evolve(result, activity_tasks=kept)
    # inline messages never were in the inbox: negative ids, left out of what the task consumed
    inbox = [InboxMessage(message_id=-(i + 1), event=message) for i, message in enumerate(outcomes)]
    step = advance(executor, result.new_events[-1].sequence_number, inbox, now)
    if len(step.consumed) != len(inbox):
        raise AssertionError(f"run {result.run_id}: an inline activity outcome was not applied")
    return WorkflowTaskResult(
        run_id=result.run_id,
        expected_last_seq=result.expected_last_seq,
        new_events=result.new_events + step.new_events,
        consumed=result.consumed,
        started=result.started or step.started,
        completion=step.completion,
        custom_status=step.custom_status,
        activity_tasks=kept + step.activity_tasks,
        messages=result.messages + step.messages,
        child_runs=result.child_runs + step.child_runs,
        new_history=step.new_history,
    )


def _completion_messages(
    run_id: str,
    created: ev.RunCreated,
    completion: ev.RunCompleted,
    pending_children: Sequence[str],
    now: datetime,
) -> list[OutgoingMessage]:
    messages = [
        OutgoingMessage(run_id=child, event=ev.RunCancelled(reason=f"parent run {run_id} ended"), visible_from=now)
        for child in pending_children
    ]
    if created.parent_run_id is not None:
        outcome: ev.Message
        if completion.status is RunStatus.COMPLETED and completion.result is not None:
            outcome = ev.ChildRunCompleted(child_run_id=run_id, result=completion.result)
        else:
            failure = completion.failure or FailureInfo(
                type="WorkflowCancelledError", message=f"child run {run_id} was cancelled", terminal=True
            )
            outcome = ev.ChildRunFailed(child_run_id=run_id, failure=failure)
        messages.append(OutgoingMessage(run_id=created.parent_run_id, event=outcome, visible_from=now))
    return messages


def _continue_as_new(
    executor: WorkflowExecutor, request: ContinueAsNewRequest, now: datetime, first_seq: int
) -> tuple[tuple[ev.HistoryEvent, ...], list[OutgoingMessage], list[NewActivityTask], list[NewRun]]:
    # the new generation numbers on from the old one: a run's sequence numbers never repeat,
    # so (run, sequence) names one event for the run's whole life
    created = attrs.evolve(executor.created, input=request.input, generation=executor.created.generation + 1)
    carried: list[ev.Message] = [ev.RunStarted(), *executor.unconsumed_events()]
    messages = [OutgoingMessage(run_id=executor.run_id, event=event, visible_from=now) for event in carried]
    history = (ev.HistoryEvent(sequence_number=first_seq, timestamp=now, event=created),)
    return history, messages, [], []
