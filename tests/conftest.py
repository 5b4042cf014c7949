"""Shared fixtures: adapters for the contract suite and a virtual clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.testing import VirtualClock

ADAPTERS = ["memory"]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture(params=ADAPTERS)
def adapter_factory(request: pytest.FixtureRequest, clock: VirtualClock) -> Iterator[Callable[[], Any]]:
    """Makes adapters over one shared store; every adapter created shares the same state."""
    if request.param == "memory":
        shared = InMemoryAdapter(clock=clock)
        yield lambda: shared
    else:  # pragma: no cover - filled in by the postgres adapter
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
