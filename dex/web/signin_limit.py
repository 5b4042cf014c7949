"""How many wrong tokens the sign-in form takes from one client before it stops listening.

Each client (the address the server reports; behind a proxy that is the proxy's, so the limit
then holds for all its clients together) may fail ``max_failures`` times in ``window``; after
that every sign-in of that client is a 429 with ``Retry-After`` until its oldest failure in
the window is ``window`` old, the right token included (a guesser learns nothing while held).
A successful sign-in forgets the client's failures. The API's bearer token is not limited
here: a wrong one costs a 401 and no state, and the token is long enough not to be guessed.

The clients remembered are bounded (``max_clients``): past that, the ones whose failures have
all expired go first, then the longest remembered, so a flood of addresses costs a bounded
amount of memory (and can only make the limit forget, never refuse a client wrongly).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta


class SignInLimiter:
    """Counts failed sign-ins per client (see the module docstring); thread-safe."""

    def __init__(
        self,
        max_failures: int = 10,
        window: timedelta = timedelta(minutes=5),
        *,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 1:
            raise ValueError(f"max_failures must be a positive int, got {max_failures!r}")
        if not isinstance(window, timedelta) or window <= timedelta(0):
            raise ValueError(f"window must be a positive timedelta, got {window!r}")
        if isinstance(max_clients, bool) or not isinstance(max_clients, int) or max_clients < 1:
            raise ValueError(f"max_clients must be a positive int, got {max_clients!r}")
        self.max_failures, self.window, self.max_clients = max_failures, window.total_seconds(), max_clients
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> int | None:
        """Seconds until ``client`` may try again, or None if it may try now."""
        now = self._clock()
        with self._lock:
            failures = self._recent(client, now)
            if failures is None or len(failures) < self.max_failures:
                return None
            return max(1, math.ceil(failures[0] + self.window - now))

    def failed(self, client: str) -> None:
        """``client`` gave a wrong token."""
        now = self._clock()
        with self._lock:
            failures = self._recent(client, now)
            if failures is None:
                self._make_room(now)
                failures = self._failures[client] = deque(maxlen=self.max_failures)
            failures.append(now)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)

    def _recent(self, client: str, now: float) -> deque[float] | None:
        failures = self._failures.get(client)
        if failures is None:
            return None
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return None
        return failures

    def _make_room(self, now: float) -> None:
        if len(self._failures) < self.max_clients:
            return
        for client in [c for c, failures in self._failures.items() if failures[-1] <= now - self.window]:
            del self._failures[client]
        while len(self._failures) >= self.max_clients:
            del self._failures[next(iter(self._failures))]  # the longest remembered
