"""How many transaction steps may hold a database session at once, and the slots given up by
attempts whose lease was lost.

A transaction step's attempt holds a slot while it runs (its own connection: :mod:`.step_sessions`
and :mod:`.async_sessions`). An attempt that runs past its ``lock_timeout`` has its session
ended by its watch (:mod:`.overruns`): the server rolls its transaction back and lets its task's
row go, so the task's lease is lost and another attempt may take the task over. The attempt's
code may still not return — a ``time.sleep``, a loop, a call that never ends: nothing can stop
a thread from outside. Its slot must not stay with it, or a few such attempts would stop every
other run's transaction steps for good. So the watch *loses* the slot when it has ended the
session (:meth:`Slot.lose`): the slot is free for the next step at once, and the attempt, still
running, is counted as holding a lost slot (:attr:`StepSlots.lost`, ``Engine.health()
.lost_step_slots``) until it returns. What it returns then is dropped (:meth:`Slot.check`):
its session is gone, and the lease with it.

A step that finds every slot taken waits for one up to the adapter's ``pool_timeout``, as a call
waits for a pooled connection; then the attempt is given back as a failure of the store's (it
runs again after a backoff, and does not count).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from dex.adapters.postgres.connection import DatabaseConnectionError


class AttemptLost(RuntimeError):
    """The attempt's lease was lost while it ran (its session ended at its ``lock_timeout``):
    what it returned is dropped."""


class Slot:
    """One attempt's slot: held, lost (freed while the attempt still runs) or ended."""

    __slots__ = ("_slots", "state")

    def __init__(self, slots: StepSlots) -> None:
        self._slots = slots
        self.state = "held"

    @property
    def lost(self) -> bool:
        return self.state == "lost"

    def lose(self) -> None:
        """Free the slot for the next step while the attempt still runs (its session was ended):
        from another thread (the watch's); nothing once the attempt has ended."""
        self._slots.lose(self)

    def check(self) -> None:
        """Raise :class:`AttemptLost` if the slot was lost: what the attempt made is dropped."""
        if self.state == "lost":
            raise AttemptLost("the attempt ran past its lock_timeout: its session was ended and its lease lost")


class StepSlots:
    """``count`` slots for transaction steps' attempts (see the module's docstring); a step
    waits up to ``wait`` seconds for one."""

    def __init__(self, count: int, wait: float) -> None:
        self.count, self._wait = count, wait
        self._free = threading.Semaphore(count)
        self._lock = threading.Lock()  # guards the slots' states and the count of lost ones
        self._lost = 0

    @property
    def lost(self) -> int:
        """Slots lost to attempts that still run (their lease was lost; they have not returned)."""
        return self._lost

    @contextmanager
    def held(self) -> Iterator[Slot]:
        """A slot for the ``with`` block (:class:`DatabaseConnectionError` when none came free
        in time); given back when the block ends, unless it was lost meanwhile."""
        if not self._free.acquire(timeout=self._wait):
            raise DatabaseConnectionError(
                f"no transaction step slot came free in {self._wait:g} s: {self.count} steps are running"
                f" ({self._lost} of them past their lock_timeout, their sessions ended); see"
                " PostgresAdapter(step_connections=...)"
            )
        slot = Slot(self)
        try:
            yield slot
        finally:
            with self._lock:
                state, slot.state = slot.state, "ended"
                if state == "lost":
                    self._lost -= 1  # the attempt returned: its slot was freed when it was lost
            if state == "held":
                self._free.release()

    def lose(self, slot: Slot) -> None:
        """:meth:`Slot.lose`."""
        with self._lock:
            if slot.state != "held":
                return
            slot.state = "lost"
            self._lost += 1
        self._free.release()
