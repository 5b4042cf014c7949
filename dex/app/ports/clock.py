"""Clocks: the system clock, and a virtual clock that tests move by hand."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class VirtualClock:
    """A clock that stands still until ``advance`` moves it; ``Engine.drain`` jumps it to timers."""

    def __init__(self, start: datetime | None = None) -> None:
        if start is None:
            start = datetime(2024, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("VirtualClock needs an aware datetime (e.g. tzinfo=datetime.UTC)")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move the clock forward by ``delta`` (a timedelta or seconds) and return the new time."""
        if not isinstance(delta, timedelta):
            delta = timedelta(seconds=delta)
        if delta < timedelta(0):
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._now += delta
            return self._now

    def advance_to(self, moment: datetime) -> datetime:
        """Move the clock forward to ``moment`` (no-op if it is already past)."""
        with self._lock:
            if moment > self._now:
                self._now = moment
            return self._now
