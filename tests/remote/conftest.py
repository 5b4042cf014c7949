"""Fixtures of the remote-worker tests: stores on the real clock (leases lapse, retries come
due), on every adapter, and a started engine over one with a service."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.remote import ActivityTaskService
from tests.remote.support import WORKFLOWS


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_factory(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Makes stores over one shared state, on the system clock."""
    if request.param == "memory":
        shared = InMemoryAdapter()
        yield lambda: shared
        return
    from dex.adapters.postgres import PostgresAdapter
    from tests.pg import fresh_schema, postgres_dsn

    dsn = postgres_dsn()
    with fresh_schema(dsn) as schema:
        made: list[PostgresAdapter] = []

        def make() -> PostgresAdapter:
            made.append(PostgresAdapter(dsn, schema=schema, max_connections=4))
            return made[-1]

        yield make
        for adapter in made:
            adapter.close()


@pytest.fixture
def engine(store_factory: Callable[[], Any]) -> Iterator[dex.Engine]:
    """A started engine that registers the workflows and no activity at all."""
    engine = dex.Engine(store_factory(), workflows=WORKFLOWS, poll_interval=0.02)
    with engine:
        yield engine


@pytest.fixture
def service(engine: dex.Engine) -> ActivityTaskService:
    return ActivityTaskService(engine, poll_interval=0.5)
