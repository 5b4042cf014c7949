"""How the PostgreSQL adapter knows which claim to send (dex/adapters/postgres/rate_limits.py),
without a database: which queues have rate limits is read at most once a ``ttl`` and kept when a
read fails; a claim takes reserved starts only when every limited queue of its kind has enough,
within the reservation and under the limit it was made for, and gives back what it left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dex.adapters.postgres.rate_limits import RESERVE_AHEAD, Limited, LimitedQueues, Reservations, Reserved
from dex.domain.queue_limits import RateLimit

SECOND = timedelta(seconds=1)


def test_the_limited_kinds_are_read_once_a_ttl_and_kept_when_a_read_fails() -> None:
    answers: list[object] = [{"activity": {"api": RateLimit(5, SECOND)}}, ConnectionError("down"), {}]
    reads: list[None] = []

    def read() -> Limited:
        reads.append(None)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    limited = LimitedQueues(read, ttl=3600)
    assert limited.of_kind("activity") and not limited.of_kind("workflow")
    assert len(reads) == 1  # within the ttl: no second read
    limited.invalidate()
    assert limited.of_kind("activity")  # the read failed: what was known stands
    limited.invalidate()
    assert not limited.of_kind("activity")
    assert len(reads) == 3


T0 = datetime(2026, 1, 1, tzinfo=UTC)
HIGH = RateLimit(100_000, SECOND)


def test_a_claim_takes_reserved_starts_only_when_every_limited_queue_has_enough() -> None:
    reservations = Reservations()
    limited = {"api": HIGH, "mail": HIGH}
    api = Reserved(HIGH, 40, T0, T0 + SECOND / 4)
    reservations.hold("activity", "api", api, T0)
    assert reservations.take("activity", limited, 32, T0) is None  # "mail" has none
    assert api.take(40, HIGH, T0)  # and "api" was given back whole
    api.give_back(40)
    reservations.hold("activity", "mail", Reserved(HIGH, 32, T0, T0 + SECOND / 4), T0)
    taken = reservations.take("activity", limited, 32, T0)
    assert taken is not None and set(taken) == {"api", "mail"}
    assert reservations.take("activity", limited, 32, T0) is None  # "api" has 8 left, "mail" none
    taken["mail"].give_back(32)  # the claim started nothing of "mail"
    assert reservations.take("activity", {"mail": HIGH}, 32, T0) is not None


def test_reserved_starts_are_used_only_within_the_reservation_and_under_its_limit() -> None:
    reservations = Reservations()
    reservations.hold("workflow", "q", Reserved(HIGH, 1000, T0, T0 + SECOND / 4), T0)
    assert reservations.take("workflow", {"q": HIGH}, 1, T0 - timedelta(microseconds=1)) is None
    assert reservations.take("workflow", {"q": HIGH}, 1, T0 + SECOND / 4 + timedelta(microseconds=1)) is None
    assert reservations.take("workflow", {"q": RateLimit(50_000, SECOND)}, 1, T0) is None  # the limit changed
    assert reservations.take("workflow", {"q": HIGH}, 1, T0 + SECOND / 4) is not None


def test_reservations_are_wanted_when_every_limit_is_far_above_the_batch_and_running_low() -> None:
    reservations = Reservations()
    assert reservations.wanted("workflow", {"q": HIGH, "low": RateLimit(20, SECOND)}, 32, T0) == {}
    assert reservations.wanted("workflow", {"q": HIGH}, 32, T0) == {"q": (100_000 // 32, SECOND / 4)}
    # another thread that cannot be served reserves too
    assert reservations.wanted("workflow", {"q": HIGH}, 32, T0) == {"q": (100_000 // 32, SECOND / 4)}
    reservations.hold("workflow", "q", Reserved(HIGH, RESERVE_AHEAD * 32, T0, T0 + SECOND / 4), T0)
    assert reservations.wanted("workflow", {"q": HIGH}, 32, T0) == {}  # enough held for the next claims
    assert reservations.take("workflow", {"q": HIGH}, 32, T0) is not None
    assert reservations.wanted("workflow", {"q": HIGH}, 32, T0) == {"q": (100_000 // 32, SECOND / 4)}  # low
    assert reservations.wanted("workflow", {"q": HIGH}, 32, T0) == {}  # one thread reserves ahead at a time
    reservations.hold("workflow", "q", None, T0)  # that reservation found no free slot
    assert reservations.wanted("workflow", {"q": HIGH}, 32, T0) == {"q": (100_000 // 32, SECOND / 4)}


def test_reservations_made_at_once_are_all_used_and_the_spent_ones_let_go() -> None:
    reservations = Reservations()
    first, second = Reserved(HIGH, 32, T0, T0 + SECOND / 4), Reserved(HIGH, 32, T0, T0 + SECOND / 2)
    reservations.hold("workflow", "q", first, T0)
    reservations.hold("workflow", "q", second, T0)  # two threads found the queue short at once
    assert reservations.take("workflow", {"q": HIGH}, 32, T0) == {"q": first}
    assert reservations.take("workflow", {"q": HIGH}, 32, T0) == {"q": second}
    assert reservations.take("workflow", {"q": HIGH}, 1, T0) is None
    second.give_back(32)
    later = T0 + SECOND / 3  # past the first's reach: a new one lets it go, the second is kept
    reservations.hold("workflow", "q", Reserved(HIGH, 1, later, later + SECOND / 4), later)
    assert reservations.take("workflow", {"q": HIGH}, 32, later) == {"q": second}


def test_a_queue_is_busy_until_the_reach_of_its_last_whole_reservation() -> None:
    reservations = Reservations()
    reservations.hold("activity", "api", Reserved(HIGH, 32, T0, T0 + SECOND / 4), T0)  # a batch's worth
    assert not reservations.busy("activity", "api", T0)
    reservations.hold("activity", "api", Reserved(HIGH, 3125, T0, T0 + SECOND / 4), T0, busy=True)
    assert reservations.busy("activity", "api", T0 + SECOND / 4)
    assert not reservations.busy("activity", "api", T0 + SECOND / 4 + timedelta(microseconds=1))
    assert not reservations.busy("workflow", "api", T0)
