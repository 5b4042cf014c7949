"""A store that fails on purpose: wraps any adapter and makes a seeded share of its port calls fail.

:class:`FaultyStore` stands in front of a real store (in-memory or PostgreSQL) and, while
``enabled``, draws for every port call whether it goes through, and how it fails otherwise:

- ``before``: ``ConnectionError`` before the call reaches the store (nothing happened);
- ``after``: the call is made, then ``ConnectionError`` (it happened, but the acknowledgement
  was lost: a commit whose answer never came);
- ``timeout``: ``TimeoutError`` before the call (a pool or statement timeout);
- ``delay``: the call is made after a short sleep (a slow database).

The clock and ``close`` are never faulted: they are not calls to the database. The draw is
seeded and made under a lock, so a test picks its fault mix; which call of which thread gets
which fault still depends on the threads' timing (this is a tool for threaded tests; the
deterministic simulator has its own injection, ``store-errors``).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from dex.app.ports.store import Clock, Store

KINDS = ("before", "after", "timeout", "delay")
_NOT_FAULTED = frozenset({"clock", "close"})


class FaultyStore:
    """Any :class:`~dex.app.ports.store.Store`, with a share ``rate`` of its port calls failing while
    ``enabled`` (see the module docstring); ``weights`` sets the mix of the fault kinds."""

    def __init__(
        self,
        store: Store,
        *,
        rate: float = 0.3,
        seed: int = 0,
        weights: dict[str, float] | None = None,
        delay: float = 0.005,
    ) -> None:
        self.store = store
        self.rate = rate
        self.enabled = False
        self.delay = delay
        weights = weights or {"before": 0.5, "after": 0.3, "timeout": 0.1, "delay": 0.1}
        self._kinds = [k for k in KINDS if weights.get(k)]
        self._weights = [weights[k] for k in self._kinds]
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.injected: Counter[str] = Counter()  # (kind) -> how many so far
        self.calls: Counter[str] = Counter()  # (method) -> how many faulted

    @property
    def clock(self) -> Clock:
        return self.store.clock

    def close(self) -> None:
        self.store.close()

    def _draw(self) -> str | None:
        if not self.enabled:
            return None
        with self._lock:
            if self._rng.random() >= self.rate:
                return None
            return self._rng.choices(self._kinds, self._weights)[0]

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.store, name)
        if name.startswith("_") or name in _NOT_FAULTED or not callable(target):
            return target
        return self._faulty(name, target)

    def _faulty(self, name: str, target: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(target)
        def call(*args: Any, **kwargs: Any) -> Any:
            kind = self._draw()
            if kind is None:
                return target(*args, **kwargs)
            with self._lock:
                self.injected[kind] += 1
                self.calls[name] += 1
            if kind == "before":
                raise ConnectionError(f"injected fault: connection lost during {name}")
            if kind == "timeout":
                raise TimeoutError(f"injected fault: {name} timed out")
            if kind == "delay":
                time.sleep(self.delay)
                return target(*args, **kwargs)
            target(*args, **kwargs)
            raise ConnectionError(f"injected fault: connection lost after {name} (its effect stays)")

        return call
