"""The gate of the remote workers' long polls: how many are open, and how many may be.

A long poll (``/v1/activity-tasks/poll`` or gRPC ``Poll`` with ``wait_seconds`` > 0) holds
something while it waits: a coroutine over HTTP, a thread of the gRPC server. Without a bound,
a crowd of idle workers held every thread the API needed (``GET /v1/runs`` took 28 s, a
worker's ``complete`` came too late and its run failed). The remote-worker service
(:mod:`dex.remote.service`) lets a poll wait only while it holds a place of its
:class:`LongPolls`, and refuses one past the limit at once (503 with ``Retry-After``).

A service over an engine takes its gate from :meth:`dex.app.facade.engine.Engine.long_poll_gate`: the
engine's :class:`LongPollGates` adds up its gates for ``Engine.health()`` (``long_polls_open``,
``long_polls_limit``) and reports each change to the telemetry (a Prometheus gauge).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable


class LongPolls:
    """At most ``limit`` long polls open at once; :meth:`enter` takes a place, :meth:`leave`
    gives it back, and ``on_change`` (quick, never raising) hears of each. Thread-safe: HTTP's
    event loop and gRPC's threads share one gate."""

    def __init__(self, limit: int, on_change: Callable[[], None] | None = None) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"the long-poll limit must be a positive integer, got {limit!r}")
        self._limit = limit
        self._open = 0
        self._lock = threading.Lock()
        self._on_change = on_change

    @property
    def limit(self) -> int:
        """How many long polls may be open at once."""
        return self._limit

    @property
    def open(self) -> int:
        """How many long polls are open now."""
        return self._open

    def enter(self) -> bool:
        """Take a place for a long poll: False when all ``limit`` are taken."""
        with self._lock:
            if self._open >= self._limit:
                return False
            self._open += 1
        self._changed()
        return True

    def leave(self) -> None:
        """Give back the place :meth:`enter` took."""
        with self._lock:
            self._open -= 1
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


class LongPollGates:
    """The gates of the remote-worker services over one engine, added up; ``report(open,
    limit)`` hears the sums after each change. A gate is held weakly: a service (and its web
    app) that is gone no longer counts."""

    def __init__(self, report: Callable[[int, int], None]) -> None:
        self._gates: weakref.WeakSet[LongPolls] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._report = report

    def gate(self, limit: int) -> LongPolls:
        """A new gate of ``limit`` places, counted here."""
        gate = LongPolls(limit, on_change=self._changed)
        with self._lock:
            self._gates.add(gate)
        self._changed()
        return gate

    def figures(self) -> tuple[int, int]:
        """(open, limit): the long polls open now and the most that may be, over every gate."""
        with self._lock:
            gates = list(self._gates)
        return sum(gate.open for gate in gates), sum(gate.limit for gate in gates)

    def _changed(self) -> None:
        self._report(*self.figures())
