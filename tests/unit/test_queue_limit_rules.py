"""The rules of dex/domain/queue_limits.py that PostgreSQL's shares and reservations follow
(the contract tests check the adapters against them; these check the rules themselves): how a
queue's slots are grouped, what a share's stamps say, what a change of the count keeps, when
starts may be reserved ahead, and how a key is granted on queues with different settings."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from dex.domain.queue_limits import (
    SHARE_SLOTS,
    SHARES,
    RateLimit,
    free_from,
    in_use,
    key_grants,
    key_holders,
    may_start_reserved,
    regroup,
    reservation,
    share_sizes,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


@pytest.mark.parametrize("count", [1, 20, SHARE_SLOTS - 1, SHARE_SLOTS, 2 * SHARE_SLOTS + 1, 5_000, 100_000])
def test_every_slot_is_in_one_share_of_at_least_share_slots(count: int) -> None:
    sizes = share_sizes(count)
    assert sum(sizes) == count
    assert 1 <= len(sizes) <= SHARES
    assert max(sizes) - min(sizes) <= 1
    assert len(sizes) == 1 or min(sizes) >= SHARE_SLOTS


def test_a_shares_stamps_count_until_a_period_old_and_say_when_a_slot_is_free() -> None:
    stamps = [(T0, 2), (T0 + SECOND / 2, 1)]
    assert in_use(stamps, T0 + SECOND - timedelta(microseconds=1), SECOND) == 3
    assert in_use(stamps, T0 + SECOND, SECOND) == 1  # a start exactly a period ago no longer counts
    assert free_from(stamps, 3, SECOND) == T0 + SECOND  # all used: the oldest frees first
    assert free_from(stamps, 4, SECOND) is None  # a slot has never started anything


def test_regrouping_keeps_the_newest_stamps_up_to_the_new_count() -> None:
    stamps = [(T0, 3), (T0 + SECOND, 2), (T0 + 2 * SECOND, 1)]
    shares = regroup(stamps, 4)
    assert [stamp for share in shares for stamp in share] == [(T0, 1), (T0 + SECOND, 2), (T0 + 2 * SECOND, 1)]
    assert regroup(stamps, 100) == [sorted(stamps)]  # a higher count keeps them all (one share)
    for seed in range(50):  # and fills no share above its size
        rng = random.Random(seed)
        many = [(T0 + rng.randrange(100) * SECOND, rng.randint(1, 40)) for _ in range(rng.randint(0, 30))]
        count = rng.randint(1, 600)
        shares = regroup(many, count)
        assert all(sum(n for _, n in share) <= size for share, size in zip(shares, share_sizes(count), strict=True))
        assert sum(n for share in shares for _, n in share) == min(count, sum(n for _, n in many))


def test_starts_are_reserved_only_far_below_the_limit_and_used_within_the_reservation() -> None:
    assert reservation(RateLimit(20, SECOND), 1) is None
    assert reservation(RateLimit(100_000, SECOND), 32) == (100_000 // 32, SECOND / 4)
    assert reservation(RateLimit(32 * 4 * 32 - 1, SECOND), 32) is None
    until = T0 + SECOND / 4
    assert may_start_reserved(T0, T0, until) and may_start_reserved(until, T0, until)
    assert not may_start_reserved(until + timedelta(microseconds=1), T0, until)
    assert not may_start_reserved(T0 - timedelta(microseconds=1), T0, until)


def test_a_key_is_granted_per_queue_and_a_queue_with_1_holds_it_alone() -> None:
    concurrency = {"wide": 3, "solo": 1, "other": 1}
    # nobody holds it: a queue with 1 takes one, a queue with 3 takes three
    assert key_grants(1, *key_holders({}, concurrency, "solo")) == 1
    assert key_grants(3, *key_holders({}, concurrency, "wide")) == 3
    # wide counts only its own holders, and none while a queue with 1 holds the key
    assert key_grants(3, *key_holders({"wide": 2}, concurrency, "wide")) == 1
    assert key_grants(3, *key_holders({"solo": 1}, concurrency, "wide")) == 0
    # a queue with 1 waits for every holder, on whichever queue
    assert key_grants(1, *key_holders({"wide": 1}, concurrency, "solo")) == 0
    assert key_grants(1, *key_holders({"other": 1}, concurrency, "solo")) == 0
    assert key_holders({"wide": 2, "solo": 1, "other": 1}, concurrency, "solo") == (1, 3, 1)
