"""What a run's workflow code waits on: the futures of its pending steps and its event inbox.

The executor (``dex.domain.replay``) registers a future here for every activity, timer, child
and event wait it issues, and hands over the messages a workflow task consumed; a message
resolves (or fails) the matching future, decoding its payload with the run's converter. An
external event nobody waits for yet is buffered, first in first out per event id.

A wait for an event takes one only once something awaits it (``await``, ``ctx.gather``,
``ctx.first``): the losers of ``first`` are released and consume nothing, and can be awaited
later (docs/reference/contract.md §14).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs

from dex.domain import events as ev
from dex.domain.coroutines import DexFuture
from dex.domain.definitions import PayloadConverter
from dex.domain.errors import ActivityFailedError, CancelledError, ChildWorkflowFailedError, WaitTimeoutError
from dex.domain.values import Payload, describe_failure


@attrs.define
class _Pending:
    future: DexFuture[Any]
    hint: object
    name: str


class EventWait(DexFuture[Any]):
    """What ``wait_for_event`` returns. An event buffered when it is made is reserved for it at
    once (so no timeout timer is needed, as always); otherwise it claims the next event to arrive
    when something first awaits it or waits on it. Released (the loser of ``first``, or
    cancelled), it gives a reserved event back to the front of the buffer."""

    __slots__ = ("claim", "claimed", "event_id", "given", "reserved", "timer_seq")

    def __init__(self, event_id: str, claim: Callable[[EventWait], None]) -> None:
        super().__init__(f"event {event_id}")
        self.event_id = event_id
        self.claim = claim
        self.claimed = False
        self.reserved: Payload | None = None
        self.given: Payload | None = None  # the event it resolved with
        self.timer_seq: int | None = None  # its timeout's timer, if it has one

    def add_done_callback(self, callback: Callable[[DexFuture[Any]], None]) -> None:
        if not self.done():
            self.claim(self)
        super().add_done_callback(callback)


class Waits:
    """The pending steps of one run's code, keyed as their results arrive."""

    def __init__(self, converter: PayloadConverter) -> None:
        self._converter = converter
        self._activities: dict[int, _Pending] = {}
        self._timers: dict[int, DexFuture[None]] = {}
        self._children: dict[str, _Pending] = {}
        self._event_buffer: dict[str, deque[Payload]] = {}
        self._event_waiters: dict[str, deque[DexFuture[Any]]] = {}
        self._event_handlers: dict[str, Callable[[Payload], None]] = {}
        # the waits holding a reserved event they have not handed over yet (never awaited): their
        # events are still unread, counted so and carried into a continued generation
        self._reserving: dict[str, list[EventWait]] = {}

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

    def event(self, event_id: str) -> EventWait:
        """A wait for the next event ``event_id``: the oldest buffered one is reserved for it now,
        else it claims the next to arrive when first awaited."""
        wait = EventWait(event_id, self._claim)
        buffered = self._event_buffer.get(event_id)
        if buffered:
            wait.claimed, wait.reserved = True, buffered.popleft()
            self._reserving.setdefault(event_id, []).append(wait)
        return wait

    def _claim(self, wait: EventWait) -> None:
        if wait.reserved is not None:
            payload, wait.reserved = wait.reserved, None
            self._reserving[wait.event_id].remove(wait)
            self._deliver_event(wait, payload)
            return
        if wait.claimed:
            return
        wait.claimed = True
        buffered = self._event_buffer.get(wait.event_id)
        if buffered:
            self._deliver_event(wait, buffered.popleft())
        else:
            self._event_waiters.setdefault(wait.event_id, deque()).append(wait)

    def release(self, wait: EventWait) -> None:
        """Let a pending wait go back to unclaimed (a loser of ``first``): a reserved event goes
        back to the front of the buffer, the next event to arrive goes to the buffer, and the
        wait claims again when awaited."""
        if wait.done() or not wait.claimed:
            return
        wait.claimed = False
        if wait.reserved is not None:
            self._event_buffer.setdefault(wait.event_id, deque()).appendleft(wait.reserved)
            wait.reserved = None
            self._reserving[wait.event_id].remove(wait)
        else:
            self._event_waiters[wait.event_id].remove(wait)

    def give_back(self, wait: EventWait) -> None:
        """The event a wait resolved with, back to the front of the buffer: the code it was for
        was cancelled before it could read it (the wait itself stays as it is)."""
        if wait.given is not None:
            self._event_buffer.setdefault(wait.event_id, deque()).appendleft(wait.given)
            wait.given = None

    def cancel_event_wait(self, wait: EventWait) -> None:
        """A wait the code cancelled: it consumed nothing, and its timeout no longer counts."""
        self.release(wait)
        if wait.timer_seq is not None:
            self._timers.pop(wait.timer_seq, None)

    def time_out(self, waiter: EventWait, timer_seq: int, timeout: timedelta | float) -> None:
        """Fail ``waiter`` with WaitTimeoutError when timer ``timer_seq`` fires first (an event
        buffered meanwhile for a wait nobody awaited yet is its answer, not a timeout)."""
        self.timer(timer_seq, "event timeout")
        waiter.timer_seq = timer_seq

        def on_timeout(fired: DexFuture[None]) -> None:
            if waiter.done() or fired.exception() is not None:
                return
            if not waiter.claimed and self._event_buffer.get(waiter.event_id):
                self._claim(waiter)
                return
            self.release(waiter)
            waiter.set_exception(WaitTimeoutError(f"event {waiter.event_id!r} did not arrive within {timeout}"))

        self.guard(timer_seq, waiter, on_timeout)

    def guard(self, timer_seq: int, guarded: DexFuture[Any], on_timeout: Callable[[DexFuture[None]], None]) -> None:
        """Call ``on_timeout`` when timer ``timer_seq`` fires; once ``guarded`` is done first, the
        timer no longer guards anything and is dropped (it must not block continue_as_new)."""
        self._timers[timer_seq].add_done_callback(on_timeout)

        def drop(_done: DexFuture[Any]) -> None:
            self._timers.pop(timer_seq, None)

        if isinstance(guarded, EventWait):
            # a subscription would claim an event for it: the wait's own callbacks must not
            DexFuture.add_done_callback(guarded, drop)
        else:
            guarded.add_done_callback(drop)

    def on_event(
        self, event_id: str, handler: Callable[[Payload], None], buffered: Callable[[Payload], None] | None = None
    ) -> None:
        """Hand every event ``event_id`` to ``handler`` from now on; those buffered already go
        first, to ``buffered`` (``handler`` without it), before this call returns."""
        self._event_handlers[event_id] = handler
        for payload in self._event_buffer.pop(event_id, ()):
            (buffered or handler)(payload)

    # -- cancelling -------------------------------------------------------------------------------
    def cancel_activity(self, seq: int) -> DexFuture[Any] | None:
        pending = self._activities.pop(seq, None)
        return None if pending is None else pending.future

    def cancel_timer(self, seq: int) -> DexFuture[None] | None:
        return self._timers.pop(seq, None)

    def cancel_child(self, child_run_id: str) -> DexFuture[Any] | None:
        pending = self._children.pop(child_run_id, None)
        return None if pending is None else pending.future

    def cancel_all(self, reason: str) -> tuple[list[int], list[int], list[str]]:
        """Cancel every pending step (a run cancel request): each raises CancelledError where it
        is awaited. Returns the activities' and timers' sequence numbers and the children's ids."""
        activities, timers, children = list(self._activities), list(self._timers), list(self._children)
        futures: list[DexFuture[Any]] = [self._activities.pop(seq).future for seq in activities]
        futures += [self._children.pop(child).future for child in children]
        for waiters in self._event_waiters.values():
            futures += waiters
            for waiter in waiters:
                if isinstance(waiter, EventWait):
                    waiter.claimed = False
        self._event_waiters.clear()
        # timers last: a timeout that guards a wait cancelled above finds it done
        futures += [self._timers.pop(seq) for seq in timers]
        for future in futures:
            future.set_exception(CancelledError(reason))
        return activities, timers, children

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
                handler = self._event_handlers.get(message.event_id)
                waiters = self._event_waiters.get(message.event_id)
                if handler is not None:
                    handler(message.payload)
                elif waiters:
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
            if isinstance(waiter, EventWait):
                waiter.given = payload
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
        """External events received and not yet read, in arrival order per id: those buffered, and
        those reserved for waits made but never awaited (each older than every buffered one)."""
        unread: dict[str, list[Payload]] = {}
        for event_id, waits in self._reserving.items():
            unread.setdefault(event_id, []).extend(w.reserved for w in waits if w.reserved is not None)
        for event_id, payloads in self._event_buffer.items():
            unread.setdefault(event_id, []).extend(payloads)
        return tuple(
            ev.ExternalEventReceived(event_id=event_id, payload=payload)
            for event_id, payloads in unread.items()
            for payload in payloads
        )
