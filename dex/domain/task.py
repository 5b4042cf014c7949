"""One workflow task, decided purely: history + inbox + time in, new events and effects out.

:func:`decide` is everything a worker does between loading a run and writing the result. The
result says which history events to append (after ``expected_last_seq``, so that a racing
duplicate task loses on the unique (run, sequence) key), which inbox messages were consumed,
and what the new events cause elsewhere: activity tasks, timers, child runs, messages to the
parent and children. Adapters carry out a result; they do not interpret workflow semantics."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

import attrs

from dex.domain import commands as cmd
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter, WorkflowDefinition
from dex.domain.errors import (
    InvalidStateError,
    NonDeterminismError,
    QueryError,
    UpdateFailedError,
    UpdateRejectedError,
)
from dex.domain.instance_keys import PLAIN, StartRule
from dex.domain.replay import (
    TERMINATED_UPDATE,
    ContinueAsNewRequest,
    UpdateVerdict,
    WorkflowExecutor,
    terminated_parent,
)
from dex.domain.retry import RetryPolicy
from dex.domain.state import fold
from dex.domain.status import RunStatus
from dex.domain.steps import ActivityLookup, WorkflowLookup
from dex.domain.values import FailureInfo, Payload, describe_failure


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
    # that attempt's failure, which the store keeps as the step's first failed attempt (a
    # retried attempt is not history: docs/reference/contract.md §8)
    failure: FailureInfo | None = None


@attrs.frozen(kw_only=True)
class OutgoingMessage:
    """A message for some run's inbox, visible from ``visible_from`` (timers wait there)."""

    run_id: str
    event: ev.Message
    visible_from: datetime


@attrs.frozen(kw_only=True)
class NewRun:
    """A run to create (a child): its first history event; its inbox gets RunStarted. ``rule``
    is what its instance id's earlier runs mean (``id_reuse``, docs/reference/contract.md §15): the
    plain rule, or one the store decides by with :func:`dex.domain.instance_keys.decide`."""

    run_id: str
    created: ev.RunCreated
    rule: StartRule = PLAIN


@attrs.frozen(kw_only=True)
class UpdateAnswer:
    """What the caller of ``engine.update`` gets: the handler's result or failure, or (``rejected``)
    the refusal of a request that left no trace in the history."""

    update_id: str
    result: Payload | None = None
    failure: FailureInfo | None = None
    rejected: bool = False


def update_result(answer: UpdateAnswer) -> Payload | None:
    """What ``engine.update`` returns for ``answer`` (the handler's encoded result), or raises:
    InvalidStateError for a run that had ended, UpdateRejectedError for a refusal,
    UpdateFailedError (``.failure``) for a handler that raised."""
    failure = answer.failure
    if failure is None:
        return answer.result
    text = f"update {answer.update_id!r}: {describe_failure(failure)}"
    if answer.rejected and failure.type == InvalidStateError.__name__:
        raise InvalidStateError(text)
    if answer.rejected:
        raise UpdateRejectedError(f"{text} (rejected: nothing was recorded)", failure)
    raise UpdateFailedError(text, failure)


@attrs.frozen(kw_only=True)
class StreamItem:
    """An item for the stream ``key`` of a run; ``seq`` (its history event) orders the run's items."""

    key: str
    seq: int
    value: Payload


@attrs.frozen(kw_only=True)
class RunEffects:
    """What a workflow task asks of the store beyond its history, activity tasks, messages and
    children (docs/reference/contract.md §14, docs/decisions/conversations.md). Most tasks ask
    none of it: their result carries None, so the common path builds and merges nothing."""

    update_answers: tuple[UpdateAnswer, ...] = ()
    published: tuple[tuple[str, Payload], ...] = ()
    """Values published, in order (the store keeps the latest per key)."""
    stream_items: tuple[StreamItem, ...] = ()
    streams_closed: tuple[str, ...] = ()
    labels: ev.Labels | None = None
    """The run's whole label set after the task, when it changed."""
    cancelled_activities: tuple[int, ...] = ()
    """Activity tasks (by created seq) to drop if queued, or to tell at their heartbeat if running."""
    cancelled_timers: tuple[int, ...] = ()
    detached_runs: tuple[NewRun, ...] = ()
    """Independent runs to create (no parent); one whose instance id is held is not created."""
    unread_events: int = 0
    """Events the run received and never read, when it ends."""
    resumed: bool = False
    """A cancel request resumed the suspended run, to run its cleanup (its status is RUNNING)."""

    def then(self, later: RunEffects) -> RunEffects:
        """These effects followed by ``later``'s, as one task's."""
        return RunEffects(
            update_answers=self.update_answers + later.update_answers,
            published=self.published + later.published,
            stream_items=self.stream_items + later.stream_items,
            streams_closed=self.streams_closed + later.streams_closed,
            labels=later.labels if later.labels is not None else self.labels,
            cancelled_activities=self.cancelled_activities + later.cancelled_activities,
            cancelled_timers=self.cancelled_timers + later.cancelled_timers,
            detached_runs=self.detached_runs + later.detached_runs,
            unread_events=later.unread_events or self.unread_events,  # only the block that ends the run counts them
            resumed=self.resumed or later.resumed,
        )


NO_EFFECTS = RunEffects()


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
    effects: RunEffects | None = None

    def replaced(
        self, *, new_events: tuple[ev.HistoryEvent, ...] | None = None, consumed: tuple[int, ...] | None = None
    ) -> WorkflowTaskResult:
        """This result with its events or its consumed messages replaced: ``attrs.evolve``
        without its walk over the fields' definitions (a worker does this once or twice per task)."""
        return WorkflowTaskResult(
            run_id=self.run_id,
            expected_last_seq=self.expected_last_seq,
            new_events=self.new_events if new_events is None else new_events,
            consumed=self.consumed if consumed is None else consumed,
            started=self.started,
            completion=self.completion,
            custom_status=self.custom_status,
            activity_tasks=self.activity_tasks,
            messages=self.messages,
            child_runs=self.child_runs,
            new_history=self.new_history,
            effects=self.effects,
        )

    """What the task asks beyond the above (§14); None for none (read it through the properties)."""

    # -- the effects, each read as if it were a field of its own (its default when there are none) --
    @property
    def update_answers(self) -> tuple[UpdateAnswer, ...]:
        return (self.effects or NO_EFFECTS).update_answers

    @property
    def published(self) -> tuple[tuple[str, Payload], ...]:
        return (self.effects or NO_EFFECTS).published

    @property
    def stream_items(self) -> tuple[StreamItem, ...]:
        return (self.effects or NO_EFFECTS).stream_items

    @property
    def streams_closed(self) -> tuple[str, ...]:
        return (self.effects or NO_EFFECTS).streams_closed

    @property
    def labels(self) -> ev.Labels | None:
        return (self.effects or NO_EFFECTS).labels

    @property
    def cancelled_activities(self) -> tuple[int, ...]:
        return (self.effects or NO_EFFECTS).cancelled_activities

    @property
    def cancelled_timers(self) -> tuple[int, ...]:
        return (self.effects or NO_EFFECTS).cancelled_timers

    @property
    def detached_runs(self) -> tuple[NewRun, ...]:
        return (self.effects or NO_EFFECTS).detached_runs

    @property
    def unread_events(self) -> int:
        return (self.effects or NO_EFFECTS).unread_events

    @property
    def resumed(self) -> bool:
        return (self.effects or NO_EFFECTS).resumed


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
            case ev.RunCancelled() | ev.RunTerminated():
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
    terminating = next((m.event for m in inbox if isinstance(m.event, ev.RunTerminated)), None)
    if terminating is not None:
        return terminate(run_id, history, inbox, terminating.reason, now)
    executor = replay_history(definition, run_id, history, converter, activities=activities, workflows=workflows)
    try:
        return advance(executor, history[-1].sequence_number, inbox, now)
    finally:
        executor.close()


def advance(
    executor: WorkflowExecutor, last_seq: int, inbox: Sequence[InboxMessage], now: datetime
) -> WorkflowTaskResult:
    """Decide the next workflow task with an executor that has replayed the history up to
    ``last_seq`` (freshly, or kept from the run's previous task); the executor moves on with it.

    Update requests are screened once the task's other messages are applied and the code is
    blocked (its handlers registered); the accepted ones form a second block of the same task."""
    run_id = executor.run_id
    if executor.completed_in_history:
        # a finished run: whatever still arrives is dropped, and update requests are refused
        return WorkflowTaskResult(
            run_id=run_id,
            expected_last_seq=last_seq,
            consumed=tuple(m.message_id for m in inbox),
            effects=_answers_only(_refused_updates(inbox)),
        )
    taken = select_messages(executor.suspended, inbox)
    if not taken:
        return WorkflowTaskResult(run_id=run_id, expected_last_seq=last_seq)
    # the common task has neither update requests nor a terminate: one look at each kind, and
    # the messages go to the block as they are (this runs for every task)
    for message in taken:
        kind = type(message.event)
        if kind is ev.UpdateRequested or kind is ev.RunTerminated:
            break
    else:
        return _block(executor, last_seq, taken, now)
    ordinary: list[InboxMessage] = []
    requests: list[InboxMessage] = []
    for message in taken:
        kind = type(message.event)
        if kind is ev.UpdateRequested:
            requests.append(message)
        elif kind is ev.RunTerminated:
            # the hard stop: nothing else of the inbox is applied, and no workflow code runs
            stopped = _block(executor, last_seq, [message], now)
            effects = stopped.effects or NO_EFFECTS
            return attrs.evolve(
                stopped,
                consumed=tuple(m.message_id for m in taken),
                effects=attrs.evolve(effects, update_answers=effects.update_answers + _refused_updates(taken)),
            )
        else:
            ordinary.append(message)
    first = _block(executor, last_seq, ordinary, now) if ordinary else None
    if not requests:
        return first if first is not None else WorkflowTaskResult(run_id=run_id, expected_last_seq=last_seq)
    accepted: list[_Accepted] = []
    answers: list[UpdateAnswer] = []
    refused: list[int] = []
    for message in requests:
        request = message.event
        assert isinstance(request, ev.UpdateRequested)
        verdict = executor.screen_update(request)
        if verdict.accepted and any(getattr(m.event, "update_id", None) == request.update_id for m in accepted):
            verdict = UpdateVerdict(repeat=True)  # the same id twice in one task: answered once, by id
        if verdict.accepted:
            accepted.append(
                _Accepted(
                    message.message_id,
                    ev.UpdateAccepted(update_id=request.update_id, name=request.name, args=request.args),
                )
            )
            continue
        refused.append(message.message_id)
        if verdict.answer is not None:
            answers.append(_answer_of(verdict.answer))
        elif verdict.failure is not None:
            answers.append(UpdateAnswer(update_id=request.update_id, failure=verdict.failure, rejected=True))
    result = first
    if accepted:
        after = first.new_events[-1].sequence_number if first is not None else last_seq
        second = _block(executor, after, accepted, now)
        result = second if first is None else _merge(first, second)
    if result is None:
        result = WorkflowTaskResult(run_id=run_id, expected_last_seq=last_seq)
    if not refused:
        return result
    effects = result.effects or NO_EFFECTS
    return attrs.evolve(
        result,
        consumed=result.consumed + tuple(refused),
        effects=attrs.evolve(effects, update_answers=tuple(answers) + effects.update_answers),
    )


class _Accepted(NamedTuple):
    """An accepted update request as its block records it (the request's message id)."""

    message_id: int
    event: ev.Event


def _block(
    executor: WorkflowExecutor, last_seq: int, taken: Sequence[InboxMessage | _Accepted], now: datetime
) -> WorkflowTaskResult:
    """One workflow-task block: ``taken`` (each message's event as recorded) applied, the code
    stepped, its commands as events."""
    run_id = executor.run_id
    created = executor.created

    seq = last_seq + 1
    new_events = [ev.HistoryEvent(sequence_number=seq, timestamp=now, event=ev.WorkflowTaskStarted())]
    numbered: list[tuple[int, ev.Event]] = []
    consumed: list[int] = []
    started = False
    for message in taken:
        got = message.event
        seq += 1
        numbered.append((seq, got))
        new_events.append(ev.HistoryEvent(sequence_number=seq, timestamp=now, event=got))
        consumed.append(message.message_id)
        if type(got) is ev.RunStarted:
            started = True
    issued = executor.apply_block(now, numbered, None, next_seq=seq + 1)

    activity_tasks: list[NewActivityTask] = []
    messages: list[OutgoingMessage] = []
    child_runs: list[NewRun] = []
    effects: _Effects | None = None  # what only conversations issue: gathered once one is seen
    completion: ev.RunCompleted | None = None
    for command_seq, command in issued:
        event = cmd.to_event(command)
        new_events.append(ev.HistoryEvent(sequence_number=command_seq, timestamp=now, event=event))
        # by exact type, commonest first: this runs for every command of every task
        if type(event) is ev.ActivityTaskCreated:
            activity_tasks.append(activity_task(run_id, command_seq, event, created, now))
        elif type(event) is ev.TimerCreated:
            messages.append(
                OutgoingMessage(
                    run_id=run_id, event=ev.TimerElapsed(created_seq=command_seq), visible_from=event.fire_at
                )
            )
        elif type(event) is ev.RunCompleted:
            completion = event
        elif type(event) is ev.ChildRunCreated:
            child = NewRun(
                run_id=event.child_run_id,
                created=child_created(run_id, event, created),
                rule=executor.start_rule_of(event.child_run_id),
            )
            child_runs.append(child)
            messages.extend(_deadline_messages(child))
        else:
            if effects is None:
                effects = _Effects()
            effects.add(command_seq, event, created, messages, executor.start_rule_of)
    next_seq = new_events[-1].sequence_number + 1
    new_events.append(ev.HistoryEvent(sequence_number=next_seq, timestamp=now, event=ev.WorkflowTaskCompleted()))

    cancellations = executor.cancellations
    terminated = completion is not None and completion.status is RunStatus.TERMINATED
    if cancellations is not None:
        messages.extend(
            OutgoingMessage(run_id=child, event=_stop(terminated, reason), visible_from=now)
            for child, reason in cancellations.children
        )
    new_history: tuple[ev.HistoryEvent, ...] | None = None
    unread = 0
    if isinstance(executor.outcome, ContinueAsNewRequest):
        new_history, messages, activity_tasks, child_runs = _continue_as_new(
            executor, executor.outcome, now, first_seq=next_seq + 1
        )
    elif completion is not None:
        messages.extend(_completion_messages(run_id, created, completion, executor.pending_children(), now))
        # a terminated run's code is not asked (terminate() decides without it): it reports none
        unread = 0 if terminated else len(executor.unconsumed_events())
    if (
        effects is None
        and cancellations is None
        and not unread
        and not executor.labels_changed
        and not executor.resumed
    ):
        # the common block: the conversations' fields keep their defaults
        return WorkflowTaskResult(
            run_id=run_id,
            expected_last_seq=last_seq,
            new_events=tuple(new_events),
            consumed=tuple(consumed),
            started=started,
            completion=completion,
            custom_status=executor.custom_status,
            activity_tasks=tuple(activity_tasks),
            messages=tuple(messages),
            child_runs=tuple(child_runs),
            new_history=new_history,
        )
    if effects is None:
        effects = _Effects()
    return WorkflowTaskResult(
        run_id=run_id,
        expected_last_seq=last_seq,
        new_events=tuple(new_events),
        consumed=tuple(consumed),
        started=started,
        completion=completion,
        custom_status=executor.custom_status,
        activity_tasks=tuple(activity_tasks),
        messages=tuple(messages),
        child_runs=tuple(child_runs),
        new_history=new_history,
        effects=RunEffects(
            update_answers=tuple(effects.answers),
            published=tuple(effects.published),
            stream_items=tuple(effects.stream_items),
            streams_closed=tuple(effects.streams_closed),
            labels=tuple(sorted(executor.labels.items())) if executor.labels_changed else None,
            cancelled_activities=() if cancellations is None else tuple(cancellations.activities),
            cancelled_timers=() if cancellations is None else tuple(cancellations.timers),
            detached_runs=tuple(effects.detached_runs),
            unread_events=unread,
            resumed=executor.resumed,
        ),
    )


class _Effects:
    """What a block's commands ask of the store beyond tasks, timers and children (updates
    answered, values published, streams written, runs started apart), in command order."""

    __slots__ = ("answers", "detached_runs", "published", "stream_items", "streams_closed")

    def __init__(self) -> None:
        self.answers: list[UpdateAnswer] = []
        self.published: list[tuple[str, Payload]] = []
        self.stream_items: list[StreamItem] = []
        self.streams_closed: list[str] = []
        self.detached_runs: list[NewRun] = []

    def add(
        self,
        seq: int,
        event: ev.Event,
        created: ev.RunCreated,
        messages: list[OutgoingMessage],
        rule_of: Callable[[str], StartRule],
    ) -> None:
        match event:
            case ev.DetachedRunCreated():
                detached = NewRun(
                    run_id=event.run_id, created=detached_created(event, created), rule=rule_of(event.run_id)
                )
                self.detached_runs.append(detached)
                messages.extend(_deadline_messages(detached))
            case ev.UpdateCompleted():
                self.answers.append(UpdateAnswer(update_id=event.update_id, result=event.result, failure=event.failure))
            case ev.ValuePublished():
                self.published.append((event.key, event.value))
            case ev.StreamItemWritten():
                self.stream_items.append(StreamItem(key=event.key, seq=seq, value=event.value))
            case ev.StreamClosed():
                self.streams_closed.append(event.key)


def _merge(
    first: WorkflowTaskResult,
    second: WorkflowTaskResult,
    *,
    activity_tasks: tuple[NewActivityTask, ...] | None = None,
    consumed: tuple[int, ...] | None = None,
) -> WorkflowTaskResult:
    """Two consecutive blocks of one workflow task as one result (one write); ``activity_tasks``
    and ``consumed``, when given, stand for the two blocks' own."""
    return WorkflowTaskResult(
        run_id=first.run_id,
        expected_last_seq=first.expected_last_seq,
        new_events=first.new_events + second.new_events,
        consumed=first.consumed + second.consumed if consumed is None else consumed,
        started=first.started or second.started,
        completion=second.completion,
        custom_status=second.custom_status,
        activity_tasks=first.activity_tasks + second.activity_tasks if activity_tasks is None else activity_tasks,
        messages=first.messages + second.messages,
        child_runs=first.child_runs + second.child_runs,
        new_history=second.new_history,
        effects=_then(first.effects, second.effects),
    )


def _then(first: RunEffects | None, second: RunEffects | None) -> RunEffects | None:
    if first is None:
        return second
    return first if second is None else first.then(second)


def _answers_only(answers: tuple[UpdateAnswer, ...]) -> RunEffects | None:
    return RunEffects(update_answers=answers) if answers else None


def _stop(terminated: bool, reason: str) -> ev.Message:
    return ev.RunTerminated(reason=reason) if terminated else ev.RunCancelled(reason=reason)


def _answer_of(command: cmd.CompleteUpdate) -> UpdateAnswer:
    return UpdateAnswer(update_id=command.update_id, result=command.result, failure=command.failure)


def _refused_updates(inbox: Sequence[InboxMessage]) -> tuple[UpdateAnswer, ...]:
    """Update requests to a run that has ended (or ends in this very task)."""
    failure = FailureInfo(type="InvalidStateError", message="the run has ended", terminal=True)
    return tuple(
        UpdateAnswer(update_id=m.event.update_id, failure=failure, rejected=True)
        for m in inbox
        if isinstance(m.event, ev.UpdateRequested)
    )


def _deadline_messages(run: NewRun) -> list[OutgoingMessage]:
    message = deadline_message(run.run_id, run.created)
    return [] if message is None else [message]


def deadline_message(run_id: str, created: ev.RunCreated) -> OutgoingMessage | None:
    """The cancel request a run with a deadline gets when it passes (reason "timeout"), to insert
    with the run: ``start_workflow(timeout=)``, ``ctx.child(timeout=)``, ``ctx.start_workflow``."""
    if created.deadline is None:
        return None
    return OutgoingMessage(run_id=run_id, event=ev.RunCancelled(reason="timeout"), visible_from=created.deadline)


def terminate(
    run_id: str, history: Sequence[ev.HistoryEvent], inbox: Sequence[InboxMessage], reason: str, now: datetime
) -> WorkflowTaskResult:
    """``engine.terminate`` decided from the history alone, without the workflow code (which may
    be stuck, unregistered or no longer deterministic): one block recording ``RunTerminated``,
    an answer for every accepted update and the TERMINATED outcome; every pending activity
    dropped (its timers go with the run's inbox), every child terminated, the parent told. The whole inbox is consumed. Replay
    of the block by the workflow's executor issues the same commands."""
    state = fold(history)
    last_seq = history[-1].sequence_number
    if state.status.is_terminal:
        return WorkflowTaskResult(
            run_id=run_id,
            expected_last_seq=last_seq,
            consumed=tuple(m.message_id for m in inbox),
            effects=_answers_only(_refused_updates(inbox)),
        )
    created = history[0].event
    assert isinstance(created, ev.RunCreated)
    events: list[ev.Event] = [ev.WorkflowTaskStarted(), ev.RunTerminated(reason=reason)]
    answers = [
        UpdateAnswer(
            update_id=update_id,
            failure=FailureInfo(type="UpdateFailedError", message=TERMINATED_UPDATE, terminal=True),
        )
        for update_id in state.pending_updates
    ]
    events += [ev.UpdateCompleted(update_id=a.update_id, failure=a.failure) for a in answers]
    completion = ev.RunCompleted(
        status=RunStatus.TERMINATED,
        failure=FailureInfo(type="RunTerminated", message=reason or "terminated", terminal=True),
    )
    events += [completion, ev.WorkflowTaskCompleted()]
    new_events = tuple(
        ev.HistoryEvent(sequence_number=last_seq + 1 + i, timestamp=now, event=event) for i, event in enumerate(events)
    )
    messages = [
        OutgoingMessage(run_id=child, event=ev.RunTerminated(reason=terminated_parent(run_id)), visible_from=now)
        for child in state.pending_children
    ]
    messages += _completion_messages(run_id, created, completion, (), now)
    return WorkflowTaskResult(
        run_id=run_id,
        expected_last_seq=last_seq,
        new_events=new_events,
        consumed=tuple(m.message_id for m in inbox),
        completion=completion,
        messages=tuple(messages),
        effects=RunEffects(
            update_answers=tuple(answers) + _refused_updates(inbox),
            cancelled_activities=tuple(sorted(state.pending_activities)),
        ),
    )


def answer_query(
    definition: WorkflowDefinition,
    run_id: str,
    history: Sequence[ev.HistoryEvent],
    name: str,
    args: tuple[Payload, ...],
    converter: PayloadConverter,
    *,
    activities: ActivityLookup = lambda _n: None,
    workflows: WorkflowLookup = lambda _n: None,
) -> Payload:
    """Answer a query by replaying ``history`` here (where no worker holds the run): nothing is
    written, and an ended run answers too; a run whose code no task has run yet answers from
    its code run as its first task would, recording nothing (:meth:`WorkflowExecutor.preview`). QueryError as
    :meth:`WorkflowExecutor.query` says."""
    executor = replay_history(definition, run_id, history, converter, activities=activities, workflows=workflows)
    try:
        if not split_blocks(history)[1]:
            # no task has run its code yet: run it to its first step, so that the handlers its
            # top registers answer (a query right after the start, before any worker took it)
            executor.preview(history[0].timestamp, history[-1].sequence_number + 1)
        if executor.nondeterminism is not None:
            raise QueryError(f"the run's history no longer replays: {executor.nondeterminism}")
        return executor.query(name, args)
    finally:
        executor.close()


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


def detached_created(event: ev.DetachedRunCreated, created: ev.RunCreated) -> ev.RunCreated:
    """The creation event of a run ``ctx.start_workflow`` starts: no parent; seeded from its id."""
    return ev.RunCreated(
        workflow_name=event.workflow_name,
        input=event.input,
        queue=event.queue,
        instance_id=event.instance_id,
        priority=event.priority,
        concurrency_key=event.concurrency_key,
        labels=event.labels,
        random_seed=uuid.UUID(event.run_id).int >> 64,
        trace_context=created.trace_context,
        code_version=created.code_version,
        deadline=event.deadline,
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
        deadline=event.deadline,
    )


def can_continue(executor: WorkflowExecutor, result: WorkflowTaskResult) -> bool:
    """Whether ``result``'s task may go on with outcomes of its own activities (see
    :func:`continue_task`): the run is live, not suspended, and scheduled activities."""
    return _may_go_on(executor, result.activity_tasks, result)


def _may_go_on(executor: WorkflowExecutor, activity_tasks: Sequence[NewActivityTask], last: WorkflowTaskResult) -> bool:
    """:func:`can_continue` of a task whose pending activities are ``activity_tasks`` and whose
    latest block is ``last`` (the whole result, or a :class:`Continued`'s last step)."""
    return (
        bool(activity_tasks)
        and last.completion is None
        and last.new_history is None
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
    write: replay cannot tell the two apart. Requires :func:`can_continue`. A task that goes on
    step after step uses :class:`Continued`, which this is one step of.
    """
    continued = Continued(result)
    continued.add(executor, outcomes, retries, now)
    return continued.result()


class Continued:
    """A workflow task's result as :func:`continue_task` extends it, step after step, put
    together once at the end (:meth:`result`). Merged after every step instead, each step of a
    run of quick activities built a new result and copied every tuple of the ones before."""

    __slots__ = ("_first", "_steps", "activity_tasks", "events", "last")

    def __init__(self, first: WorkflowTaskResult) -> None:
        self._first = first
        self._steps: list[WorkflowTaskResult] = []
        self.activity_tasks = first.activity_tasks  # the task's pending activities, as merged
        self.events = len(first.new_events)  # the new events of all the steps so far
        self.last = first  # the latest step: its completion, status and new history are the task's

    def can_continue(self, executor: WorkflowExecutor) -> bool:
        """:func:`can_continue` of the result so far."""
        return _may_go_on(executor, self.activity_tasks, self.last)

    def add(
        self,
        executor: WorkflowExecutor,
        outcomes: Sequence[ev.ActivityTaskCompleted | ev.ActivityTaskFailed],
        retries: Sequence[NewActivityTask],
        now: datetime,
    ) -> None:
        """One step of :func:`continue_task`. Requires :meth:`can_continue`."""
        answered = {m.created_seq for m in outcomes} | {r.created_seq for r in retries}
        kept = tuple(t for t in self.activity_tasks if t.created_seq not in answered) + tuple(retries)
        if not outcomes:
            self.activity_tasks = kept
            return
        # inline messages never were in the inbox: negative ids, left out of what the task consumed
        inbox = [InboxMessage(message_id=-(i + 1), event=message) for i, message in enumerate(outcomes)]
        last = self.last
        step = advance(executor, last.new_events[-1].sequence_number, inbox, now)
        if len(step.consumed) != len(inbox):
            raise AssertionError(f"run {last.run_id}: an inline activity outcome was not applied")
        self._steps.append(step)
        self.activity_tasks = kept + step.activity_tasks
        self.events += len(step.new_events)
        self.last = step

    def result(self) -> WorkflowTaskResult:
        """The first result with every step added: one result, written in one write."""
        first, steps = self._first, self._steps
        if not steps:
            if self.activity_tasks is first.activity_tasks:
                return first
            return attrs.evolve(first, activity_tasks=self.activity_tasks)
        last = self.last
        effects = first.effects
        new_events = list(first.new_events)
        messages = list(first.messages)
        child_runs = list(first.child_runs)
        started = first.started
        for step in steps:
            new_events.extend(step.new_events)
            messages.extend(step.messages)
            child_runs.extend(step.child_runs)
            started = started or step.started
            effects = _then(effects, step.effects)
        return WorkflowTaskResult(
            run_id=first.run_id,
            expected_last_seq=first.expected_last_seq,
            new_events=tuple(new_events),
            consumed=first.consumed,
            started=started,
            completion=last.completion,
            custom_status=last.custom_status,
            activity_tasks=self.activity_tasks,
            messages=tuple(messages),
            child_runs=tuple(child_runs),
            new_history=last.new_history,
            effects=effects,
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
    # the labels as set_labels left them, the deadline and the closed streams are the whole run's
    created = attrs.evolve(
        executor.created,
        input=request.input,
        generation=executor.created.generation + 1,
        labels=tuple(sorted(executor.labels.items())),
        closed_streams=executor.closed_streams(),
    )
    carried: list[ev.Message] = [ev.RunStarted(), *executor.unconsumed_events()]
    messages = [OutgoingMessage(run_id=executor.run_id, event=event, visible_from=now) for event in carried]
    history = (ev.HistoryEvent(sequence_number=first_seq, timestamp=now, event=created),)
    return history, messages, [], []
