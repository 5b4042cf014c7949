"""``POST /v1/runs`` with ``id_reuse`` and debounce (docs/reference/contract.md §15): the API starts as
``start_workflow`` does, and refuses with a 400 what the document rules out (a field of the
wrong kind, a rule without the instance id it needs), nothing made."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.testing import VirtualClock


def _start(http: Any, **body: Any) -> Any:
    return http.post("/v1/runs", json={"workflow": "web-checkout", "args": [5], **body})


def test_never_answers_with_the_ended_run(http: Any, engine: dex.Engine) -> None:
    first = _start(http, instance_id="pay-1", id_reuse="never")
    assert first.status_code == 201
    engine.drain()
    assert engine.get_run(first.json()["run_id"]).status is dex.RunStatus.COMPLETED
    again = _start(http, instance_id="pay-1", id_reuse="never", args=[9])
    assert again.status_code == 201 and again.json()["run_id"] == first.json()["run_id"]
    allowed = _start(http, instance_id="pay-1", id_reuse="allow")
    assert allowed.json()["run_id"] != first.json()["run_id"]
    assert len(engine.list_runs(instance_id="pay-1")) == 2


def test_debounced_starts_over_http(http: Any, engine: dex.Engine, clock: VirtualClock) -> None:
    first = _start(http, instance_id="search", debounce_seconds=10, args=[1])
    second = _start(http, instance_id="search", debounce_seconds=10, debounce_max_seconds=60, args=[2])
    run_id = first.json()["run_id"]
    assert second.json()["run_id"] == run_id
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.CREATED
    engine.drain()
    assert engine.wait(run_id) == {"receipt": "charged 2", "amount": 2}


@pytest.mark.parametrize(
    "body",
    [
        {"instance_id": "k", "id_reuse": "sometimes"},
        {"instance_id": "k", "id_reuse": 1},
        {"instance_id": "k", "id_reuse": "never\x00"},
        {"instance_id": "k", "debounce_seconds": -1},
        {"instance_id": "k", "debounce_seconds": "5"},
        {"instance_id": "k", "debounce_seconds": 1e300},
        {"instance_id": "k", "debounce_seconds": True},
        {"instance_id": "k\ud800", "id_reuse": "never"},
        {"id_reuse": "never"},
        {"debounce_seconds": 5},
        {"instance_id": "k", "debounce_max_seconds": 5},
    ],
)
def test_what_the_document_rules_out_is_a_400(http: Any, engine: dex.Engine, body: dict[str, Any]) -> None:
    refused = http.post(
        "/v1/runs",
        content=json.dumps({"workflow": "web-checkout", "args": [5], **body}).encode("utf-8", "surrogatepass"),
        headers={"content-type": "application/json"},
    )
    assert refused.status_code == 400, refused.text
    assert engine.list_runs() == []
    assert _start(http, instance_id="k", id_reuse="never").status_code == 201


def test_a_cap_shorter_than_the_debounce_starts_the_run_at_the_cap(
    http: Any, engine: dex.Engine, clock: VirtualClock
) -> None:
    t0 = clock.now()
    started = _start(http, instance_id="k", debounce_seconds=9, debounce_max_seconds=5)
    assert started.status_code == 201
    engine.drain()
    assert engine.get_run(started.json()["run_id"]).started_at == t0 + timedelta(seconds=5)
