"""A body that is not a JSON object gets one answer on every route that takes a body: the runs',
the queues', the schedules' and the remote workers' activity-task routes (served by the app, and
mounted on their own): a 400 ``BadRequest`` with the same message for the same bytes, and nothing
made. A NUL or a lone surrogate inside a string is JSON: the field that holds it says whether it
may (docs/how-to/web-dashboard.md, "A body that is not a JSON object")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.remote import ActivityTaskService
from dex.remote.http_routes import activity_task_routes
from dex.web import create_app
from tests.web.conftest import ACTIVITIES, WORKFLOWS, client, waiting

# each family of routes that takes a body, as (method path, a path of it that a run fills in)
FAMILIES = {
    "runs": ["/v1/runs", "/v1/runs/{run}/cancel", "/v1/runs/{run}/suspend", "/v1/runs/{run}/events"],
    "fork": ["/v1/runs/{run}/fork"],
    "queues": ["/v1/queues/workflow/default/pause", "/v1/queues/activity/default/capacity"],
    "schedules": ["/v1/schedules/nightly/pause", "/v1/schedules/nightly/trigger"],
    "activity-tasks": ["/v1/activity-tasks/poll", "/v1/activity-tasks/1/complete", "/v1/activity-tasks/1/fail"],
}
# the bytes, and the message every route answers them with
MALFORMED = [
    (b"not json", "the body is not JSON: Expecting value: line 1 column 1 (char 0)"),
    (b'{"reason" "x"}', "the body is not JSON: Expecting ':' delimiter: line 1 column 11 (char 10)"),
    (b'{"a": NaN}', "the body is not JSON: NaN is not JSON"),
    (b'{"a": 1e999}', "the body is not JSON: the number 1e999 is out of range"),
    (b"\xed\xa0\x80", "the body is not JSON: it is not UTF-8 text (invalid continuation byte at byte 0)"),
    (b'{"a": "caf\xe9"}', "the body is not JSON: it is not UTF-8 text (invalid continuation byte at byte 10)"),
    (b"[" * 100_000, "the body is not JSON dex reads: it is nested too deeply"),
]
NOT_AN_OBJECT = [
    (b"[1, 2]", "the body must be a JSON object, got array"),
    (b'"\\u0000"', "the body must be a JSON object, got string"),
    (b"null", "the body must be a JSON object, got null"),
    (b"7", "the body must be a JSON object, got number"),
]


@pytest.fixture
def engine() -> Iterator[dex.Engine]:
    engine = dex.Engine(InMemoryAdapter(), workflows=WORKFLOWS, activities=ACTIVITIES)
    yield engine
    engine.stop(timeout=5)


@pytest.fixture
def http(engine: dex.Engine) -> Iterator[Any]:
    with client(create_app(engine)) as c:
        yield c


@pytest.fixture
def bare_routes(engine: dex.Engine) -> Iterator[Any]:
    """The activity-task routes mounted on their own, as an application other than dex web does."""
    with client(Starlette(routes=activity_task_routes(ActivityTaskService(engine)))) as c:
        yield c


def refusal(answer: Any) -> tuple[int, str, str]:
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    return answer.status_code, body["error"]["type"], body["error"]["message"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize(("raw", "message"), MALFORMED + NOT_AN_OBJECT, ids=lambda v: repr(v)[:24])
def test_a_body_that_is_not_a_json_object_is_one_400_on_every_route(
    engine: dex.Engine, http: Any, family: str, raw: bytes, message: str
) -> None:
    run_id = engine.start_workflow(waiting)
    for path in FAMILIES[family]:
        answer = http.post(path.format(run=run_id), content=raw, headers={"content-type": "application/json"})
        assert refusal(answer) == (400, "BadRequest", message), path
    # nothing was made or changed: one run, not suspended, not cancelled; no schedule
    assert [run.run_id for run in engine.list_runs()] == [run_id]
    assert engine.get_run(run_id).status is dex.RunStatus.CREATED
    assert {queue.status for queue in engine.list_queues()} <= {"ACTIVE"}


@pytest.mark.parametrize(("raw", "message"), MALFORMED + NOT_AN_OBJECT, ids=lambda v: repr(v)[:24])
def test_the_activity_task_routes_on_their_own_answer_as_the_app_does(
    bare_routes: Any, http: Any, raw: bytes, message: str
) -> None:
    for path in FAMILIES["activity-tasks"]:
        mounted = refusal(bare_routes.post(path, content=raw))
        served = refusal(http.post(path, content=raw))
        assert mounted == served == (400, "BadRequest", message), path


def test_a_missing_field_is_the_same_answer_on_the_activity_task_routes_on_their_own(
    bare_routes: Any, http: Any
) -> None:
    for path, body in (
        ("/v1/activity-tasks/poll", {"names": ["echo"]}),
        ("/v1/activity-tasks/1/complete", {"result": 1}),
        ("/v1/activity-tasks/1/fail", {"lease_version": 1, "error": {"message": "no type"}}),
    ):
        mounted, served = refusal(bare_routes.post(path, json=body)), refusal(http.post(path, json=body))
        assert mounted == served and mounted[:2] == (400, "BadRequest") and mounted[2].endswith(" is required")


def test_an_empty_body_reads_as_the_empty_object(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(waiting)
    assert http.post(f"/v1/runs/{run_id}/cancel", content=b"").status_code == 202
    status, kind, message = refusal(http.post("/v1/runs", content=b""))
    assert (status, kind, message) == (400, "BadRequest", "workflow is required")


# a NUL or a lone surrogate (escaped, so the body is JSON) in a field of text: a 400 naming it
TEXT_FIELDS = [
    ("/v1/runs", {"workflow": "web-checkout", "args": [1], "instance_id": "a\\u0000b"}, "instance_id"),
    ("/v1/runs", {"workflow": "web-checkout", "args": [1], "labels": {"k": "\\ud800"}}, "labels.'k'"),
    ("/v1/runs/{run}/cancel", {"reason": "\\u0000"}, "reason"),
    ("/v1/runs/{run}/events", {"event_id": "go\\udfff"}, "event_id"),
    ("/v1/runs/{run}/fork", {"queue": "q\\u0000"}, "queue"),
    ("/v1/queues/workflow/default/capacity", {"capacity": "\\u0000"}, "capacity"),
    ("/v1/schedules/nightly/pause", {"note": "a\\ud800"}, "note"),
    ("/v1/activity-tasks/poll", {"worker_id": "w\\u0000", "names": ["echo"]}, "worker_id"),
    ("/v1/activity-tasks/poll", {"worker_id": "w", "names": ["\\udfff"]}, "names[0]"),
]


def _raw(body: dict[str, Any]) -> bytes:
    """``body`` as JSON text whose ``\\uXXXX`` escapes are left for the server to read."""
    import json

    return json.dumps(body).replace("\\\\u", "\\u").encode()


@pytest.mark.parametrize(("path", "body", "field"), TEXT_FIELDS, ids=lambda v: str(v)[:30])
def test_a_nul_or_lone_surrogate_in_text_is_a_400_naming_the_field(
    engine: dex.Engine, http: Any, path: str, body: dict[str, Any], field: str
) -> None:
    run_id = engine.start_workflow(waiting)
    status, kind, message = refusal(http.post(path.format(run=run_id), content=_raw(body)))
    assert (status, kind) == (400, "BadRequest") and message.startswith(field + " must "), message
    assert [run.run_id for run in engine.list_runs()] == [run_id]


def test_in_any_json_a_nul_is_kept_and_a_lone_surrogate_is_a_422(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(waiting)
    kept = http.post(f"/v1/runs/{run_id}/events", content=b'{"event_id": "go", "payload": "a\\u0000b"}')
    assert kept.status_code == 202, kept.text
    refused = http.post("/v1/runs", content=b'{"workflow": "web-checkout", "args": ["\\ud800"]}')
    status, kind, message = refusal(refused)
    assert (status, kind) == (422, "SerializationError") and "not valid Unicode" in message
    assert len(engine.list_runs()) == 1


def test_a_body_over_the_limit_is_a_413_on_the_activity_task_routes_alike(bare_routes: Any, http: Any) -> None:
    raw = b'{"worker_id": "' + b"w" * (8 * 1024 * 1024) + b'", "names": ["echo"]}'
    mounted = refusal(bare_routes.post("/v1/activity-tasks/poll", content=raw))
    served = refusal(http.post("/v1/activity-tasks/poll", content=raw))
    assert mounted[:2] == served[:2] == (413, "PayloadTooLarge")
