"""A queue capacity beyond what dex can hold (an int4 column) is refused where it enters the web
app, naming the field and its range: the JSON API a 400, the queues page's form a 400 page;
never a ``NumericValueOutOfRange`` 500. The queue keeps its capacity, and a healthy run
completes afterwards. (The engine's calls and the stores: tests/contract/
test_queue_capacity_range.py; ``dex queues capacity``: tests/cli/test_bad_input.py; forged
cursors with ``1e400`` or a year-9999 time: test_signed_values.py.)"""

from __future__ import annotations

from typing import Any

import pytest

import dex
from dex.app.ports.store import MAX_QUEUE_CAPACITY
from tests.web.conftest import BASE
from tests.web.test_poison import healthy_run_completes

RANGE = f"from 1 to {MAX_QUEUE_CAPACITY}"
OUT_OF_RANGE = (MAX_QUEUE_CAPACITY + 1, 2**63, 10**30, 0, -1)


def capacity_of(engine: dex.Engine, name: str, kind: str = "workflow") -> int:
    return next(q.capacity for q in engine.list_queues() if (q.name, q.kind) == (name, kind))


@pytest.mark.parametrize("bad", OUT_OF_RANGE, ids=repr)
def test_the_api_answers_a_capacity_out_of_range_with_a_400_naming_it(engine: dex.Engine, http: Any, bad: int) -> None:
    http.post("/v1/runs", json={"workflow": "web-checkout", "args": [1]})  # makes the default queue
    before = capacity_of(engine, "default")
    response = http.post("/v1/queues/workflow/default/capacity", json={"capacity": bad})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "capacity" in message and (str(MAX_QUEUE_CAPACITY) if bad > 1 else "1") in message
    assert capacity_of(engine, "default") == before
    fine = http.post("/v1/queues/workflow/default/capacity", json={"capacity": MAX_QUEUE_CAPACITY})
    assert fine.status_code == 200 and fine.json()["capacity"] == MAX_QUEUE_CAPACITY
    healthy_run_completes(engine, http)


@pytest.mark.parametrize("bad", [str(MAX_QUEUE_CAPACITY + 1), "9" * 5000, "-3", "0", "1e400", "7.5", ""], ids=repr)
def test_the_queues_form_answers_a_capacity_out_of_range_with_a_400_page(
    engine: dex.Engine, http: Any, bad: str
) -> None:
    http.post("/v1/runs", json={"workflow": "web-checkout", "args": [1]})
    before = capacity_of(engine, "default")
    response = http.post("/queues/workflow/default/capacity", data={"capacity": bad}, headers={"origin": BASE})
    assert response.status_code == 400, response.text
    assert "capacity must be a whole number" in response.text and str(MAX_QUEUE_CAPACITY) in response.text
    assert capacity_of(engine, "default") == before
    healthy_run_completes(engine, http)
