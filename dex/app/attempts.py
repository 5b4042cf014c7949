"""What the activity worker keeps of attempts besides their outcomes: how long the recent
ones took (which decides what runs inline, :mod:`dex.app.inline`, and in groups,
:mod:`dex.app.step_groups`), and failures described without trusting the exception."""

from __future__ import annotations

import statistics
import threading
from collections import deque

from dex.domain.values import FailureInfo


class Durations:
    """How long the last few attempts of each activity took (seconds), for inline execution."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def record(self, name: str, seconds: float) -> None:
        with self._lock:
            seen = self._seen.get(name)
            if seen is None:
                seen = self._seen[name] = deque(maxlen=self._keep)
            seen.append(seconds)

    def typical(self, name: str) -> float | None:
        """The median of the last attempts of ``name`` (wall time, so an attempt that waited for
        the GIL counts long: the median sees past those); None before its first one ended."""
        with self._lock:
            seen = self._seen.get(name)
            return statistics.median(seen) if seen else None


def described_failure(exc: BaseException, *, terminal: bool | None = None) -> FailureInfo:
    """``FailureInfo.from_exception(exc)``, or, if describing ``exc`` raised, :func:`undescribed_failure`."""
    try:
        return FailureInfo.from_exception(exc, terminal=terminal)
    except BaseException:  # noqa: BLE001 - a hostile __str__/__repr__ must not lose the failure
        return undescribed_failure(exc, terminal=bool(terminal))


def undescribed_failure(exc: BaseException, *, terminal: bool = False) -> FailureInfo:
    """A failure for an exception that could not be described (its ``__str__`` or ``__repr__``
    raised, or describing it failed otherwise): its type name only, never ``str(exc)``."""
    try:
        name = type(exc).__name__
        if not isinstance(name, str):
            raise TypeError(name)
    except BaseException:  # noqa: BLE001 - a type whose name cannot be read: still a failure
        name = "BaseException"
    return FailureInfo(type=name, message=f"<{name}: the exception could not be described>", terminal=terminal)
