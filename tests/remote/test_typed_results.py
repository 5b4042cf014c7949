"""Typed values and workers in other languages, on every adapter (docs/reference/contract.md §13, §15):
the worker reads and writes plain JSON, and the workflow gets typed values from its hints (a
Python declaration of the remote activity, never registered, gives them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

import dex
from dex.remote import ActivityTaskService


@dataclasses.dataclass(frozen=True)
class Quote:
    price: Decimal
    valid_until: datetime
    tags: frozenset[str] = frozenset()


@dex.activity(name="quote-price")
def quote_price(sku: str, when: datetime) -> Quote:  # declared for its types; a remote worker runs it
    raise NotImplementedError


@dex.workflow
async def quotes(ctx: dex.WorkflowContext, sku: str, when: datetime) -> Quote:
    return await ctx.activity(quote_price, sku, when)  # type: ignore[no-any-return]


WHEN = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


@pytest.fixture
def typed_engine(store_factory: Callable[[], Any]) -> Iterator[dex.Engine]:
    engine = dex.Engine(store_factory(), workflows=[quotes], poll_interval=0.02)
    with engine:
        yield engine


def test_a_remote_worker_sees_json_and_the_workflow_gets_typed_values(typed_engine: dex.Engine) -> None:
    service = ActivityTaskService(typed_engine, poll_interval=0.5)
    run_id = typed_engine.start_workflow(quotes, "sku-1", WHEN)
    (task,) = service.poll("w1", ["quote-price"], 1, 10)
    assert task.args == ("sku-1", "2026-12-01T09:30:00+00:00")  # what a Node or Go worker reads
    # a worker in another language writes ISO text with a Z, and a set as any list
    service.complete(
        task.task_id, task.lease_version, {"price": "12.50", "valid_until": "2026-12-02T00:00:00Z", "tags": ["b", "a"]}
    )
    assert typed_engine.wait(run_id, timeout=10) == Quote(
        price=Decimal("12.50"), valid_until=datetime(2026, 12, 2, tzinfo=UTC), tags=frozenset({"a", "b"})
    )


def test_a_remote_result_that_does_not_fit_the_hint_fails_that_run_readably(typed_engine: dex.Engine) -> None:
    service = ActivityTaskService(typed_engine, poll_interval=0.5)
    run_id = typed_engine.start_workflow(quotes, "sku-2", WHEN)
    (task,) = service.poll("w1", ["quote-price"], 1, 10)
    service.complete(task.task_id, task.lease_version, {"price": "twelve", "valid_until": "tomorrow"})
    with pytest.raises(dex.WorkflowFailedError) as raised:
        typed_engine.wait(run_id, timeout=10)
    message = str(raised.value)
    assert "cannot decode the payload as Quote" in message and "$.price" in message and "$.valid_until" in message
    healthy = typed_engine.start_workflow(quotes, "sku-3", WHEN)  # the engine goes on
    (task,) = service.poll("w1", ["quote-price"], 1, 10)
    service.complete(task.task_id, task.lease_version, {"price": "1", "valid_until": "2026-12-02T00:00:00+00:00"})
    assert typed_engine.wait(healthy, timeout=10).price == Decimal(1)
