"""Properties of :class:`dex.RetryPolicy` (docs/reference/contract.md §4).

After failed attempt n (1-based), base = min(initial_delay * multiplier**(n-1), max_delay) and
the delay is uniform in [base*(1-r), base*(1+r)], capped at max_delay; once ``max_attempts``
attempts have been made there is no further delay. Everything here is pure: the random
source is passed in.
"""

from __future__ import annotations

import itertools
import math
import random
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dex
from dex.domain.retry import DEFAULT_RETRY_POLICY

# timedelta keeps microseconds: the bounds below allow for that rounding
MICROSECOND = 1e-6

seconds = st.floats(min_value=0, max_value=3600, allow_nan=False, allow_infinity=False)
policies = st.builds(
    lambda initial, multiplier, r, max_delay, max_attempts: dex.RetryPolicy(
        initial_delay=timedelta(seconds=initial),
        multiplier=multiplier,
        randomization_factor=r,
        max_delay=timedelta(seconds=max_delay),
        max_attempts=max_attempts,
    ),
    seconds,
    st.floats(min_value=1, max_value=10, allow_nan=False),
    st.floats(min_value=0, max_value=1, allow_nan=False),
    seconds,
    st.integers(min_value=1, max_value=60),
)


def spec_base(policy: dex.RetryPolicy, attempt: int) -> float:
    """The contract's base delay in seconds, computed in a way that cannot overflow."""
    initial = policy.initial_delay.total_seconds()
    cap = policy.max_delay.total_seconds()
    if initial == 0 or cap == 0:
        return 0.0
    log_base = math.log(initial) + (attempt - 1) * math.log(policy.multiplier)
    return cap if log_base >= math.log(cap) else math.exp(log_base)


def _delays_stay_in_bounds(policy: dex.RetryPolicy, seed: int) -> None:
    rng = random.Random(seed)
    cap = policy.max_delay.total_seconds()
    r = policy.randomization_factor
    for attempt in range(1, policy.max_attempts):
        delay = policy.next_delay(attempt, rng)
        assert delay is not None, f"attempt {attempt} of {policy.max_attempts} must be retried"
        base = spec_base(policy, attempt)
        assert policy.base_delay(attempt).total_seconds() == pytest.approx(base, rel=1e-9, abs=MICROSECOND)
        got = delay.total_seconds()
        low, high = base * (1 - r), min(base * (1 + r), cap)
        assert low - MICROSECOND - 1e-9 * base <= got <= high + MICROSECOND, (attempt, base, got)
        assert got <= cap + MICROSECOND
        assert got >= 0
    assert policy.next_delay(policy.max_attempts, rng) is None
    assert policy.next_delay(policy.max_attempts + 1, rng) is None


@settings(max_examples=300, deadline=None)
@given(policies, st.integers(0, 2**32))
def test_delays_lie_within_the_randomised_band_capped_at_max_delay(policy: dex.RetryPolicy, seed: int) -> None:
    _delays_stay_in_bounds(policy, seed)


@pytest.mark.slow
@settings(max_examples=5000, deadline=None)
@given(policies, st.integers(0, 2**32))
def test_delays_lie_within_the_randomised_band_capped_at_max_delay_many(policy: dex.RetryPolicy, seed: int) -> None:
    _delays_stay_in_bounds(policy, seed)


@settings(max_examples=200, deadline=None)
@given(policies, st.integers(0, 2**32))
def test_without_randomisation_the_delay_is_the_base(policy: dex.RetryPolicy, seed: int) -> None:
    exact = dex.RetryPolicy(
        initial_delay=policy.initial_delay,
        multiplier=policy.multiplier,
        randomization_factor=0.0,
        max_delay=policy.max_delay,
        max_attempts=policy.max_attempts,
    )
    rng = random.Random(seed)
    for attempt in range(1, exact.max_attempts):
        delay = exact.next_delay(attempt, rng)
        assert delay is not None
        assert delay.total_seconds() == pytest.approx(spec_base(exact, attempt), rel=1e-9, abs=MICROSECOND)


@settings(max_examples=200, deadline=None)
@given(policies)
def test_base_delay_grows_monotonically_up_to_max_delay(policy: dex.RetryPolicy) -> None:
    bases = [policy.base_delay(n) for n in range(1, 80)]
    assert all(a <= b for a, b in itertools.pairwise(bases))
    assert all(b <= policy.max_delay for b in bases)
    assert bases[0] == min(policy.initial_delay, policy.max_delay)


@given(policies, st.integers(0, 2**32))
def test_the_same_seed_gives_the_same_delays(policy: dex.RetryPolicy, seed: int) -> None:
    attempts = range(1, policy.max_attempts + 2)
    first = [policy.next_delay(n, random.Random(seed)) for n in attempts]
    rng_a, rng_b = random.Random(seed), random.Random(seed)
    assert [policy.next_delay(n, rng_a) for n in attempts] == [policy.next_delay(n, rng_b) for n in attempts]
    assert first == [policy.next_delay(n, random.Random(seed)) for n in attempts]


@given(policies.filter(lambda p: p.randomization_factor > 0.1 and p.initial_delay >= timedelta(seconds=1)))
def test_different_seeds_spread_the_delays(policy: dex.RetryPolicy) -> None:
    # the randomisation is real: with a wide band, 20 seeds do not all land on one value
    if policy.max_attempts == 1 or policy.base_delay(1) * (1 - policy.randomization_factor) >= policy.max_delay:
        return  # no retry at all, or the whole band is above the cap
    delays = {policy.next_delay(1, random.Random(seed)) for seed in range(20)}
    assert len(delays) > 1


@given(st.integers(1, 100), seconds, st.integers(0, 2**32))
def test_max_attempts_one_means_no_retry(attempt: int, initial: float, seed: int) -> None:
    policy = dex.RetryPolicy(initial_delay=timedelta(seconds=initial), max_attempts=1)
    assert policy.next_delay(attempt, random.Random(seed)) is None


@given(policies, st.integers(0, 2**32))
def test_next_delay_is_none_exactly_once_attempts_are_exhausted(policy: dex.RetryPolicy, seed: int) -> None:
    rng = random.Random(seed)
    outcomes = [policy.next_delay(n, rng) is None for n in range(1, policy.max_attempts + 5)]
    assert outcomes == [n >= policy.max_attempts for n in range(1, policy.max_attempts + 5)]


def test_the_defaults_are_the_spec_defaults() -> None:
    policy = dex.RetryPolicy()
    assert policy == DEFAULT_RETRY_POLICY
    assert policy.initial_delay == timedelta(seconds=5)
    assert policy.multiplier == 1.5
    assert policy.randomization_factor == 0.3
    assert policy.max_delay == timedelta(minutes=30)
    assert policy.max_attempts == 6
    # after attempt 3: base = 5 * 1.5**2 = 11.25 s, delay within 11.25 * [0.7, 1.3]
    delay = policy.next_delay(3, random.Random(1))
    assert delay is not None and timedelta(seconds=7.875) <= delay <= timedelta(seconds=14.625)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -3},
        {"multiplier": 0.5},
        {"multiplier": -1.0},
        {"randomization_factor": -0.1},
        {"randomization_factor": 1.5},
        {"initial_delay": timedelta(seconds=-1)},
        {"max_delay": timedelta(seconds=-1)},
        {"initial_delay": -2},
    ],
    ids=lambda kwargs: ",".join(f"{k}={v}" for k, v in kwargs.items()),
)
def test_invalid_policies_raise_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dex.RetryPolicy(**kwargs)  # type: ignore[arg-type]


@given(
    st.one_of(
        st.builds(dict, max_attempts=st.integers(max_value=0)),
        st.builds(dict, multiplier=st.floats(max_value=1, exclude_max=True, allow_nan=False)),
        st.builds(
            dict,
            randomization_factor=st.one_of(
                st.floats(max_value=0, exclude_max=True, allow_nan=False),
                st.floats(min_value=1, exclude_min=True, allow_nan=False),
            ),
        ),
        # (a negative delay of less than a microsecond rounds to zero, which is valid)
        st.builds(dict, initial_delay=st.floats(max_value=-1e-5, min_value=-1e6)),
        st.builds(dict, max_delay=st.floats(max_value=-1e-5, min_value=-1e6)),
    )
)
def test_any_out_of_range_setting_raises_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dex.RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_attempts_are_one_based() -> None:
    with pytest.raises(ValueError):
        dex.RetryPolicy().base_delay(0)


def test_a_nan_multiplier_is_refused() -> None:
    with pytest.raises(ValueError):
        dex.RetryPolicy(multiplier=float("nan"))
