"""What a run's workflow code waits on: the futures of its pending steps and its event inbox.

The executor (``dex.domain.replay``) registers a future here for every activity, timer, child
and event wait it issues, and hands over the messages a workflow task consumed; a message
resolves (or fails) the matching future, decoding its payload with the run's converter. An
external event nobody waits for yet is buffered, first in first out per event id.
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta
from typing import Any

import attrs

from dex.domain import events as ev
from dex.domain.coroutines import DexFuture
from dex.domain.definitions import PayloadConverter
from dex.domain.errors import ActivityFailedError, ChildWorkflowFailedError, WaitTimeoutError
from dex.domain.values import Payload, describe_failure


@attrs.define
class _Pending:
    future: DexFuture[Any]
    hint: object
    name: str


class Waits:
    """The pending steps of one run's code, keyed as their results arrive."""

    def __init__(self, converter: PayloadConverter) -> None:
        self._converter = converter
        self._activities: dict[int, _Pending] = {}
        self._timers: dict[int, DexFuture[None]] = {}
        self._children: dict[str, _Pending] = {}
        self._event_buffer: dict[str, deque[Payload]] = {}
        self._event_waiters: dict[str, deque[DexFuture[Any]]] = {}

    # -- registering what the code awaits -------------------------------------------------------
    def activity(self, seq: int, name: str, hint: object) -> DexFuture[Any]:
        future: DexFuture[Any] = DexFuture(f"activity {name}")
        self._activities[seq] = _Pending(future, hint, name)
        return future

    def timer(self, seq: int, label: str = "timer") -> DexFuture[None]:
        future: DexFuture[None] = DexFuture(label)
        self._timers[seq] = future
        return future

    def child(self, child_run_id: str, name: str, hint: object) -> DexFuture[Any]:
        future: DexFuture[Any] = DexFuture(f"child {name}")
        self._children[child_run_id] = _Pending(future, hint, name)
        return future

    def buffered_event(self, event_id: str) -> DexFuture[Any] | None:
        """The oldest buffered event ``event_id``, delivered to a new future; None if none is."""
        buffered = self._event_buffer.get(event_id)
        if not buffered:
            return None
        waiter: DexFuture[Any] = DexFuture(f"event {event_id}")
        self._deliver_event(waiter, buffered.popleft())
        return waiter

    def event(self, event_id: str) -> DexFuture[Any]:
        """A future for the next event ``event_id`` to arrive."""
        waiter: DexFuture[Any] = DexFuture(f"event {event_id}")
        self._event_waiters.setdefault(event_id, deque()).append(waiter)
        return waiter

    def time_out(self, event_id: str, waiter: DexFuture[Any], timer_seq: int, timeout: timedelta | float) -> None:
        """Fail ``waiter`` with WaitTimeoutError when timer ``timer_seq`` fires first."""
        timer = self.timer(timer_seq, "event timeout")

        def on_timeout(_timer: DexFuture[None]) -> None:
            if not waiter.done():
                self._event_waiters[event_id].remove(waiter)
                waiter.set_exception(WaitTimeoutError(f"event {event_id!r} did not arrive within {timeout}"))

        def on_event(_waiter: DexFuture[Any]) -> None:
            # the timer no longer guards anything: it must not block continue_as_new
            self._timers.pop(timer_seq, None)

        timer.add_done_callback(on_timeout)
        waiter.add_done_callback(on_event)

    # -- what arrives -----------------------------------------------------------------------------
    def deliver(self, message: ev.Event) -> bool:
        """Resolve what ``message`` answers; False if it is no step's result nor an event."""
        match message:
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
            case _:
                return False
        return True

    def _resolve(self, pending: _Pending, payload: Payload) -> None:
        try:
            value = self._converter.decode(payload, pending.hint)
        except BaseException as exc:  # noqa: BLE001 - raised at the await, where the code may catch it
            pending.future.set_exception(exc)
        else:
            pending.future.set_result(value)

    def _deliver_event(self, waiter: DexFuture[Any], payload: Payload) -> None:
        try:
            value = self._converter.decode(payload)
        except BaseException as exc:  # noqa: BLE001 - raised at the await, where the code may catch it
            waiter.set_exception(exc)
        else:
            waiter.set_result(value)

    # -- what is left -------------------------------------------------------------------------------
    def pending_steps(self) -> list[str]:
        """The kinds of step still pending, counted (``["2 activities", "1 timer(s)"]``)."""
        pending = []
        if self._activities:
            pending.append(f"{len(self._activities)} activit{'y' if len(self._activities) == 1 else 'ies'}")
        if self._timers:
            pending.append(f"{len(self._timers)} timer(s)")
        if self._children:
            pending.append(f"{len(self._children)} child workflow(s)")
        return pending

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
