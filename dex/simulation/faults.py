"""Faults the simulator injects between two steps, and the schedule that says when.

A fault schedule is a tuple of :class:`Fault` values, each naming the step before which it
strikes, what happens, and a number that picks its target (a node, a result to re-deliver).
Together with the seed it determines a simulation completely, so its ``repr`` is what a
failure prints for the run to be replayed.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import attrs

from dex.app.ports.store import Clock

FAULT_KINDS: dict[str, str] = {
    "crash": "a node dies now: its claims lapse with their leases, its unflushed results are lost",
    "crash-after-claim": "a node claims what it can, then dies",
    "crash-after-execute": "a node runs the tasks it holds into its buffer, then dies before flushing",
    "crash-mid-flush": "a node writes the first half of its buffer, then dies",
    "restart": "a node stops gracefully (finishes what it holds, flushes, hands back leadership)",
    "duplicate": "a result already written is delivered once more",
    "write-fails": "the store refuses a node's flush (nothing written); its buffer keeps the results",
    "write-ack-lost": "a node's flush is written but fails before it is acknowledged; the results go again",
    "hang": "an activity a node holds never finishes",
    "flush-stall": "a node's writes stall for a while (a slow database) while it goes on working",
    "lease-expiry": "time jumps past every task lease while work is in flight",
    "leader-loss": "time jumps past the leader lease and another node takes over",
    "activity-fails": "the next two activity executions raise a retryable error",
    "activity-fails-terminally": "the next activity execution raises a terminal error",
    "store-errors": "a node's next 1 + pick store calls (any method) raise ConnectionError",
    "store-flaky": "of a node's next 30 store calls, about a third (drawn from the seed) raise ConnectionError",
}


def _check_kind(_instance: object, _attribute: object, value: str) -> None:
    if value not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {value!r}; known: {', '.join(FAULT_KINDS)}")


@attrs.frozen
class Fault:
    """``kind`` strikes just before step ``at_step``; ``pick`` chooses its target."""

    at_step: int
    kind: str = attrs.field(validator=_check_kind)
    pick: int = 0

    def __repr__(self) -> str:
        return f"Fault({self.at_step}, {self.kind!r}, {self.pick})"


def schedule(faults: Iterable[Fault | tuple[int, str, int]]) -> tuple[Fault, ...]:
    """The faults in the order they strike (stable for faults at the same step)."""
    items = [f if isinstance(f, Fault) else Fault(*f) for f in faults]
    return tuple(sorted(items, key=lambda f: f.at_step))


class NodeStore:
    """One node's way to the shared store, which ``store-errors`` and ``store-flaky`` faults
    make fail: a failing call (any port method) raises ConnectionError instead of reaching the
    store, as a cut connection or a database restart would."""

    def __init__(self, store: Any, rng: random.Random) -> None:
        self._store = store
        self._rng = rng
        self.failing = 0  # the next this many calls fail
        self.flaky = 0  # of the next this many calls (after those), about a third fail
        self.failed = 0

    def _fails(self) -> bool:
        if self.failing > 0:
            self.failing -= 1
            return True
        if self.flaky > 0:
            self.flaky -= 1
            return self._rng.random() < 0.3
        return False

    def heal(self) -> None:
        """No more failures (the store is back)."""
        self.failing = self.flaky = 0

    @property
    def clock(self) -> Clock:
        return self._store.clock  # type: ignore[no-any-return]

    def close(self) -> None:
        self._store.close()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if name.startswith("_") or not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._fails():
                self.failed += 1
                raise ConnectionError(f"simulated store error: connection lost during {name}")
            return target(*args, **kwargs)

        self.__dict__[name] = call  # found directly from now on
        return call
