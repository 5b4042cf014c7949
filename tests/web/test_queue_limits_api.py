"""A queue's key concurrency and rate limit through ``/v1`` and on the dashboard's Queues page
(docs/reference/contract.md §15): set, listed, shown; a body the document rules out is a 400
naming the field, a value out of the engine's range a 422, and neither changes the queue."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dex
from dex.domain.queue_limits import RateLimit
from tests.web.conftest import checkout

LIMITS = "/v1/queues/activity/default"


def limits_of(engine: dex.Engine, kind: str = "activity") -> tuple[int, Any]:
    info = next(q for q in engine.list_queues() if (q.name, q.kind) == ("default", kind))
    return info.key_concurrency, info.rate_limit


def test_the_limits_are_set_listed_and_removed(engine: dex.Engine, http: Any) -> None:
    answer = http.post(LIMITS + "/rate-limit", json={"rate_limit": {"starts": 5, "period": 0.5}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["rate_limit"] == {"starts": 5, "period": 0.5}
    keys = http.post("/v1/queues/workflow/default/key-concurrency", json={"key_concurrency": 4})
    assert keys.status_code == 200 and keys.json()["key_concurrency"] == 4
    listed = {(q["kind"], q["name"]): q for q in http.get("/v1/queues").json()["queues"]}
    assert listed[("activity", "default")]["rate_limit"] == {"starts": 5, "period": 0.5}
    assert listed[("workflow", "default")]["key_concurrency"] == 4
    assert limits_of(engine) == (1, RateLimit(5, timedelta(milliseconds=500)))
    page = http.get("/queues").text
    assert "<th>Keys</th><th>Rate</th>" in page and "<td>5/500ms</td>" in page and "<td>4</td>" in page
    removed = http.post(LIMITS + "/rate-limit", json={"rate_limit": None})
    assert removed.status_code == 200 and removed.json()["rate_limit"] is None
    run_id = engine.start_workflow(checkout, 1)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED


def test_bad_bodies_change_nothing(engine: dex.Engine, http: Any) -> None:
    for path, body, code in (
        ("/key-concurrency", {}, 400),
        ("/key-concurrency", {"key_concurrency": 0}, 400),
        ("/key-concurrency", {"key_concurrency": 2**31}, 400),
        ("/key-concurrency", {"key_concurrency": "2"}, 400),
        ("/key-concurrency", {"key_concurrency": "\u0000"}, 400),
        ("/rate-limit", {}, 400),
        ("/rate-limit", {"rate_limit": {"starts": 0, "period": 1}}, 400),
        ("/rate-limit", {"rate_limit": {"starts": 3}}, 400),
        ("/rate-limit", {"rate_limit": {"starts": 3, "period": 0}}, 400),
        ("/rate-limit", {"rate_limit": {"starts": 3, "period": "1s"}}, 400),
        ("/rate-limit", {"rate_limit": [3, 1]}, 400),
        ("/rate-limit", {"rate_limit": {"starts": 1e300, "period": 1}}, 400),
        ("/rate-limit", {"rate_limit": {"starts": 3, "period": 1e300}}, 400),
    ):
        answer = http.post(LIMITS + path, json=body)
        assert answer.status_code == code, (path, body, answer.text)
    assert http.post("/v1/queues/activity/no-such/rate-limit", json={"rate_limit": None}).status_code == 404
    assert http.post("/v1/queues/activity/a%00b/key-concurrency", json={"key_concurrency": 2}).status_code == 400
    assert limits_of(engine) == (1, None)
    run_id = engine.start_workflow(checkout, 1)
    engine.drain()
    assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED
