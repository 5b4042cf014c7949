"""Fixtures for the web tests: a small set of workflows, an engine over either adapter, and an
HTTP client of the app (Starlette's test client: real HTTP semantics, no socket)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

import dex

pytest.importorskip("starlette", reason='the web extra is not installed (pip install "dex-engine[web]")')
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette announces a future move of its test client to httpx2
    from starlette.testclient import TestClient

from dex.web import create_app

BASE = "http://127.0.0.1:8765"


@dex.activity(name="web-charge")
def charge(amount: int) -> str:
    return f"charged {amount}"


@dex.activity(name="web-explode", retry=dex.RetryPolicy(max_attempts=1))
def explode(code: int) -> int:
    raise ValueError(f"boom {code}")


@dex.workflow(name="web-checkout")
async def checkout(ctx: dex.WorkflowContext, amount: int) -> dict[str, Any]:
    receipt = await ctx.activity(charge, amount)
    return {"receipt": receipt, "amount": amount}


@dex.workflow(name="web-waiting")
async def waiting(ctx: dex.WorkflowContext) -> Any:
    await ctx.sleep(timedelta(minutes=1))
    return await ctx.wait_for_event("go")


@dex.workflow(name="web-failing")
async def failing(ctx: dex.WorkflowContext) -> int:
    return await ctx.activity(explode, 7)


WORKFLOWS = [checkout, waiting, failing]
ACTIVITIES = [charge, explode]


def client(app: Any, **kwargs: Any) -> TestClient:
    return TestClient(app, base_url=BASE, **kwargs)


@pytest.fixture
def engine(make_engine: Callable[..., dex.Engine]) -> dex.Engine:
    return make_engine(WORKFLOWS, ACTIVITIES)


@pytest.fixture
def http(engine: dex.Engine) -> Iterator[TestClient]:
    with client(create_app(engine)) as c:
        yield c
