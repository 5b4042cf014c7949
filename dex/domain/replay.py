"""The workflow executor: drives workflow code through a run's history, block by block.

A run's history is a sequence of workflow-task blocks::

    WorkflowTaskStarted, <messages the task consumed>, <events of the commands it issued>, WorkflowTaskCompleted

The executor replays each recorded block: it applies the block's messages (resolving the
futures the code waits on), steps the code until it blocks, and checks that every command the
code issues is the one recorded at that place. Then it applies the new block, whose commands
are the output of the current workflow task. A command that differs from the record is a
non-determinism: the executor stops the code and the run fails naming both steps.
"""

from __future__ import annotations

import inspect
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from dex.domain import commands as cmd
from dex.domain import events as ev
from dex.domain.context import ContinueAsNew, WorkflowContext
from dex.domain.coroutines import CoroutineStepper, DexFuture, resolved
from dex.domain.definitions import (
    ActivityDefinition,
    PayloadConverter,
    Signature,
    WorkflowDefinition,
    validate_name,
    validate_optional_text,
    validate_priority,
    validate_queue,
    validate_text,
)
from dex.domain.errors import (
    ActivityFailedError,
    ChildWorkflowFailedError,
    InvalidStateError,
    NonDeterminismError,
    WaitTimeoutError,
)
from dex.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo, Payload, describe_failure

ActivityLookup = Callable[[str], ActivityDefinition | None]
WorkflowLookup = Callable[[str], WorkflowDefinition | None]


class _Abort(BaseException):
    """Unwinds workflow code after a non-determinism; a BaseException so user code does not catch it."""


@attrs.frozen(kw_only=True)
class ContinueAsNewRequest:
    """The run ends this generation and starts again with ``input``."""

    input: tuple[Payload, ...]


@attrs.define
class _Pending:
    future: DexFuture[Any]
    hint: object
    name: str


class WorkflowExecutor:
    """Replays and advances one run of one workflow definition. Pure: no I/O, no clock."""

    def __init__(
        self,
        *,
        run_id: str,
        definition: WorkflowDefinition,
        created: ev.RunCreated,
        converter: PayloadConverter,
        activities: ActivityLookup = lambda _name: None,
        workflows: WorkflowLookup = lambda _name: None,
    ) -> None:
        self.run_id = run_id
        self.definition = definition
        self.created = created
        self.converter = converter
        self._activities_lookup = activities
        self._workflows_lookup = workflows
        self.generation = created.generation
        self.workflow_name = definition.name
        self.now: datetime = datetime.min
        self.is_replaying = False
        self.custom_status: str | None = None
        self.context = WorkflowContext(self)
        self._stepper = CoroutineStepper()
        self._activities: dict[int, _Pending] = {}
        self._timers: dict[int, DexFuture[None]] = {}
        self._children: dict[str, _Pending] = {}
        self._event_buffer: dict[str, deque[Payload]] = {}
        self._event_waiters: dict[str, deque[DexFuture[Any]]] = {}
        self._cancel_requested = False
        self.suspended = False
        self.completed_in_history = False
        self.closed = False
        self._driving = False  # True while apply_block steps the code: only then may it issue commands
        self.outcome: cmd.CompleteRun | ContinueAsNewRequest | None = None
        self.nondeterminism: str | None = None
        # the block being applied
        self._recorded: Sequence[ev.HistoryEvent] | None = None
        self._cursor = 0
        self._next_seq = 0
        self._new: list[tuple[int, cmd.Command]] = []

    # -- driving ---------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.outcome is not None or self.nondeterminism is not None

    def apply_block(
        self,
        now: datetime,
        messages: Sequence[tuple[int, ev.Event]],
        recorded: Sequence[ev.HistoryEvent] | None,
        next_seq: int = 0,
    ) -> list[tuple[int, cmd.Command]]:
        """Apply one workflow-task block and step the code until it blocks.

        ``recorded`` holds the block's recorded command events when replaying, or None for
        the block being decided now; then new commands are numbered from ``next_seq`` and
        returned with their sequence numbers.
        """
        if self.closed:
            return []  # closed (or given up by the watchdog): its code runs no further
        try:
            self._driving = True
            return self._apply_block(now, messages, recorded, next_seq)
        finally:
            # workflow code runs only in here (and when closed): whatever runs it elsewhere — a
            # garbage collector finalizing a dropped coroutine — finds it replaying, issuing nothing
            self._driving = False
            self.is_replaying = True

    def _apply_block(
        self,
        now: datetime,
        messages: Sequence[tuple[int, ev.Event]],
        recorded: Sequence[ev.HistoryEvent] | None,
        next_seq: int,
    ) -> list[tuple[int, cmd.Command]]:
        self.now = now
        self.is_replaying = recorded is not None
        if recorded is not None and any(isinstance(item.event, ev.RunCompleted) for item in recorded):
            self.completed_in_history = True
        self._recorded, self._cursor, self._next_seq, self._new = recorded, 0, next_seq, []
        if self.nondeterminism is not None:
            if recorded is None:
                failure = FailureInfo(type=NonDeterminismError.__name__, message=self.nondeterminism, terminal=True)
                self._new.append((next_seq, cmd.CompleteRun(status=RunStatus.FAILED, failure=failure)))
            return self._new
        for seq, message in messages:
            self._apply(seq, message)
        if self._cancel_requested and self.outcome is None:
            self._stepper.close()
            self._issue(cmd.CompleteRun(status=RunStatus.CANCELLED))
        elif not self.suspended:
            self._stepper.run_until_blocked()
        if self.nondeterminism is None and recorded is not None and self._cursor < len(recorded):
            missing = recorded[self._cursor]
            self._mismatch(
                f"history recorded {cmd.describe_event(missing.event)} at event {missing.sequence_number} "
                "but the workflow code did not ask for it"
            )
        if self.nondeterminism is not None:
            self._stepper.close()
        if self.outcome is not None:
            self._stepper.close()
        return self._new

    def close(self) -> None:
        """Stop the workflow code for good (its ``finally`` blocks run, silently, issuing nothing:
        ``ctx.is_replaying`` is True, the logger is quiet, a step or a side effect it asks for
        stops the code there, and a ``finally`` that awaits ends at the await)."""
        self.closed = True
        self.is_replaying = True  # keeps the logger quiet while the code unwinds
        self._driving = False
        self._stepper.close()

    def abandon(self) -> None:
        """Give the executor up while another thread runs its code (the watchdog found that code
        blocked): from now on the code issues nothing and runs no side effect, and its logger is
        quiet. The thread running it closes it when the code returns."""
        self.closed = True
        self.is_replaying = True

    def _mismatch(self, text: str) -> None:
        if self.nondeterminism is None:
            self.nondeterminism = f"workflow {self.workflow_name!r} is not deterministic: {text}"

    def _issue(self, command: cmd.Command) -> tuple[int, ev.Event] | None:
        """Record a command: match it against history when replaying, else number it as new."""
        if self.nondeterminism is not None or self.closed or not self._driving:
            return None
        if self._recorded is None:
            seq = self._next_seq
            self._next_seq += 1
            self._new.append((seq, command))
            return seq, cmd.to_event(command)
        if self._cursor >= len(self._recorded):
            self._mismatch(
                f"the workflow code asked for {cmd.describe_command(command)} where history recorded no further step"
            )
            return None
        recorded = self._recorded[self._cursor]
        difference = cmd.matches(command, recorded.event)
        if difference is not None:
            detail = "" if difference == "step" else f" with a different {difference}"
            self._mismatch(
                f"history recorded {cmd.describe_event(recorded.event)} at event {recorded.sequence_number} "
                f"but the workflow code asked for {cmd.describe_command(command)}{detail}"
            )
            return None
        self._cursor += 1
        return recorded.sequence_number, recorded.event

    def _issue_or_abort(self, command: cmd.Command) -> tuple[int, ev.Event]:
        issued = self._issue(command)
        if issued is None:
            raise _Abort()
        return issued

    def _peek_seq(self) -> int:
        if self._recorded is None:
            return self._next_seq
        if self._cursor < len(self._recorded):
            return self._recorded[self._cursor].sequence_number
        return -1

    # -- messages ----------------------------------------------------------------------------
    def _apply(self, seq: int, message: ev.Event) -> None:
        match message:
            case ev.RunStarted():
                self._start()
            case ev.ActivityTaskCompleted():
                pending = self._activities.pop(message.created_seq, None)
                if pending is not None:
                    self._resolve(pending, message.result)
            case ev.ActivityTaskFailed():
                pending = self._activities.pop(message.created_seq, None)
                if pending is not None:
                    pending.future.set_exception(
                        ActivityFailedError(
                            f"activity {pending.name!r} failed: {describe_failure(message.failure)}", message.failure
                        )
                    )
            case ev.TimerElapsed():
                timer = self._timers.pop(message.created_seq, None)
                if timer is not None:
                    timer.set_result(None)
            case ev.ExternalEventReceived():
                waiters = self._event_waiters.get(message.event_id)
                if waiters:
                    self._deliver_event(waiters.popleft(), message.payload)
                else:
                    self._event_buffer.setdefault(message.event_id, deque()).append(message.payload)
            case ev.ChildRunCompleted():
                child = self._children.pop(message.child_run_id, None)
                if child is not None:
                    self._resolve(child, message.result)
            case ev.ChildRunFailed():
                child = self._children.pop(message.child_run_id, None)
                if child is not None:
                    child.future.set_exception(
                        ChildWorkflowFailedError(
                            f"child workflow {child.name!r} ({message.child_run_id}) failed: "
                            f"{describe_failure(message.failure)}",
                            message.failure,
                        )
                    )
            case ev.RunCancelled():
                self._cancel_requested = True
            case ev.RunSuspended():
                self.suspended = True  # the code waits; later messages are held back in the inbox
            case ev.RunResumed():
                self.suspended = False
            case _:
                raise ValueError(f"{type(message).__name__} is not a message a run can receive")

    def _resolve(self, pending: _Pending, payload: Payload) -> None:
        try:
            value = self.converter.decode(payload, pending.hint)
        except BaseException as exc:  # noqa: BLE001 - raised at the await, where the code may catch it
            pending.future.set_exception(exc)
        else:
            pending.future.set_result(value)

    def _deliver_event(self, waiter: DexFuture[Any], payload: Payload) -> None:
        try:
            value = self.converter.decode(payload)
        except BaseException as exc:  # noqa: BLE001 - raised at the await, where the code may catch it
            waiter.set_exception(exc)
        else:
            waiter.set_result(value)

    def _start(self) -> None:
        signature = self.definition.signature
        try:
            signature.check_arity(len(self.created.input), f"workflow {self.workflow_name!r}")
            args = [self.converter.decode(p, signature.hint_for(i)) for i, p in enumerate(self.created.input)]
            coro = self.definition.fn(self.context, *args)
            if not inspect.iscoroutine(coro):
                raise TypeError(f"workflow {self.workflow_name!r} must be an async def function")
        except BaseException as exc:  # noqa: BLE001 - bad input (or user code decoding it) fails the run, not the worker
            self._complete_failed(exc)
            return
        self._stepper.spawn(coro, "main").add_done_callback(self._on_main_done)

    def _on_main_done(self, future: DexFuture[Any]) -> None:
        if self.outcome is not None or self.nondeterminism is not None:
            return
        exc = future.exception()
        if exc is None:
            try:
                payload = self.converter.encode(future.result())
            except BaseException as error:  # noqa: BLE001 - a result user code cannot encode fails the run
                self._complete_failed(error)
                return
            self._complete(cmd.CompleteRun(status=RunStatus.COMPLETED, result=payload))
        elif isinstance(exc, ContinueAsNew):
            self._continue_as_new(exc.args_to_continue)
        elif isinstance(exc, _Abort):
            pass
        else:
            self._complete_failed(exc)

    def _complete_failed(self, exc: BaseException) -> None:
        self._complete(cmd.CompleteRun(status=RunStatus.FAILED, failure=FailureInfo.from_exception(exc, terminal=True)))

    def _complete(self, command: cmd.CompleteRun) -> None:
        if self._issue(command) is not None:
            self.outcome = command

    def _continue_as_new(self, args: tuple[Any, ...]) -> None:
        pending = []
        if self._activities:
            pending.append(f"{len(self._activities)} activit{'y' if len(self._activities) == 1 else 'ies'}")
        if self._timers:
            pending.append(f"{len(self._timers)} timer(s)")
        if self._children:
            pending.append(f"{len(self._children)} child workflow(s)")
        if pending:
            self._complete_failed(
                InvalidStateError(f"continue_as_new refused while {', '.join(pending)} are pending; await them first")
            )
            return
        try:
            payloads = tuple(self.converter.encode(a) for a in args)
        except BaseException as exc:  # noqa: BLE001 - arguments user code cannot encode fail the run
            self._complete_failed(exc)
            return
        self.outcome = ContinueAsNewRequest(input=payloads)

    # -- what the context asks for -------------------------------------------------------------
    def schedule_activity(
        self,
        fn_or_name: Callable[..., Any] | str,
        args: tuple[Any, ...],
        *,
        queue: str | None,
        retry: RetryPolicy | None,
        priority: int | None,
    ) -> DexFuture[Any]:
        definition = _definition_of(fn_or_name, "__dex_activity__", self._activities_lookup, "activity")
        name = definition.name if definition else validate_name(fn_or_name, "activity name")
        if definition is not None:
            definition.signature.check_arity(len(args), f"activity {name!r}")
        command = cmd.ScheduleActivity(
            name=name,
            input=tuple(self.converter.encode(a) for a in args),
            queue=validate_queue(queue) if queue is not None else (definition.queue if definition else "default"),
            priority=validate_priority(priority) if priority is not None else self.created.priority,
            retry_policy=retry or (definition.retry_policy if definition else DEFAULT_RETRY_POLICY),
            lock_timeout=definition.lock_timeout if definition else timedelta(minutes=5),
        )
        seq, _event = self._issue_or_abort(command)
        future: DexFuture[Any] = DexFuture(f"activity {name}")
        self._activities[seq] = _Pending(future, definition.signature.returns if definition else None, name)
        return future

    def start_timer(self, delay: timedelta | float) -> DexFuture[None]:
        seq = self._create_timer(delay)
        future: DexFuture[None] = DexFuture("timer")
        self._timers[seq] = future
        return future

    def _create_timer(self, delay: timedelta | float) -> int:
        if isinstance(delay, (int, float)) and not isinstance(delay, bool):
            delay = timedelta(seconds=delay)
        if not isinstance(delay, timedelta):
            raise TypeError(f"a delay is a timedelta or a number of seconds, got {delay!r}")
        if delay < timedelta(0):
            raise ValueError(f"a delay cannot be negative, got {delay}")
        seq, _event = self._issue_or_abort(cmd.StartTimer(fire_at=self.now + delay))
        return seq

    def wait_for_event(self, event_id: str, timeout: timedelta | float | None) -> DexFuture[Any]:
        validate_name(event_id, "event id")
        buffered = self._event_buffer.get(event_id)
        if buffered:
            waiter: DexFuture[Any] = DexFuture(f"event {event_id}")
            self._deliver_event(waiter, buffered.popleft())
            return waiter
        waiter = DexFuture(f"event {event_id}")
        self._event_waiters.setdefault(event_id, deque()).append(waiter)
        if timeout is not None:
            timer_seq = self._create_timer(timeout)
            timer: DexFuture[None] = DexFuture("event timeout")
            self._timers[timer_seq] = timer

            def on_timeout(_timer: DexFuture[None]) -> None:
                if not waiter.done():
                    self._event_waiters[event_id].remove(waiter)
                    waiter.set_exception(WaitTimeoutError(f"event {event_id!r} did not arrive within {timeout}"))

            def on_event(_waiter: DexFuture[Any]) -> None:
                # the timer no longer guards anything: it must not block continue_as_new
                self._timers.pop(timer_seq, None)

            timer.add_done_callback(on_timeout)
            waiter.add_done_callback(on_event)
        return waiter

    def start_child(
        self,
        fn_or_name: Callable[..., Any] | str,
        args: tuple[Any, ...],
        *,
        instance_id: str | None,
        queue: str | None,
        concurrency_key: str | None,
        priority: int | None,
        labels: Mapping[str, str] | None,
    ) -> DexFuture[Any]:
        definition = _definition_of(fn_or_name, "__dex_workflow__", self._workflows_lookup, "workflow")
        name = definition.name if definition else validate_name(fn_or_name, "workflow name")
        if definition is not None:
            definition.signature.check_arity(len(args), f"workflow {name!r}")
        command = cmd.StartChild(
            child_run_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"dex:{self.run_id}:{self.generation}:{self._peek_seq()}")),
            workflow_name=name,
            input=tuple(self.converter.encode(a) for a in args),
            queue=validate_queue(queue) if queue is not None else (definition.queue if definition else "default"),
            # storable text only: no length rule here, which histories recorded before it would break
            instance_id=validate_optional_text(instance_id, "instance_id"),
            priority=validate_priority(priority) if priority is not None else self.created.priority,
            concurrency_key=validate_optional_text(concurrency_key, "concurrency_key"),
            labels=normalize_labels(labels),
        )
        _seq, event = self._issue_or_abort(command)
        assert isinstance(event, ev.ChildRunCreated)
        future: DexFuture[Any] = DexFuture(f"child {name}")
        self._children[event.child_run_id] = _Pending(future, definition.signature.returns if definition else None, name)
        return future

    def pending_children(self) -> tuple[str, ...]:
        """Children started and not yet finished, in the order they were started."""
        return tuple(self._children)

    def unconsumed_events(self) -> tuple[ev.ExternalEventReceived, ...]:
        """External events received but not yet waited for, in arrival order per id."""
        return tuple(
            ev.ExternalEventReceived(event_id=event_id, payload=payload)
            for event_id, payloads in self._event_buffer.items()
            for payload in payloads
        )

    def gather(self, awaitables: Sequence[Awaitable[Any]]) -> DexFuture[list[Any]]:
        futures: list[DexFuture[Any]] = []
        for item in awaitables:
            if isinstance(item, DexFuture):
                futures.append(item)
            elif inspect.iscoroutine(item):
                futures.append(self._stepper.spawn(item, "gathered"))
            else:
                raise TypeError(f"gather takes WorkflowContext steps or coroutines, got {item!r}")
        if not futures:
            return resolved([], "gather")
        result: DexFuture[list[Any]] = DexFuture("gather")
        remaining = [len(futures)]

        def on_done(done: DexFuture[Any]) -> None:
            if result.done():
                return
            exc = done.exception()
            if exc is not None:
                result.set_exception(exc)
                return
            remaining[0] -= 1
            if remaining[0] == 0:
                result.set_result([f.result() for f in futures])

        for future in futures:
            future.add_done_callback(on_done)
        return result

    def side_effect(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        validate_name(name, "side effect name")
        try:
            hint = Signature.of(fn).returns
        except (TypeError, ValueError):  # builtins without a signature
            hint = None
        if self._recorded is None and self.nondeterminism is None and self._driving and not self.closed:
            payload = self.converter.encode(fn(*args))
            self._issue_or_abort(cmd.RecordSideEffect(name=name, result=payload))
        else:
            _seq, event = self._issue_or_abort(cmd.RecordSideEffect(name=name, result=Payload(encoding="", data=b"")))
            assert isinstance(event, ev.SideEffectExecuted)
            payload = event.result
        return self.converter.decode(payload, hint)


def _definition_of(
    fn_or_name: Callable[..., Any] | str,
    attribute: str,
    lookup: Callable[[str], Any],
    what: str,
) -> Any:
    if isinstance(fn_or_name, str):
        return lookup(fn_or_name)
    definition = getattr(fn_or_name, attribute, None)
    if definition is None:
        raise TypeError(f"{fn_or_name!r} is not a dex {what}: decorate it with @dex.{what} or pass its name")
    return definition


def normalize_labels(labels: Mapping[str, str] | None) -> ev.Labels:
    """Labels as a sorted tuple of pairs, checked to be storable strings (``validate_text``)."""
    if not labels:
        return ()
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of str to str, got {type(labels).__name__}")
    pairs = []
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"labels must map str to str, got {key!r}: {value!r}")
        key = validate_text(key, "labels key")
        pairs.append((key, validate_text(value, f"labels[{key!r}] value")))
    return tuple(sorted(pairs))
