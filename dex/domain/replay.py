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

import functools
import inspect
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import attrs

from dex.domain import commands as cmd
from dex.domain import events as ev
from dex.domain.context import ContinueAsNew, WorkflowContext
from dex.domain.coroutines import CoroutineStepper, DexFuture, never, resolved
from dex.domain.definitions import PayloadConverter, Signature, WorkflowDefinition, validate_name, validate_text
from dex.domain.errors import (
    CancelledError,
    InvalidStateError,
    NonDeterminismError,
    QueryError,
    UpdateFailedError,
    UpdateRejectedError,
    WaitTimeoutError,
)
from dex.domain.handlers import UpdateHandler, sync_handler, validate_handler_name, validate_key
from dex.domain.instance_keys import PLAIN, StartRule, start_rule
from dex.domain.matching import BlockCursor
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.steps import (
    ActivityLookup,
    WorkflowLookup,
    activity_command,
    child_command,
    decode_arguments,
    delay_of,
    encode_arguments,
    gather,
)
from dex.domain.values import FailureInfo, Payload
from dex.domain.waits import EventWait, Waits


class _Abort(BaseException):
    """Stops workflow code at a side effect or patch it may not issue (after a non-determinism,
    or closed); a BaseException so that ``except Exception`` does not catch it. A step it awaits
    there returns a future that never completes instead (:func:`dex.domain.coroutines.never`):
    code that catches everything then stops at its next await rather than looping on the raise."""


@attrs.frozen(kw_only=True)
class ContinueAsNewRequest:
    """The run ends this generation and starts again with ``input``."""

    input: tuple[Payload, ...]


@attrs.define
class Cancellations:
    """Steps cancelled in the block being applied: by ``step.cancel()``, a run cancel request or
    a terminate. The store drops the activity tasks and timers and tells the children."""

    activities: list[int] = attrs.Factory(list)
    timers: list[int] = attrs.Factory(list)
    children: list[tuple[str, str]] = attrs.Factory(list)
    """(child run id, reason)"""


@attrs.frozen(kw_only=True)
class UpdateVerdict:
    """What screening an update request decided: accepted, rejected (``failure``), or a repeat of
    an accepted one (``answer`` if it was answered already, else None: it is answered when done)."""

    accepted: bool = False
    failure: FailureInfo | None = None
    repeat: bool = False
    answer: cmd.CompleteUpdate | None = None


_STEP_RESULTS: frozenset[type[ev.Event]] = frozenset(
    {ev.ActivityTaskCompleted, ev.ActivityTaskFailed, ev.TimerElapsed, ev.ChildRunCompleted, ev.ChildRunFailed}
)
"""Messages that resolve a pending step (what ``Waits.deliver`` takes, events apart)."""

RUN_ENDED_UPDATE = "the run ended before the update finished"
TERMINATED_UPDATE = "the run was terminated before the update finished"


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
        self._block = BlockCursor()  # the block being applied
        self._patches: dict[str, bool] = {}  # each patch's answer, fixed for the rest of the run
        self.labels: dict[str, str] = dict(created.labels)
        self.labels_changed = False  # in the block being applied
        self.resumed = False  # in the block being applied: a cancel request resumed a suspended run
        # the steps cancelled in the block being applied (made by the first cancel: most blocks have none)
        self.cancellations: Cancellations | None = None
        self._main: DexFuture[Any] | None = None
        self._updates: dict[str, UpdateHandler] = {}
        self._queries: dict[str, Callable[..., Any]] = {}
        self._accepted: set[str] = set()  # every update id accepted in this generation
        self._running_updates: dict[str, str] = {}  # accepted, not answered, in order: id -> name
        self._answers: dict[str, cmd.CompleteUpdate] = {}
        self._conditions: list[tuple[Callable[[], object], DexFuture[None]]] = []
        # a continued generation knows the streams an earlier one closed (RunCreated.closed_streams)
        self._closed_streams: set[str] = set(created.closed_streams)
        self._read_only: str | None = None  # who runs now, while a query, validator or condition does
        self._previewing = False  # deciding a first block only to answer a query (preview)
        self._child_seqs: dict[str, int] = {}  # each child's ChildRunCreated, for step.cancel()
        # the id_reuse of the runs this task starts (not recorded: only the store's start reads it)
        self._start_rules: dict[str, StartRule] = {}

    # -- driving ---------------------------------------------------------------------------
    @property
    def code_ended(self) -> bool:
        """Whether none of its workflow code can run any more (every coroutine returned or
        raised): closing it then runs nothing, in whatever thread."""
        return self._stepper.ended

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
        self.is_replaying = recorded is not None or self._previewing
        if recorded is not None and any(isinstance(item.event, ev.RunCompleted) for item in recorded):
            self.completed_in_history = True
        self._block.begin(recorded, next_seq)
        self.labels_changed, self.cancellations, self.resumed = False, None, False
        if self.nondeterminism is not None:
            if recorded is None:
                failure = FailureInfo(type=NonDeterminismError.__name__, message=self.nondeterminism, terminal=True)
                # the updates it accepted are answered before its end, as on every other way out
                ending: list[cmd.Command] = [*self._unfinished_answers(RUN_ENDED_UPDATE)]
                ending.append(cmd.CompleteRun(status=RunStatus.FAILED, failure=failure))
                self._block.new.extend((next_seq + i, command) for i, command in enumerate(ending))
            return self._block.new
        # a cancel that ended the run by closing its code (recorded before cancellation reached
        # workflow code, or for code that never started) replays the same way: _closing_cancel
        closing_cancel = recorded is not None and _closing_cancel(messages, recorded)
        for seq, message in messages:
            if closing_cancel and isinstance(message, ev.RunCancelled):
                self._cancel_requested = True
                continue
            self._apply(seq, message)
        if self._cancel_requested and self.outcome is None and (self._main is None or closing_cancel):
            self._refused += self._stepper.close()
            self._complete(cmd.CompleteRun(status=RunStatus.CANCELLED))
        elif not self.suspended and self.outcome is None:  # a terminate ends it: no code runs
            self._run_until_quiet()
        if self.nondeterminism is None:
            self._block.check_all_asked()
            if self._block.mismatch is not None:
                self._mismatch(self._block.mismatch)
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

    def _run_until_quiet(self) -> None:
        """Step the code until every coroutine is blocked and no ``wait_condition`` is met."""
        while True:
            self._stepper.run_until_blocked()
            if self.finished or not self._conditions or not self._check_conditions():
                return

    def _may_issue(self) -> bool:
        # once the run has an outcome nothing more is recorded: not even by code that a close
        # runs (docs/reference/contract.md §14, nothing after the terminal event)
        return self.nondeterminism is None and not self.closed and self._driving and self.outcome is None

    def _issue(self, command: cmd.Command) -> tuple[int, ev.Event] | None:
        """Record a command: match it against history when replaying, else number it as new."""
        # _may_issue, spelled out: this runs for every command
        if self.nondeterminism is not None or self.closed or not self._driving or self.outcome is not None:
            return None
        issued = self._block.issue(command)
        if issued is None:
            self._mismatch(self._block.mismatch or "a step did not match its history")
        return issued

    def _issue_or_abort(self, command: cmd.Command) -> tuple[int, ev.Event]:
        issued = self._issue(command)
        if issued is None:
            raise _Abort()
        return issued

    # -- messages ----------------------------------------------------------------------------
    def _apply(self, seq: int, message: ev.Event) -> None:
        # most messages are steps' results: one dict lookup instead of a class check per case
        if type(message) in _STEP_RESULTS:
            self._waits.deliver(message)
            return
        match message:
            case ev.RunStarted():
                self._start()
            case ev.RunCancelled():
                self._request_cancel(message.reason)
            case ev.RunTerminated():
                self._terminate(message.reason)
            case ev.UpdateAccepted():
                self._run_update(message)
            case ev.UpdateRequested():
                raise ValueError("an update request is screened (screen_update) and applied as UpdateAccepted")
            case ev.RunSuspended() if self._cancel_requested:
                self.resumed = True  # a cancelling run is not held back: its cleanup must run
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
            args = decode_arguments(self.converter, self.created.input, signature)
            # the context is the code's alone: kept by the executor as well, the two would form a
            # cycle that outlives the run until the garbage collector finds it
            coro = self.definition.fn(WorkflowContext(self), *args)
            if not inspect.iscoroutine(coro):
                raise TypeError(f"workflow {self.workflow_name!r} must be an async def function")
        except BaseException as exc:  # noqa: BLE001 - bad input (or user code decoding it) fails the run, not the worker
            self._complete_failed(exc)
            return
        self._main = self._stepper.spawn(coro, "main")
        self._main.add_done_callback(self._on_main_done)

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
        elif isinstance(exc, CancelledError):
            self._complete_cancelled(exc)
        else:
            self._complete_failed(exc)

    def _complete_cancelled(self, exc: CancelledError) -> None:
        # the failure says why (and tells this block from one recorded before cancellation
        # reached workflow code, whose outcome had none: _closing_cancel)
        text = "the run was cancelled" + (f": {exc.reason}" if exc.reason else "")
        failure = FailureInfo(type="WorkflowCancelledError", message=text, terminal=True)
        self._complete(cmd.CompleteRun(status=RunStatus.CANCELLED, failure=failure))

    def _complete_failed(self, exc: BaseException) -> None:
        self._complete(cmd.CompleteRun(status=RunStatus.FAILED, failure=FailureInfo.from_exception(exc, terminal=True)))

    def _complete(self, command: cmd.CompleteRun) -> None:
        self._answer_running_updates(RUN_ENDED_UPDATE)
        if self._issue(command) is not None:
            self.outcome = command

    def _continue_as_new(self, payloads: tuple[Payload, ...]) -> None:
        pending = self._waits.pending_steps()
        if pending:
            self._complete_failed(
                InvalidStateError(f"continue_as_new refused while {', '.join(pending)} are pending; await them first")
            )
            return
        self._answer_running_updates("the run continued as new before the update finished")
        self.outcome = ContinueAsNewRequest(input=payloads)

    def _answer_running_updates(self, why: str) -> None:
        """Every accepted update is answered exactly once, before the run's terminal event."""
        for command in self._unfinished_answers(why):
            self._answer(command)

    def _unfinished_answers(self, why: str) -> list[cmd.CompleteUpdate]:
        return [
            cmd.CompleteUpdate(
                update_id=update_id,
                failure=FailureInfo(type=UpdateFailedError.__name__, message=why, terminal=True),
            )
            for update_id in self._running_updates
        ]

    # -- cancellation and termination ---------------------------------------------------------
    def _request_cancel(self, reason: str) -> None:
        """docs/reference/contract.md §14: every pending step is cancelled and the main code gets
        ``CancelledError`` at its current await; cleanup then runs live. A repeated request
        changes nothing."""
        if self._cancel_requested:
            return
        self._cancel_requested = True
        if self.suspended:
            # a suspended run resumes to clean up: its code must run for the request to reach it
            self.suspended, self.resumed = False, True
        main = self._main
        waiting = None if main is None else self._stepper.waiting_on(main)
        self._cancel_pending(reason)
        if main is None or main.done():
            return  # not started: _apply_block ends it CANCELLED
        if waiting is not None and waiting.done() and isinstance(waiting.exception(), CancelledError):
            return  # it awaited one of the steps just cancelled: that raises at its await
        given = self._stepper.throw(main, CancelledError(reason))
        if isinstance(given, FirstFuture):  # about to resume with what first() gave: an event, maybe
            given = given.won_by
        if isinstance(given, EventWait):
            # it was about to resume with an event: the cancel comes first, and the event stays unread
            self._waits.give_back(given)

    def _cancel_pending(self, reason: str, children_reason: str | None = None) -> None:
        activities, timers, children = self._waits.cancel_all(reason)
        cancelled = self._cancelled()
        cancelled.activities += activities
        cancelled.timers += timers
        cancelled.children += [(child, children_reason or reason) for child in children]
        conditions, self._conditions = self._conditions, []
        for _predicate, future in conditions:
            future.set_exception(CancelledError(reason))

    def _cancelled(self) -> Cancellations:
        if self.cancellations is None:
            self.cancellations = Cancellations()
        return self.cancellations

    def _terminate(self, reason: str) -> None:
        """The hard stop: no more workflow code; pending steps dropped, children terminated."""
        self._cancel_pending(reason, terminated_parent(self.run_id))
        # the run's inbox goes with its end: its timers need no cancelling (as terminate() says)
        self._cancelled().timers.clear()
        self._answer_running_updates(TERMINATED_UPDATE)
        failure = FailureInfo(type="RunTerminated", message=reason or "terminated", terminal=True)
        command = cmd.CompleteRun(status=RunStatus.TERMINATED, failure=failure)
        if self._issue(command) is not None:
            self.outcome = command

    def _cancel_step(self, kind: str, key: int | str) -> bool:
        """``step.cancel()`` on a pending activity, timer or child: recorded, then each raises
        CancelledError where it is awaited; False where the code may record nothing."""
        self._check_writable("cancel a step")
        if kind == "child":
            assert isinstance(key, str)
            seq = self._child_seqs.get(key)
            if seq is None or self._issue(cmd.CancelStep(created_seq=seq)) is None:
                return False
            self._waits.cancel_child(key)
            self._cancelled().children.append((key, f"cancelled by parent run {self.run_id}"))
            return True
        assert isinstance(key, int)
        if self._issue(cmd.CancelStep(created_seq=key)) is None:
            return False
        if kind == "activity":
            self._waits.cancel_activity(key)
            self._cancelled().activities.append(key)
        else:
            self._waits.cancel_timer(key)
            self._cancelled().timers.append(key)
        return True

    # -- updates, queries, handlers ------------------------------------------------------------
    @contextmanager
    def _reading(self, who: str) -> Iterator[None]:
        """Run a query, validator or condition: any step or state change it asks for raises QueryError."""
        outer, self._read_only = self._read_only, who
        try:
            yield
        finally:
            self._read_only = outer

    def _check_writable(self, what: str) -> None:
        if self._read_only is not None:
            raise QueryError(f"{self._read_only} may not {what}: it only reads the run's state")

    def on_update(self, name: str, fn: Callable[..., Any]) -> UpdateHandler:
        name = validate_handler_name(name, "update name")
        if not callable(fn):
            raise TypeError(f"the handler of update {name!r} must be a function, got {fn!r}")
        handler = UpdateHandler(name, fn)
        self._updates[name] = handler
        return handler

    def on_query(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        name = validate_handler_name(name, "query name")
        self._queries[name] = sync_handler(fn, f"the handler of query {name!r}")
        return fn

    def on_event(self, event_id: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        event_id = validate_handler_name(event_id, "event id")
        handler = sync_handler(fn, f"the handler of event {event_id!r}")
        try:
            hint = Signature.of(handler).hint_for(0)
        except (TypeError, ValueError):
            hint = None
        # events that arrived before the handler was registered are handed to it here, in the
        # registering code's step: they are part of the run's state from then on, so code that
        # returns at once has seen them (a coroutine spawned for them would run after the return)
        self._waits.on_event(
            event_id,
            functools.partial(self._handle_event, event_id, handler, hint),
            lambda payload: handler(self.converter.decode(payload, hint)),
        )
        return fn

    def _handle_event(self, event_id: str, handler: Callable[..., Any], hint: object, payload: Payload) -> None:
        # run as a coroutine of the run, in arrival order with everything else it does
        async def call() -> None:
            handler(self.converter.decode(payload, hint))

        self._stepper.spawn(call(), f"event handler {event_id}").add_done_callback(self._on_handler_done)

    def _on_handler_done(self, future: DexFuture[Any]) -> None:
        exc = future.exception()
        if exc is not None and not isinstance(exc, _Abort) and not self.finished:
            self._complete_failed(exc)  # like an exception escaping the workflow function

    def screen_update(self, request: ev.UpdateRequested) -> UpdateVerdict:
        """Decide whether an update request is accepted, with the code blocked (between blocks):
        a repeated id, an unknown name, arguments that do not fit or a validator that raises
        refuse it; nothing of a refused request is recorded. Validators never run on replay."""
        if request.update_id in self._answers:
            return UpdateVerdict(repeat=True, answer=self._answers[request.update_id])
        if request.update_id in self._accepted:
            return UpdateVerdict(repeat=True)
        if self.finished or self.completed_in_history or self.closed:
            return UpdateVerdict(failure=_rejection(InvalidStateError("the run has ended")))
        handler = self._updates.get(request.name)
        if handler is None:
            known = ", ".join(repr(n) for n in sorted(self._updates)) or "none"
            text = f"workflow {self.workflow_name!r} has no update handler named {request.name!r} (known: {known})"
            return UpdateVerdict(failure=FailureInfo(type=UpdateRejectedError.__name__, message=text, terminal=True))
        try:
            args = self._handler_args(handler.signature, request.args, f"update {request.name!r}")
            if handler.validate is not None:
                with self._reading(f"the validator of update {request.name!r}"):
                    handler.validate(*args)
        except BaseException as exc:  # noqa: BLE001 - a refusal, however the validator says it
            return UpdateVerdict(failure=_rejection(exc))
        return UpdateVerdict(accepted=True)

    def _handler_args(self, signature: Signature, payloads: tuple[Payload, ...], what: str) -> list[Any]:
        signature.check_arity(len(payloads), what)
        return decode_arguments(self.converter, payloads, signature)

    def _run_update(self, accepted: ev.UpdateAccepted) -> None:
        update_id = accepted.update_id
        self._accepted.add(update_id)
        self._running_updates[update_id] = accepted.name
        handler = self._updates.get(accepted.name)

        async def run() -> Any:
            if handler is None:  # accepted by code that had it: this code does not
                raise LookupError(f"workflow {self.workflow_name!r} has no update handler named {accepted.name!r}")
            result = handler.fn(*self._handler_args(handler.signature, accepted.args, f"update {accepted.name!r}"))
            if inspect.iscoroutine(result):
                result = await result
            return result

        future = self._stepper.spawn(run(), f"update {accepted.name}")
        future.add_done_callback(lambda done: self._on_update_done(update_id, done))

    def _on_update_done(self, update_id: str, future: DexFuture[Any]) -> None:
        if update_id not in self._running_updates:
            return  # answered already (the run ended first)
        exc = future.exception()
        if isinstance(exc, _Abort):
            return
        if exc is None:
            try:
                payload = self.converter.encode(future.result())
            except BaseException as error:  # noqa: BLE001 - a result that cannot be sent fails the update
                exc = error
            else:
                self._answer(cmd.CompleteUpdate(update_id=update_id, result=payload))
                return
        self._answer(cmd.CompleteUpdate(update_id=update_id, failure=FailureInfo.from_exception(exc)))

    def _answer(self, command: cmd.CompleteUpdate) -> None:
        if self._issue(command) is not None:
            self._running_updates.pop(command.update_id, None)
            self._answers[command.update_id] = command

    def preview(self, now: datetime, next_seq: int) -> None:
        """Run the code of a run that no task has started yet as its first task would, until it
        blocks, so that the handlers it registers at its top are known (a query answered before
        the run's first task). What it decides is thrown away, nothing is recorded, it counts as
        replaying (``ctx.is_replaying``), and a side effect stops it: no work of the run is done."""
        if self._main is not None or self.finished or self.closed:
            return
        self._previewing = True
        self.apply_block(now, [(0, ev.RunStarted())], None, next_seq)

    def query(self, name: str, args: tuple[Payload, ...]) -> Payload:
        """Answer query ``name`` from the run's current state; records nothing. QueryError for an
        unknown name, a handler that raises, or one that asks for a step or a state change."""
        validate_handler_name(name, "query name")
        handler = self._queries.get(name)
        if handler is None:
            known = ", ".join(repr(n) for n in sorted(self._queries)) or "none"
            raise QueryError(f"workflow {self.workflow_name!r} has no query named {name!r} (known: {known})")
        try:
            signature = Signature.of(handler)
            values = self._handler_args(signature, args, f"query {name!r}")
            with self._reading(f"query {name!r}"):
                result = handler(*values)
            if inspect.iscoroutine(result):
                result.close()
                raise TypeError("a query handler must be a plain function, not async")
            return self.converter.encode(result)
        except QueryError:
            raise
        except BaseException as exc:
            failure = FailureInfo.from_exception(exc)
            raise QueryError(f"query {name!r} failed: {failure.type}: {failure.message}") from exc

    # -- published values, streams, labels, detached runs ------------------------------------------
    def publish(self, key: str, value: Any) -> None:
        self._check_writable("publish a value")
        key = validate_key(key, "published value key")
        self._issue(cmd.PublishValue(key=key, value=self.converter.encode(value)))

    def write_stream(self, key: str, value: Any) -> DexFuture[None]:
        self._check_writable("write to a stream")
        key = validate_key(key, "stream key")
        if key in self._closed_streams:
            earlier = " by an earlier generation of the run" if key in self.created.closed_streams else ""
            raise ValueError(f"stream {key!r} is closed{earlier}: nothing more can be written to it")
        self._issue(cmd.WriteStream(key=key, value=self.converter.encode(value)))
        return resolved(None, f"stream {key}")

    def closed_streams(self) -> tuple[str, ...]:
        """Every stream of the run closed so far, earlier generations' too (sorted)."""
        return tuple(sorted(self._closed_streams))

    def close_stream(self, key: str) -> None:
        self._check_writable("close a stream")
        key = validate_key(key, "stream key")
        if key in self._closed_streams:
            return
        self._closed_streams.add(key)
        self._issue(cmd.CloseStream(key=key))

    def set_labels(self, changes: Mapping[str, str | None]) -> None:
        self._check_writable("change the run's labels")
        if not isinstance(changes, Mapping):
            raise TypeError(f"set_labels takes a mapping of str to str or None, got {type(changes).__name__}")
        set_: dict[str, str] = {}
        removed: set[str] = set()
        for key, value in changes.items():
            key = validate_text(key, "labels key")
            if value is None:
                removed.add(key)
            else:
                set_[key] = validate_text(value, f"labels[{key!r}] value")
        command = cmd.ChangeLabels(set=tuple(sorted(set_.items())), removed=tuple(sorted(removed)))
        if not command.set and not command.removed:
            return
        if self._issue(command) is not None:
            for key in removed:
                self.labels.pop(key, None)
            self.labels.update(set_)
            self.labels_changed = True

    def start_workflow(
        self,
        fn_or_name: Callable[..., Any] | str,
        args: tuple[Any, ...],
        *,
        instance_id: str | None,
        queue: str | None,
        concurrency_key: str | None,
        priority: int | None,
        labels: Mapping[str, str] | None,
        timeout: timedelta | float | None,
        id_reuse: object = "allow",
    ) -> str:
        self._check_writable("start a workflow")
        run_id = str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"dex-detached:{self.run_id}:{self.generation}:{self._block.peek_seq()}")
        )
        child, _definition = child_command(
            fn_or_name,
            args,
            child_run_id=run_id,
            instance_id=instance_id,
            queue=queue,
            concurrency_key=concurrency_key,
            priority=priority,
            labels=labels,
            run_priority=self.created.priority,
            converter=self.converter,
            lookup=self._workflows_lookup,
        )
        rule = start_rule(child.instance_id, id_reuse)
        command = cmd.StartDetached(
            run_id=run_id,
            workflow_name=child.workflow_name,
            input=child.input,
            queue=child.queue,
            instance_id=child.instance_id,
            priority=child.priority,
            concurrency_key=child.concurrency_key,
            labels=child.labels,
            deadline=None if timeout is None else self.now + delay_of(timeout),
        )
        issued = self._issue(command)
        if issued is None:
            return run_id
        event = issued[1]
        assert isinstance(event, ev.DetachedRunCreated)
        if not rule.plain:
            self._start_rules[event.run_id] = rule
        return event.run_id

    # -- waiting for a condition, or for the first of several steps -------------------------------------
    def wait_condition(self, predicate: Callable[[], object], timeout: timedelta | float | None) -> DexFuture[None]:
        self._check_writable("wait for a condition")
        if not callable(predicate):
            raise TypeError(f"wait_condition takes a function of no arguments, got {predicate!r}")
        with self._reading("a wait_condition predicate"):
            met = predicate()
        if met:
            return resolved(None, "condition")
        future: DexFuture[None] = DexFuture("condition")
        if timeout is not None:
            seq = self._create_timer(timeout)
            if seq is None:
                return never("condition")
            self._waits.timer(seq, "condition timeout")

            def on_timeout(fired: DexFuture[None]) -> None:
                if not future.done() and fired.exception() is None:
                    future.set_exception(WaitTimeoutError(f"the condition was not met within {timeout}"))

            self._waits.guard(seq, future, on_timeout)
        self._conditions.append((predicate, future))
        return future

    def _check_conditions(self) -> bool:
        """Resolve every condition that is met now; True if one was (its waiter is ready)."""
        met = False
        for entry in list(self._conditions):
            predicate, future = entry
            if future.done():
                self._conditions.remove(entry)
                continue
            try:
                with self._reading("a wait_condition predicate"):
                    ok = predicate()
            except BaseException as exc:  # noqa: BLE001 - raised at the await, where the code may catch it
                self._conditions.remove(entry)
                future.set_exception(exc)
                met = True
                continue
            if ok:
                self._conditions.remove(entry)
                future.set_result(None)
                met = True
        return met

    def first(
        self, awaitables: Sequence[Awaitable[Any]], timeout: timedelta | float | None
    ) -> DexFuture[tuple[int, Any]]:
        """The first of several steps to finish, as (index, result); the others stay pending. The
        losing event waits are released: they consume nothing."""
        self._check_writable("wait for steps")
        if not awaitables:
            raise TypeError("first takes at least one step")
        futures = [self._as_future(item, "first") for item in awaitables]
        result = FirstFuture("first")

        def release(winner: int | None) -> None:
            # backwards: events reserved from one buffer go back to its front in their order
            for index in range(len(futures) - 1, -1, -1):
                future = futures[index]
                if index != winner and isinstance(future, EventWait):
                    self._waits.release(future)

        def on_done(index: int, done: DexFuture[Any]) -> None:
            if result.done():
                return
            release(index)
            result.won_by = done
            exc = done.exception()
            if exc is not None:
                result.set_exception(exc)
            else:
                result.set_result((index, done.result()))

        for index, future in enumerate(futures):
            future.add_done_callback(functools.partial(on_done, index))
            if result.done():
                break  # the rest are not waited on: an event wait among them claims nothing
        if timeout is not None and not result.done():
            seq = self._create_timer(timeout)
            if seq is None:
                return never("first")
            self._waits.timer(seq, "first timeout")

            def on_timeout(fired: DexFuture[None]) -> None:
                if not result.done() and fired.exception() is None:
                    release(None)
                    result.set_exception(WaitTimeoutError(f"none of {len(futures)} steps finished within {timeout}"))

            self._waits.guard(seq, result, on_timeout)
        return result

    def _as_future(self, item: Awaitable[Any], what: str) -> DexFuture[Any]:
        if isinstance(item, DexFuture):
            return item
        if inspect.iscoroutine(item):
            return self._stepper.spawn(item, what)
        raise TypeError(f"{what} takes WorkflowContext steps or coroutines, got {item!r}")

    def check_writable(self, what: str) -> None:
        """QueryError while a query, validator or condition runs (for the context's own members)."""
        self._check_writable(what)

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
        self._check_writable("start an activity")
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
        future = self._waits.activity(issued[0], name, definition.signature.returns if definition else None)
        future.canceller = functools.partial(self._cancel_step, "activity", issued[0])
        return future

    def start_timer(self, delay: timedelta | float) -> DexFuture[None]:
        self._check_writable("start a timer")
        seq = self._create_timer(delay)
        if seq is None:
            return never("timer")
        future = self._waits.timer(seq)
        future.canceller = functools.partial(self._cancel_step, "timer", seq)
        return future

    def _create_timer(self, delay: timedelta | float) -> int | None:
        issued = self._issue(cmd.StartTimer(fire_at=self.now + delay_of(delay)))
        return None if issued is None else issued[0]

    def wait_for_event(self, event_id: str, timeout: timedelta | float | None) -> DexFuture[Any]:
        self._check_writable("wait for an event")
        validate_handler_name(event_id, "event id")
        waiter = self._waits.event(event_id)
        if timeout is not None and waiter.reserved is None:  # a buffered event needs no timeout
            seq = self._create_timer(timeout)
            if seq is None:
                return never(event_id)
            self._waits.time_out(waiter, seq, timeout)
        waiter.canceller = functools.partial(self._cancel_event_wait, waiter)
        return waiter

    def _cancel_event_wait(self, waiter: EventWait) -> bool:
        self._check_writable("cancel a step")
        self._waits.cancel_event_wait(waiter)  # nothing to record: it consumed nothing
        return True

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
        timeout: timedelta | float | None = None,
        id_reuse: object = "allow",
    ) -> DexFuture[Any]:
        self._check_writable("start a child workflow")
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
        rule = start_rule(command.instance_id, id_reuse)
        if timeout is not None:
            command = attrs.evolve(command, deadline=self.now + delay_of(timeout))
        name = command.workflow_name
        issued = self._issue(command)
        if issued is None:
            return never(name)
        seq, event = issued
        assert isinstance(event, ev.ChildRunCreated)
        if not rule.plain:
            self._start_rules[event.child_run_id] = rule
        future = self._waits.child(event.child_run_id, name, definition.signature.returns if definition else None)
        self._child_seqs[event.child_run_id] = seq
        future.canceller = functools.partial(self._cancel_step, "child", event.child_run_id)
        return future

    def start_rule_of(self, run_id: str) -> StartRule:
        """The ``id_reuse`` a child or independent run this task starts was given (plain if none)."""
        return self._start_rules.get(run_id, PLAIN)

    def pending_children(self) -> tuple[str, ...]:
        """Children started and not yet finished, in the order they were started."""
        return self._waits.pending_children()

    def unconsumed_events(self) -> tuple[ev.ExternalEventReceived, ...]:
        """External events received but not yet waited for, in arrival order per id."""
        return self._waits.unconsumed_events()

    def gather(self, awaitables: Sequence[Awaitable[Any]]) -> DexFuture[list[Any]]:
        self._check_writable("wait for steps")
        return gather(self._stepper, awaitables)

    def side_effect(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        self._check_writable("run a side effect")
        validate_name(name, "side effect name")
        if self._previewing:
            raise _Abort()  # its function is work of the run: a preview stops short of it
        try:
            hint = Signature.of(fn).returns
        except (TypeError, ValueError):  # builtins without a signature
            hint = None
        if self._block.deciding and self._may_issue():
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
        self._check_writable("take a patch")
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


class FirstFuture(DexFuture[tuple[int, Any]]):
    """What ``first`` returns; ``won_by`` is the step that finished first, so that a cancel that
    stops the code before it reads an event that step was handed can give the event back."""

    __slots__ = ("won_by",)

    def __init__(self, label: str = "") -> None:
        super().__init__(label)
        self.won_by: DexFuture[Any] | None = None


def terminated_parent(run_id: str) -> str:
    """The reason a terminated run's children are terminated with."""
    return f"parent run {run_id} was terminated"


def _closing_cancel(messages: Sequence[tuple[int, ev.Event]], recorded: Sequence[ev.HistoryEvent]) -> bool:
    """A replayed block in which a cancel request ended the run by closing its code: how a cancel
    was recorded before it reached workflow code (and still is for code that never started).
    Its CANCELLED outcome has no failure; one that ``CancelledError`` ended names the request."""
    if not recorded or not any(isinstance(message, ev.RunCancelled) for _seq, message in messages):
        return False
    last = recorded[-1].event
    return isinstance(last, ev.RunCompleted) and last.status is RunStatus.CANCELLED and last.failure is None


def _rejection(exc: BaseException) -> FailureInfo:
    return FailureInfo.from_exception(exc, terminal=True)
