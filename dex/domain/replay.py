"""The workflow executor: drives workflow code through a run's history, block by block.

A run's history is a sequence of workflow-task blocks::

    WorkflowTaskStarted, <messages the task consumed>, <events of the commands it issued>, WorkflowTaskCompleted

The executor replays each recorded block: it applies the block's messages (resolving the
futures the code waits on), steps the code until it blocks, and checks that every command the
code issues is the one recorded at that place. Then it applies the new block, whose commands
are the output of the current workflow task. A command that differs from the record is a
non-determinism: the executor stops the code and the run fails naming both steps. The
commands themselves are built (definitions found, arguments checked) in ``dex.domain.steps``.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from dex.domain import commands as cmd
from dex.domain import events as ev
from dex.domain.context import ContinueAsNew, WorkflowContext
from dex.domain.coroutines import CoroutineStepper, DexFuture, never
from dex.domain.definitions import PayloadConverter, Signature, WorkflowDefinition, validate_name
from dex.domain.errors import InvalidStateError, NonDeterminismError
from dex.domain.matching import BlockCursor
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.steps import (
    ActivityLookup,
    WorkflowLookup,
    activity_command,
    child_command,
    delay_of,
    encode_arguments,
    gather,
)
from dex.domain.values import FailureInfo, Payload
from dex.domain.waits import Waits


class _Abort(BaseException):
    """Stops workflow code at a side effect or patch it may not issue (after a non-determinism,
    or closed); a BaseException so that ``except Exception`` does not catch it. A step it awaits
    there returns a future that never completes instead (:func:`dex.domain.coroutines.never`):
    code that catches everything then stops at its next await rather than looping on the raise."""


@attrs.frozen(kw_only=True)
class ContinueAsNewRequest:
    """The run ends this generation and starts again with ``input``."""

    input: tuple[Payload, ...]


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
        self._refused = 0  # coroutines that refused to close, abandoned, not yet reported by close()
        self._waits = Waits(converter)
        self._cancel_requested = False
        self.suspended = False
        self.completed_in_history = False
        self.closed = False
        self._driving = False  # True while apply_block steps the code: only then may it issue commands
        self.outcome: cmd.CompleteRun | ContinueAsNewRequest | None = None
        self.nondeterminism: str | None = None
        self._block = BlockCursor(self._mismatch)  # the block being applied
        self._patches: dict[str, bool] = {}  # each patch's answer, fixed for the rest of the run

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

    def replay(
        self, blocks: Iterable[tuple[datetime, Sequence[tuple[int, ev.Event]], Sequence[ev.HistoryEvent]]]
    ) -> None:
        """Apply recorded blocks (started at, messages, command events); if one raises, the
        executor is dropped, so it is closed at once, not left to the garbage collector."""
        try:
            for started_at, messages, recorded in blocks:
                self.apply_block(started_at, messages, recorded)
        except BaseException:
            self.close()
            raise

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
        self._block.begin(recorded, next_seq)
        if self.nondeterminism is not None:
            if recorded is None:
                failure = FailureInfo(type=NonDeterminismError.__name__, message=self.nondeterminism, terminal=True)
                self._block.new.append((next_seq, cmd.CompleteRun(status=RunStatus.FAILED, failure=failure)))
            return self._block.new
        for seq, message in messages:
            self._apply(seq, message)
        if self._cancel_requested and self.outcome is None:
            self._refused += self._stepper.close()
            self._issue(cmd.CompleteRun(status=RunStatus.CANCELLED))
        elif not self.suspended:
            self._stepper.run_until_blocked()
        if self.nondeterminism is None:
            self._block.check_all_asked()
        if self.nondeterminism is not None:
            self._refused += self._stepper.close()
        if self.outcome is not None:
            self._refused += self._stepper.close()
        return self._block.new

    def close(self) -> int:
        """Stop the workflow code for good (its ``finally`` blocks run, silently, issuing nothing:
        ``ctx.is_replaying`` is True, the logger is quiet, a step or a side effect it asks for
        stops the code there, and a ``finally`` that awaits ends at the await).

        Returns how many of its coroutines refused to stop and were abandoned (code that caught
        the close and awaited again, :meth:`CoroutineStepper.close`), since the last call: each
        is reported once. An abandoned coroutine is left to the garbage collector, whose close
        runs its code up to its next await once more, as silently."""
        self.closed = True
        self.is_replaying = True  # keeps the logger quiet while the code unwinds
        self._driving = False
        refused, self._refused = self._refused + self._stepper.close(), 0
        return refused

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
        return self._block.issue(command)

    def _issue_or_abort(self, command: cmd.Command) -> tuple[int, ev.Event]:
        issued = self._issue(command)
        if issued is None:
            raise _Abort()
        return issued

    # -- messages ----------------------------------------------------------------------------
    def _apply(self, seq: int, message: ev.Event) -> None:
        match message:
            case ev.RunStarted():
                self._start()
            case ev.RunCancelled():
                self._cancel_requested = True
            case ev.RunSuspended():
                self.suspended = True  # the code waits; later messages are held back in the inbox
            case ev.RunResumed():
                self.suspended = False
            case _:
                if not self._waits.deliver(message):
                    raise ValueError(f"{type(message).__name__} is not a message a run can receive")

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
            self._continue_as_new(exc.payloads)
        elif isinstance(exc, _Abort):
            pass
        else:
            self._complete_failed(exc)

    def _complete_failed(self, exc: BaseException) -> None:
        self._complete(cmd.CompleteRun(status=RunStatus.FAILED, failure=FailureInfo.from_exception(exc, terminal=True)))

    def _complete(self, command: cmd.CompleteRun) -> None:
        if self._issue(command) is not None:
            self.outcome = command

    def _continue_as_new(self, payloads: tuple[Payload, ...]) -> None:
        pending = self._waits.pending_steps()
        if pending:
            self._complete_failed(
                InvalidStateError(f"continue_as_new refused while {', '.join(pending)} are pending; await them first")
            )
            return
        self.outcome = ContinueAsNewRequest(input=payloads)

    def encode_arguments(self, args: tuple[Any, ...]) -> tuple[Payload, ...]:
        """``continue_as_new``'s arguments, encoded at its call: ``SerializationError`` naming
        the argument that cannot be (the code may catch it, as at ``ctx.activity``)."""
        return encode_arguments(self.converter, args, "continue_as_new argument")

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
        command, definition = activity_command(
            fn_or_name,
            args,
            queue=queue,
            retry=retry,
            priority=priority,
            run_priority=self.created.priority,
            converter=self.converter,
            lookup=self._activities_lookup,
        )
        name = command.name
        issued = self._issue(command)
        if issued is None:
            return never(name)  # it may issue nothing: the code stops at its await (see _Abort)
        return self._waits.activity(issued[0], name, definition.signature.returns if definition else None)

    def start_timer(self, delay: timedelta | float) -> DexFuture[None]:
        seq = self._create_timer(delay)
        return never("timer") if seq is None else self._waits.timer(seq)

    def _create_timer(self, delay: timedelta | float) -> int | None:
        issued = self._issue(cmd.StartTimer(fire_at=self.now + delay_of(delay)))
        return None if issued is None else issued[0]

    def wait_for_event(self, event_id: str, timeout: timedelta | float | None) -> DexFuture[Any]:
        validate_name(event_id, "event id")
        buffered = self._waits.buffered_event(event_id)
        if buffered is not None:
            return buffered
        waiter = self._waits.event(event_id)
        if timeout is not None:
            seq = self._create_timer(timeout)
            if seq is None:
                return never(event_id)
            self._waits.time_out(event_id, waiter, seq, timeout)
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
        child_run_id = uuid.uuid5(uuid.NAMESPACE_URL, f"dex:{self.run_id}:{self.generation}:{self._block.peek_seq()}")
        command, definition = child_command(
            fn_or_name,
            args,
            child_run_id=str(child_run_id),
            instance_id=instance_id,
            queue=queue,
            concurrency_key=concurrency_key,
            priority=priority,
            labels=labels,
            run_priority=self.created.priority,
            converter=self.converter,
            lookup=self._workflows_lookup,
        )
        name = command.workflow_name
        issued = self._issue(command)
        if issued is None:
            return never(name)
        _seq, event = issued
        assert isinstance(event, ev.ChildRunCreated)
        return self._waits.child(event.child_run_id, name, definition.signature.returns if definition else None)

    def pending_children(self) -> tuple[str, ...]:
        """Children started and not yet finished, in the order they were started."""
        return self._waits.pending_children()

    def unconsumed_events(self) -> tuple[ev.ExternalEventReceived, ...]:
        """External events received but not yet waited for, in arrival order per id."""
        return self._waits.unconsumed_events()

    def gather(self, awaitables: Sequence[Awaitable[Any]]) -> DexFuture[list[Any]]:
        return gather(self._stepper, awaitables)

    def side_effect(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        validate_name(name, "side effect name")
        try:
            hint = Signature.of(fn).returns
        except (TypeError, ValueError):  # builtins without a signature
            hint = None
        if self._block.deciding and self.nondeterminism is None and self._driving and not self.closed:
            payload = self.converter.encode(fn(*args))
            self._issue_or_abort(cmd.RecordSideEffect(name=name, result=payload))
        else:
            _seq, event = self._issue_or_abort(cmd.RecordSideEffect(name=name, result=Payload(encoding="", data=b"")))
            assert isinstance(event, ev.SideEffectExecuted)
            payload = event.result
        return self.converter.decode(payload, hint)

    def patched(self, patch_id: str) -> bool:
        """docs/reference/contract.md §11: True where the run takes the patched branch, False where its history was
        made by code without the patch; the first answer holds for the rest of the run."""
        validate_name(patch_id, "patch id")
        known = self._patches.get(patch_id)
        if known is not None:
            return known
        if self._block.deciding:
            self._issue_or_abort(cmd.RecordPatch(patch_id=patch_id))
            answer = True
        else:
            # replaying: the patched code recorded PatchApplied exactly here; any other record
            # (or none) means the history was made by code without the patch
            answer = self._block.take_patch(patch_id)
        self._patches[patch_id] = answer
        return answer

    def deprecate_patch(self, patch_id: str) -> None:
        """Accept a history with or without ``PatchApplied(patch_id)`` here; record nothing."""
        validate_name(patch_id, "patch id")
        if not self._block.deciding:
            self._block.take_patch(patch_id)
