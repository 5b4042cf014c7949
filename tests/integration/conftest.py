"""Fixtures for tests against a real PostgreSQL: the session's server and a schema per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dex.adapters.postgres import PostgresAdapter
from dex.testing import VirtualClock
from tests.pg import fresh_schema, postgres_dsn


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    return postgres_dsn()


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    with fresh_schema(pg_dsn) as schema:
        yield schema


@pytest.fixture
def make_adapter(pg_dsn: str, pg_schema: str, clock: VirtualClock) -> Iterator[Callable[..., PostgresAdapter]]:
    """Makes adapters on this test's schema (sharing its virtual clock unless told otherwise)."""
    adapters: list[PostgresAdapter] = []

    def make(**kwargs: Any) -> PostgresAdapter:
        kwargs.setdefault("schema", pg_schema)
        kwargs.setdefault("clock", clock)
        adapter = PostgresAdapter(pg_dsn, **kwargs)
        adapters.append(adapter)
        return adapter

    yield make
    for adapter in adapters:
        adapter.close()
