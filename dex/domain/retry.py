"""Retry policy: how long to wait after a failed activity attempt, and whether to try again.

The delay is a pure function of the policy, the attempt number and a random source that the
caller injects, so tests and the simulator can reproduce every schedule.
"""

from __future__ import annotations

import math
import random
from datetime import timedelta

import attrs


def _positive_delay(instance: object, attribute: attrs.Attribute[timedelta], value: timedelta) -> None:
    if not isinstance(value, timedelta) or value < timedelta(0):
        raise ValueError(f"RetryPolicy.{attribute.name} must be a non-negative timedelta, got {value!r}")


def _to_timedelta(value: timedelta | float) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise TypeError(f"a delay is a timedelta or a number of seconds, got {value!r}")


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """When and how often a failed activity is tried again (docs/reference/contract.md §4)."""

    initial_delay: timedelta = attrs.field(
        default=timedelta(seconds=5), converter=_to_timedelta, validator=_positive_delay
    )
    multiplier: float = 1.5
    randomization_factor: float = 0.3
    max_delay: timedelta = attrs.field(
        default=timedelta(minutes=30), converter=_to_timedelta, validator=_positive_delay
    )
    max_attempts: int = 6

    def __attrs_post_init__(self) -> None:
        if not math.isfinite(self.multiplier) or not math.isfinite(self.randomization_factor):
            raise ValueError(
                f"RetryPolicy.multiplier and randomization_factor must be finite numbers, got "
                f"{self.multiplier!r} and {self.randomization_factor!r}"
            )
        if self.multiplier < 1:
            raise ValueError(f"RetryPolicy.multiplier must be >= 1, got {self.multiplier!r}")
        if not 0 <= self.randomization_factor <= 1:
            raise ValueError(f"RetryPolicy.randomization_factor must be in [0, 1], got {self.randomization_factor!r}")
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts!r}")

    def base_delay(self, attempt: int) -> timedelta:
        """The delay before randomisation after failed attempt ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, got {attempt}")
        max_seconds = self.max_delay.total_seconds()
        try:
            seconds = self.initial_delay.total_seconds() * self.multiplier ** (attempt - 1)
        except OverflowError:
            seconds = max_seconds
        return timedelta(seconds=min(seconds, max_seconds))

    def next_delay(self, attempt: int, rng: random.Random) -> timedelta | None:
        """The delay after failed attempt ``attempt``, or None when no attempt is left."""
        if attempt >= self.max_attempts:
            return None
        base = self.base_delay(attempt).total_seconds()
        r = self.randomization_factor
        seconds = rng.uniform(base * (1 - r), base * (1 + r))
        return timedelta(seconds=min(seconds, self.max_delay.total_seconds()))


DEFAULT_RETRY_POLICY = RetryPolicy()
