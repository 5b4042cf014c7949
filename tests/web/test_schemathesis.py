"""Schemathesis holds the JSON API to its own OpenAPI document.

Schemathesis (a third-party OpenAPI fuzzer) reads ``/v1/openapi.json`` of an app over a started
engine on PostgreSQL, with a token, and calls every ``/v1`` operation in-process (ASGI): the
document's examples, its coverage cases (every boundary and every rule broken one at a time)
and generated requests, valid and invalid, then chains of calls along the document's links (a
run started, then read, paged, cancelled, forked; a schedule listed, then triggered). Every
answer is held to all of Schemathesis's checks: no 5xx; every status, header, content type and
body one the document declares; every request the document allows accepted (no 400/422 for a
valid one), every one it rules out refused; a call without the token a 401; a 405 with its
``Allow`` header for a method a path does not serve; what a link created found where it says.

The run is seeded and bounded (``SEED``, ``MAX_EXAMPLES``, ``STEPS``), so it stays within the
default suite's time and generates the same requests each time (the engine runs beside it, so
an answer may differ between runs, always among those the document declares). Two things are
fixed up, not skipped: a ``cursor`` is a value only the server makes (signed; a made-up one is
a 400 by design, as the document says), so valid cases leave out made-up ones and the NextPage
link hands real ones on; and a long poll waits at most ``POLL_WAIT`` seconds (its full 60 is
time, not behaviour; ``tests/remote`` covers the wait), an update waits 0 seconds for its
answer (a run in a queue the fuzzer paused would hold each for its whole timeout;
``tests/web/test_api_updates.py`` covers the wait and the 202), and the server-sent events of
published values and streams end as soon as they are quiet (``timeout=0``;
``tests/web/test_streams_sse.py`` covers the wait). The chains do not start at a poll
(Schemathesis reads its ``worker_id`` as a reference to a resource no call makes), so its links
to complete, fail and heartbeat are documented but not followed here; ``tests/remote`` covers
those calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.web import create_app
from tests.pg import fresh_schema, postgres_dsn
from tests.web.conftest import ACTIVITIES, WORKFLOWS, checkout, waiting

schemathesis = pytest.importorskip("schemathesis")

from schemathesis.config import SchemathesisConfig  # noqa: E402 - after the skip above
from schemathesis.engine import Status, events  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

pytestmark = pytest.mark.postgres

TOKEN = "schemathesis-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SEED = 20261202
MAX_EXAMPLES = 30  # generated cases per operation (the coverage cases come on top)
STEPS = 10  # calls in one chain of the stateful run
POLL_WAIT = 0.05  # seconds a valid long poll may wait here
# server-sent events of a run that goes on never end by themselves: valid cases ask for timeout=0
EVENT_STREAMS = ("/v1/runs/{run_id}/streams/{key}", "/v1/runs/{run_id}/published/{key}")
REMOTE_TASKS = 10  # activity tasks waiting for a remote worker
REMOTE_ACTIVITY = "send-email"  # their name, which the document's example of a poll asks for
# how a cursor the app gave out begins (base64 of '{"t": '): those the NextPage link hands on are kept
SERVER_MADE = "eyJ0Ijog"

CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": SEED,
        "headers": AUTH,
        "workers": 1,
        "generation": {"max-examples": MAX_EXAMPLES},
        "phases": {
            "examples": {"enabled": True},
            "coverage": {"enabled": True},
            "fuzzing": {"enabled": True},
            "stateful": {"enabled": True, "max-steps": STEPS},
        },
    }
)


@dex.workflow(name="web-remote-mail")
async def remote_mail(ctx: dex.WorkflowContext, to: str) -> Any:
    # send-email is no activity of this process: it waits for a remote worker, and the
    # document's example of a poll asks for it, so the answer holds tasks to check
    return await ctx.activity(REMOTE_ACTIVITY, to)


@pytest.fixture
def started() -> Iterator[dex.Engine]:
    """A started engine on PostgreSQL with something to find: a schedule, a run that ended, one
    that waits and some whose activity waits for a remote worker, queues of both kinds."""
    dsn = postgres_dsn()
    with fresh_schema(dsn, prefix="dex_schemathesis") as name:
        adapter = PostgresAdapter(dsn, schema=name, max_connections=8)
        nightly = dex.Schedule("web-nightly", checkout, cron="0 3 * * *", args=(9,))
        engine = dex.Engine(adapter, [*WORKFLOWS, remote_mail], ACTIVITIES, schedules=[nightly])
        try:
            engine.start_workflow(checkout, 1)
            engine.start_workflow(waiting)
            for n in range(REMOTE_TASKS):
                engine.start_workflow(remote_mail, f"user-{n}@example.com")
            engine.drain(advance_time=False)
            engine.start()
            yield engine
        finally:
            engine.stop(timeout=10)
            adapter.close()


@pytest.fixture
def api_schema(started: dex.Engine) -> Any:
    """The app's document as Schemathesis reads it, from the app itself (ASGI, no socket)."""
    app = create_app(started, token=TOKEN)
    loaded = schemathesis.openapi.from_asgi("/v1/openapi.json", app, config=CONFIG, headers=AUTH)
    loaded.hook("map_case")(_as_a_client_makes_them)
    return loaded


def _as_a_client_makes_them(context: Any, case: Any) -> Any:
    """The fix-ups of the module docstring; each changes a value the document allows into
    another it allows, so a valid case stays valid and an invalid one keeps what makes it so."""
    if case.meta is None:
        return case
    valid = case.meta.generation.mode is GenerationMode.POSITIVE
    cursor = case.query.get("cursor") if isinstance(case.query, dict) else None
    if valid and cursor is not None and not str(cursor).startswith(SERVER_MADE):
        case.query = {key: value for key, value in case.query.items() if key != "cursor"}
    if case.path == "/v1/runs/{run_id}/updates" and isinstance(case.body, dict):
        body = dict(case.body)
        wait = body.get("timeout")
        # a number the route takes as whole (49.0 counts as 49, as JSON Schema counts it)
        whole = isinstance(wait, int) or (isinstance(wait, float) and wait.is_integer())
        if wait is None or (whole and not isinstance(wait, bool) and 0 < wait <= 300):
            body["timeout"] = 0  # the answer or a 202 at once: a run the fuzzer paused never answers
        case.body = body
    if case.path == "/v1/activity-tasks/poll" and isinstance(case.body, dict):
        body = dict(case.body)
        wait = body.get("wait_seconds")
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and POLL_WAIT < wait <= 60:
            body["wait_seconds"] = POLL_WAIT  # also where something else is wrong (a content type)
        case.body = body
    if case.path in EVENT_STREAMS and valid and isinstance(case.query, dict):
        case.query = {**case.query, "timeout": 0}  # a quiet stream ends at once (the wait is time, not behaviour)
    return case


def test_the_api_keeps_to_its_openapi_document(started: dex.Engine, api_schema: Any) -> None:
    # Schemathesis's own run, as its command line makes it: examples, coverage, fuzzing and
    # the stateful chains, with every check
    found = run(api_schema)
    assert not found.failures, "\n\n".join(found.failures)
    assert not found.errors, "\n\n".join(found.errors)
    documented = {
        f"{method.upper()} {path}"
        for path, item in api_schema.raw_schema["paths"].items()
        for method in item
        if path != "/v1/openapi.json"
    }
    assert documented <= found.tested, documented - found.tested
    assert found.stateful_calls > STEPS  # the links were followed
    # and the engine behind the fuzzed app still serves: once the queues the fuzzer paused,
    # narrowed or rate-limited are as they were, a run started now completes
    for queue in started.list_queues():
        started.resume_queue(queue.name, queue.kind)
        started.set_queue_capacity(queue.name, queue.kind, 100)
        started.set_queue_rate_limit(queue.name, queue.kind, None)
        if queue.kind == "workflow":
            started.set_queue_key_concurrency(queue.name, queue.kind, 1)
    run_id = started.start_workflow(checkout, 5)
    assert started.wait(run_id, timeout=30) == {"receipt": "charged 5", "amount": 5}


@attrs.define
class Findings:
    """What a Schemathesis run found: each failed check (with the requests that reproduce it),
    each error, the operations it tested and how many calls its stateful phase made."""

    failures: list[str] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    tested: set[str] = attrs.Factory(set)
    stateful_calls: int = 0


def run(api_schema: Any) -> Findings:
    found = Findings()
    for event in schemathesis.engine.from_schema(api_schema).execute():
        if isinstance(event, events.ScenarioFinished):
            if event.recorder.label.startswith(("GET ", "POST ")) and event.status is not Status.SKIP:
                found.tested.add(event.recorder.label)
            else:
                found.stateful_calls += len(event.recorder.cases)
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.failure_info is not None:
                        found.failures.append(
                            f"{event.recorder.label}: {check.name}: {check.failure_info.failure.title}\n"
                            f"{check.failure_info.failure}\n{check.failure_info.code_sample}"
                        )
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            found.errors.append(str(getattr(event, "info", None) or getattr(event, "exception", event)))
    return found


def test_the_document_links_what_a_call_makes_to_the_calls_on_it(api_schema: Any) -> None:
    # the stateful run above is only as good as the links: a run made (started, forked,
    # triggered) leads to its reads and changes, and a listed queue or schedule to its calls
    document = api_schema.raw_schema
    paths = document["paths"]
    started = paths["/v1/runs"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in started.values()} >= {
        "get_v1_runs_run_id",
        "get_v1_runs_run_id_history",
        "post_v1_runs_run_id_cancel",
        "post_v1_runs_run_id_fork",
    }
    for path, method, status in (
        ("/v1/runs/{run_id}/fork", "post", "201"),
        ("/v1/schedules/{name}/trigger", "post", "201"),
        ("/v1/runs", "get", "200"),
        ("/v1/queues", "get", "200"),
        ("/v1/schedules", "get", "200"),
    ):
        assert paths[path][method]["responses"][status]["links"], path
    ids = {operation["operationId"] for item in paths.values() for operation in item.values()}
    for item in paths.values():
        for operation in item.values():
            for answer in operation["responses"].values():
                for link in answer.get("links", {}).values():
                    assert link["operationId"] in ids
