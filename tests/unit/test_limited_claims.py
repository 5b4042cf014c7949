"""How the PostgreSQL adapter's claims treat its rate-limited part (dex/adapters/postgres/rate_limits.py),
without a database: which kinds of queue have limits is read at most once a ``ttl`` and kept
when a read fails, and a failing limited claim never strands the tasks the plain claim took."""

from __future__ import annotations

import psycopg
import pytest

from dex.adapters.postgres.rate_limits import LimitedQueues, then_limited


def test_the_limited_kinds_are_read_once_a_ttl_and_kept_when_a_read_fails() -> None:
    answers: list[object] = [frozenset({"activity"}), ConnectionError("down"), frozenset()]
    reads: list[None] = []

    def read() -> frozenset[str]:
        reads.append(None)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    limited = LimitedQueues(read, ttl=3600)
    assert limited.any_of("activity") and not limited.any_of("workflow")
    assert len(reads) == 1  # within the ttl: no second read
    limited.invalidate()
    assert limited.any_of("activity")  # the read failed: what was known stands
    limited.invalidate()
    assert not limited.any_of("activity")
    assert len(reads) == 3


def test_a_failing_limited_claim_returns_the_plain_claims_tasks() -> None:
    def fails() -> list[str]:
        raise psycopg.OperationalError("connection lost")

    assert then_limited(["t1", "t2"], fails) == ["t1", "t2"]
    assert then_limited(["t1"], lambda: ["t9"]) == ["t1", "t9"]
    with pytest.raises(psycopg.OperationalError):
        then_limited([], fails)  # nothing would be stranded: the fault is the caller's
