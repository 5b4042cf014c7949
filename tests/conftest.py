"""Shared fixtures: adapters for the contract suite and a virtual clock; and, when pytest-xdist
runs the tests, the one embedded PostgreSQL server its workers share (tests/pg.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.testing import VirtualClock
from tests.pg import remove_shared_server, share_embedded_server

ADAPTERS = ["memory", pytest.param("postgres", marks=pytest.mark.postgres)]

_SHARED_SERVER = pytest.StashKey[Path]()


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own, which decides whether workers run the tests
def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.has_plugin("dsession"):  # this process starts the workers, runs no test
        config.stash[_SHARED_SERVER] = share_embedded_server()


def pytest_unconfigure(config: pytest.Config) -> None:
    shared = config.stash.get(_SHARED_SERVER, None)
    if shared is not None:  # the workers have exited
        remove_shared_server(shared)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture(params=ADAPTERS)
def adapter_factory(request: pytest.FixtureRequest, clock: VirtualClock) -> Iterator[Callable[[], Any]]:
    """Makes adapters over one shared store; every adapter created shares the same state."""
    if request.param == "memory":
        shared = InMemoryAdapter(clock=clock)
        yield lambda: shared
    elif request.param == "postgres":
        from dex.adapters.postgres import PostgresAdapter
        from tests.pg import fresh_schema, postgres_dsn

        dsn = postgres_dsn()
        with fresh_schema(dsn) as schema:
            adapters: list[PostgresAdapter] = []

            def make() -> PostgresAdapter:  # a new pool per call, one schema per test
                adapter = PostgresAdapter(dsn, schema=schema, clock=clock, max_connections=4)
                adapters.append(adapter)
                return adapter

            yield make
            for adapter in adapters:
                adapter.close()
    else:  # pragma: no cover
        raise AssertionError(request.param)


@pytest.fixture
def make_engine(adapter_factory: Callable[[], Any]) -> Iterator[Callable[..., dex.Engine]]:
    engines: list[dex.Engine] = []

    def make(workflows: Any = (), activities: Any = (), **kwargs: Any) -> dex.Engine:
        engine = dex.Engine(adapter_factory(), workflows=workflows, activities=activities, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop(timeout=5)
