"""A run driven through ``decide()`` alone: no engine, no store, no threads.

:class:`PureRun` plays the store's part of docs/decisions/conversations.md by hand: it keeps
the history and the inbox, hands ``decide()`` the visible messages, appends what it returns,
runs the activity tasks it asks for by calling the registered functions, and keeps the effects
(update answers, published values, streams, cancelled steps, messages to other runs). With
``cached=True`` a second, long-lived executor decides every task too (``advance()``, as a
worker that holds the run does), and both must agree.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from dex.app.definitions.registry import ACTIVITY_ATTRIBUTE, WORKFLOW_ATTRIBUTE
from dex.domain import events as ev
from dex.domain.definitions import ActivityDefinition, WorkflowDefinition
from dex.domain.replay import WorkflowExecutor
from dex.domain.state import fold
from dex.domain.task import (
    InboxMessage,
    OutgoingMessage,
    UpdateAnswer,
    WorkflowTaskResult,
    advance,
    check_replay,
    decide,
    replay_history,
)
from dex.domain.values import FailureInfo, Payload
from dex.serialization.payloads import PayloadConverter

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONVERTER = PayloadConverter()


@attrs.define
class _Queued:
    visible_from: datetime
    message: InboxMessage


class PureRun:
    """One run of ``workflow(*args)``, started at :data:`T0`."""

    def __init__(
        self,
        workflow: Callable[..., Any],
        *args: Any,
        activities: tuple[Callable[..., Any], ...] = (),
        run_id: str = "0b9a3a52-5c7a-4d53-9d2c-3f1e9f1d7a10",
        labels: ev.Labels = (),
        cached: bool = False,
        deadline: datetime | None = None,
    ) -> None:
        self.definition: WorkflowDefinition = getattr(workflow, WORKFLOW_ATTRIBUTE)
        self.activity_definitions: dict[str, ActivityDefinition] = {
            d.name: d for d in (getattr(fn, ACTIVITY_ATTRIBUTE) for fn in activities)
        }
        self.run_id = run_id
        self.now = T0
        created = ev.RunCreated(
            workflow_name=self.definition.name,
            input=tuple(CONVERTER.encode(a) for a in args),
            queue="default",
            labels=labels,
            random_seed=7,
            deadline=deadline,
        )
        self.history: list[ev.HistoryEvent] = [ev.HistoryEvent(sequence_number=1, timestamp=T0, event=created)]
        self._next_id = 1
        self._queued: list[_Queued] = []
        self.tasks: dict[int, Any] = {}  # activity tasks to run, by created seq
        self.results: list[WorkflowTaskResult] = []
        self.answers: list[UpdateAnswer] = []
        self.published: dict[str, Any] = {}
        self.streams: dict[str, list[Any]] = {}
        self.outbox: list[OutgoingMessage] = []  # messages to other runs
        self.cancelled_activities: list[int] = []
        self.cached: WorkflowExecutor | None = None
        if cached:
            self.cached = WorkflowExecutor(
                run_id=run_id,
                definition=self.definition,
                created=created,
                converter=CONVERTER,
                activities=self.activity_definitions.get,
            )
        self._send(ev.RunStarted())

    # -- what the outside does ----------------------------------------------------------------------
    def _send(self, event: ev.Message, visible_from: datetime | None = None) -> None:
        self._queued.append(_Queued(visible_from or self.now, InboxMessage(message_id=self._next_id, event=event)))
        self._next_id += 1

    def send_event(self, event_id: str, value: Any = None) -> None:
        self._send(ev.ExternalEventReceived(event_id=event_id, payload=CONVERTER.encode(value)))

    def update(self, name: str, *args: Any, update_id: str = "u1") -> None:
        self._send(ev.UpdateRequested(update_id=update_id, name=name, args=tuple(CONVERTER.encode(a) for a in args)))

    def cancel(self, reason: str = "") -> None:
        self._send(ev.RunCancelled(reason=reason))

    def terminate(self, reason: str = "") -> None:
        self._send(ev.RunTerminated(reason=reason))

    def suspend(self) -> None:
        self._send(ev.RunSuspended())

    def resume(self) -> None:
        self._send(ev.RunResumed())

    def advance(self, delta: timedelta) -> None:
        self.now += delta

    # -- what the store and the workers do -----------------------------------------------------------
    @property
    def visible(self) -> list[InboxMessage]:
        due = sorted((q for q in self._queued if q.visible_from <= self.now), key=lambda q: q.visible_from)
        return [q.message for q in due]

    @property
    def ended(self) -> bool:
        return any(isinstance(item.event, ev.RunCompleted) for item in self.history)

    @property
    def completion(self) -> ev.RunCompleted:
        return next(item.event for item in self.history if isinstance(item.event, ev.RunCompleted))

    def step(self) -> WorkflowTaskResult:
        """One workflow task over the visible inbox; its result is applied."""
        inbox = self.visible
        result = decide(
            self.definition,
            self.run_id,
            self.history,
            inbox,
            self.now,
            CONVERTER,
            activities=self.activity_definitions.get,
        )
        if self.cached is not None and not self.cached.closed:
            cached = advance(self.cached, self.history[-1].sequence_number, inbox, self.now)
            if cached.new_history is not None or cached.completion is not None:
                self.cached.close()
            assert cached == result, f"the cached executor decided otherwise:\n{cached}\n!=\n{result}"
        self._apply(result)
        return result

    def _apply(self, result: WorkflowTaskResult) -> None:
        self.results.append(result)
        if result.new_history is not None:
            self.history = list(result.new_history)
        else:
            self.history.extend(result.new_events)
        fold(self.history)  # raises for an impossible history (nothing after the terminal event, ...)
        consumed = set(result.consumed)
        self._queued = [q for q in self._queued if q.message.message_id not in consumed]
        for task in result.activity_tasks:
            self.tasks[task.created_seq] = task
        for seq in result.cancelled_activities:
            self.tasks.pop(seq, None)
            self.cancelled_activities.append(seq)
        dropped = set(result.cancelled_timers)
        self._queued = [
            q
            for q in self._queued
            if not (isinstance(q.message.event, ev.TimerElapsed) and q.message.event.created_seq in dropped)
        ]
        for message in result.messages:
            if message.run_id == self.run_id:
                self._send(message.event, message.visible_from)
            else:
                self.outbox.append(message)
        self.answers.extend(result.update_answers)
        for key, value in result.published:
            self.published[key] = CONVERTER.decode(value)
        for item in result.stream_items:
            self.streams.setdefault(item.key, []).append(CONVERTER.decode(item.value))
        if result.completion is not None:
            self.tasks.clear()
            self._queued.clear()

    def run_activities(self) -> int:
        """Run every pending activity task once (its outcome goes to the inbox); how many ran."""
        tasks, self.tasks = self.tasks, {}
        for seq, task in sorted(tasks.items()):
            definition = self.activity_definitions[task.name]
            args = [CONVERTER.decode(p, definition.signature.hint_for(i)) for i, p in enumerate(task.input)]
            try:
                value = definition.fn(*args)
            except Exception as exc:  # noqa: BLE001 - an activity's failure is its outcome
                self._send(
                    ev.ActivityTaskFailed(created_seq=seq, failure=FailureInfo.from_exception(exc, terminal=True))
                )
            else:
                self._send(ev.ActivityTaskCompleted(created_seq=seq, result=CONVERTER.encode(value)))
        return len(tasks)

    def settle(self, limit: int = 100) -> None:
        """Workflow tasks and activities until nothing visible is left to do."""
        for _round in range(limit):
            if self.visible and not self.ended:
                self.step()
            elif not self.run_activities():
                return
        raise AssertionError("the run did not settle")

    def replays(self) -> None:
        """The history replays with the workflow's code (NonDeterminismError otherwise)."""
        check_replay(self.definition, self.run_id, self.history, CONVERTER, activities=self.activity_definitions.get)

    def executor(self) -> WorkflowExecutor:
        """A fresh executor replayed over the history (close it)."""
        return replay_history(
            self.definition, self.run_id, self.history, CONVERTER, activities=self.activity_definitions.get
        )

    def kinds(self) -> list[str]:
        return [item.kind for item in self.history]

    def events(self, kind: type) -> list[Any]:
        return [item.event for item in self.history if isinstance(item.event, kind)]

    def answer(self, update_id: str) -> UpdateAnswer:
        found = [a for a in self.answers if a.update_id == update_id]
        assert found, f"update {update_id} has no answer"
        return found[-1]

    def value(self, payload: Payload | None) -> Any:
        assert payload is not None
        return CONVERTER.decode(payload)
