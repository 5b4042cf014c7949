"""The HTTP routes of docs/reference/contract.md §13 over a real server (uvicorn), with their errors and poisons: each
poisoned call gets its clear error, and a healthy run started afterwards completes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import dex
from dex.remote import ActivityTaskService
from tests.remote.support import http_server, one, post


@pytest.fixture
def url(service: ActivityTaskService) -> Iterator[str]:
    with http_server(service) as base:
        yield base + "/v1/activity-tasks"


def _claim(url: str, name: str = "echo") -> dict[str, Any]:
    status, tasks = post(f"{url}/poll", {"worker_id": "w1", "names": [name], "max": 1, "wait_seconds": 10})
    assert status == 200 and len(tasks) == 1, tasks
    return tasks[0]  # type: ignore[no-any-return]


def _healthy(engine: dex.Engine, url: str) -> None:
    """A run started now completes through the same routes."""
    run_id = engine.start_workflow(one, "echo", {"n": 1})
    task = _claim(url)
    assert post(f"{url}/{task['task_id']}/complete", {"lease_version": task["lease_version"], "result": "ok"}) == (
        200,
        {},
    )
    assert engine.wait(run_id, timeout=10) == "ok"


def test_a_worker_polls_heartbeats_and_completes_over_http(engine: dex.Engine, url: str) -> None:
    run_id = engine.start_workflow(one, "echo", [1, "two", None])
    task = _claim(url)
    assert set(task) == {
        "task_id", "run_id", "name", "attempt", "args", "lease_version", "lease_until", "heartbeat_timeout"
    }  # fmt: skip
    assert (task["run_id"], task["args"], task["attempt"]) == (run_id, [[1, "two", None]], 1)
    beat = post(f"{url}/{task['task_id']}/heartbeat", {"lease_version": task["lease_version"]})
    assert beat == (200, {"cancel_requested": False})
    done = post(f"{url}/{task['task_id']}/complete", {"lease_version": task["lease_version"], "result": [3]})
    assert done == (200, {})
    assert engine.wait(run_id, timeout=10) == [3]
    lost = post(f"{url}/{task['task_id']}/complete", {"lease_version": task["lease_version"], "result": [4]})
    assert lost[0] == 409 and lost[1]["error"]["type"] == "LeaseLost"


def test_fail_with_retry_after_and_terminal(engine: dex.Engine, url: str) -> None:
    run_id = engine.start_workflow(one, "echo", 1, 3)
    task = _claim(url)
    error = {"type": "Busy", "message": "try later", "terminal": False, "retry_after_seconds": 0.2}
    assert post(f"{url}/{task['task_id']}/fail", {"lease_version": task["lease_version"], "error": error}) == (200, {})
    again = _claim(url)
    assert (again["task_id"], again["attempt"]) == (task["task_id"], 2)
    error = {"type": "Broken", "message": "for good", "terminal": True}
    assert post(f"{url}/{again['task_id']}/fail", {"lease_version": again["lease_version"], "error": error})[0] == 200
    with pytest.raises(dex.WorkflowFailedError, match="for good"):
        engine.wait(run_id, timeout=10)


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({"worker_id": "w\x00", "names": ["echo"]}, 422, "InvalidValue"),
        ({"worker_id": "w\ud800", "names": ["echo"]}, 422, "InvalidValue"),
        ({"worker_id": "w", "names": ["ec\x00ho"]}, 422, "InvalidValue"),
        ({"worker_id": "w", "names": ["\udfff"]}, 422, "InvalidValue"),
        ({"worker_id": "w", "names": []}, 422, "InvalidValue"),
        ({"worker_id": "w", "names": "echo"}, 400, "BadRequest"),
        ({"worker_id": 7, "names": ["echo"]}, 400, "BadRequest"),
        ({"names": ["echo"]}, 400, "BadRequest"),
        ({"worker_id": "w", "names": ["echo"], "max": 0}, 422, "InvalidValue"),
        ({"worker_id": "w", "names": ["echo"], "wait_seconds": -1}, 422, "InvalidValue"),
        ({"worker_id": "w", "names": ["echo"], "wait_seconds": 1e9}, 422, "InvalidValue"),
        ([1, 2], 400, "BadRequest"),
    ],
)
def test_a_poisoned_poll_gets_a_clear_error(engine: dex.Engine, url: str, body: Any, status: int, kind: str) -> None:
    got_status, answer = post(f"{url}/poll", body)
    assert (got_status, answer["error"]["type"]) == (status, kind)
    assert answer["error"]["message"]
    _healthy(engine, url)


@pytest.mark.parametrize(
    "raw", [b"not json", b'{"worker_id": "w", "names": ["echo"], "wait_seconds": NaN}', b"\xff\xfe", b"[" * 100_000]
)
def test_a_body_that_is_not_json_is_refused(engine: dex.Engine, url: str, raw: bytes) -> None:
    status, answer = post(f"{url}/poll", None, raw=raw)
    assert (status, answer["error"]["type"]) == (400, "BadRequest")
    _healthy(engine, url)


@pytest.mark.parametrize("path", ["abc", "0", "-3", "99999999999999999999", "1.5"])
def test_a_path_that_names_no_task_is_404(engine: dex.Engine, url: str, path: str) -> None:
    status, answer = post(f"{url}/{path}/complete", {"lease_version": 1, "result": None})
    assert (status, answer["error"]["type"]) == (404, "NotFound")
    _healthy(engine, url)


@pytest.mark.parametrize("result", ["\ud800", {"\udfff": 1}, ["ok", "\ud83d"]])
def test_a_result_with_no_json_form_is_refused_and_the_task_stays_held(
    engine: dex.Engine, url: str, result: Any
) -> None:
    run_id = engine.start_workflow(one, "echo", 1)
    task = _claim(url)
    status, answer = post(
        f"{url}/{task['task_id']}/complete", {"lease_version": task["lease_version"], "result": result}
    )
    assert (status, answer["error"]["type"]) == (422, "InvalidValue")
    assert "not valid Unicode" in answer["error"]["message"]
    # nothing changed: the same lease completes the task with a result that has a JSON form
    fine = post(f"{url}/{task['task_id']}/complete", {"lease_version": task["lease_version"], "result": "a\x00b"})
    assert fine == (200, {})
    assert engine.wait(run_id, timeout=10) == "a\x00b"
    _healthy(engine, url)


@pytest.mark.parametrize(
    ("kind", "message"), [("Bad\x00Type", "nul \x00 inside"), ("Lone\ud800", "surrogate \udfff here")]
)
def test_an_error_with_nul_or_lone_surrogates_fails_the_run_readably(
    engine: dex.Engine, url: str, kind: str, message: str
) -> None:
    run_id = engine.start_workflow(one, "echo", 1)
    task = _claim(url)
    error = {"type": kind, "message": message, "terminal": True}
    assert post(f"{url}/{task['task_id']}/fail", {"lease_version": task["lease_version"], "error": error}) == (200, {})
    with pytest.raises(dex.WorkflowFailedError) as raised:
        engine.wait(run_id, timeout=10)
    text = str(raised.value)
    assert message.encode("utf-8", "backslashreplace").decode() in text
    _healthy(engine, url)


@pytest.mark.parametrize(
    "body",
    [
        {"result": 1},
        {"lease_version": "1", "result": 1},
        {"lease_version": True, "result": 1},
    ],
)
def test_a_complete_without_a_proper_lease_version_is_400(engine: dex.Engine, url: str, body: Any) -> None:
    run_id = engine.start_workflow(one, "echo", 1)
    task = _claim(url)
    status, answer = post(f"{url}/{task['task_id']}/complete", body)
    assert (status, answer["error"]["type"]) == (400, "BadRequest")
    post(f"{url}/{task['task_id']}/complete", {"lease_version": task["lease_version"], "result": 2})
    assert engine.wait(run_id, timeout=10) == 2


def test_a_fail_without_a_proper_error_is_400(engine: dex.Engine, url: str) -> None:
    task_id = 1
    for body in ({"lease_version": 1}, {"lease_version": 1, "error": "boom"}, {"lease_version": 1, "error": {}}):
        status, answer = post(f"{url}/{task_id}/fail", body)
        assert (status, answer["error"]["type"]) == (400, "BadRequest"), body
    status, answer = post(f"{url}/{task_id}/fail", {"lease_version": 1, "error": {"type": "", "message": "x"}})
    assert status == 422
    _healthy(engine, url)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class FlakyStore:
    """The engine's store, but the next call of each method named in ``fail`` raises."""

    def __init__(self, store: Any, hostile: bool = False) -> None:
        self._store, self.fail, self.hostile = store, set[str](), hostile

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if name in self.fail:
            self.fail.discard(name)

            def broken(*args: Any, **kwargs: Any) -> Any:
                if self.hostile:
                    raise Unprintable()
                raise ConnectionError(f"the store went away during {name} \ud800")

            return broken
        return attribute


@pytest.mark.parametrize(
    "method", ["claim_activity_tasks", "find_activity_tasks", "complete_activity_tasks", "extend_activity_leases"]
)
@pytest.mark.parametrize("hostile", [False, True], ids=["connection-error", "unprintable"])
def test_the_store_failing_mid_call_is_a_503_and_changes_nothing(
    engine: dex.Engine, method: str, hostile: bool
) -> None:
    flaky = FlakyStore(engine.store, hostile)
    service = ActivityTaskService(flaky, poll_interval=0.1)  # type: ignore[arg-type]
    with http_server(service) as base:
        url = base + "/v1/activity-tasks"
        run_id = engine.start_workflow(one, "echo", 5)
        flaky.fail.add(method)
        status, answer = post(f"{url}/poll", {"worker_id": "w1", "names": ["echo"], "wait_seconds": 10})
        if status == 200:  # the claim went through: the failure comes with the next call
            (task,) = answer
            done = {"lease_version": task["lease_version"], "result": 6}
            status, answer = post(f"{url}/{task['task_id']}/heartbeat", {"lease_version": task["lease_version"]})
            if status == 200:
                status, answer = post(f"{url}/{task['task_id']}/complete", done)
            assert (status, answer["error"]["type"]) == (503, "Unavailable")
            assert ("could not be described" if hostile else "went away") in answer["error"]["message"]
            assert post(f"{url}/{task['task_id']}/complete", done) == (200, {})  # the lease still holds
        else:
            assert (status, answer["error"]["type"]) == (503, "Unavailable")
            task = _claim(url)
            post(f"{url}/{task['task_id']}/complete", {"lease_version": task["lease_version"], "result": 6})
        assert engine.wait(run_id, timeout=10) == 6
        _healthy(engine, url)
