"""How the PostgreSQL adapter knows which claim to send (dex/adapters/postgres/rate_limits.py),
without a database: which kinds of queue have rate limits is read at most once a ``ttl`` and
kept when a read fails."""

from __future__ import annotations

from datetime import timedelta

from dex.adapters.postgres.rate_limits import Limited, LimitedQueues
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
