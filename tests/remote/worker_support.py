"""What the Python and Node worker SDKs' tests share: workflows that call activities by name, a real ``dex web``
app (``dex.web.create_app`` behind a bearer token, served by uvicorn on a loopback port that may
be stopped and served again), and a Python worker run in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.remote import ActivityTaskService
from dex.remote.worker import Worker
from dex.web import create_app

TOKEN = "sdk-test-token"


@dex.workflow(name="sdk-call")
async def call(ctx: dex.WorkflowContext, name: str, args: list[Any], max_attempts: int = 3) -> Any:
    """Calls the activity ``name`` with ``args``, retried up to ``max_attempts`` times quickly."""
    retry = dex.RetryPolicy(max_attempts=max_attempts, initial_delay=0.01, max_delay=0.01)
    return await ctx.activity(name, *args, retry=retry)


WORKFLOWS = [call]


@contextmanager
def sdk_engine(store: str) -> Iterator[dex.Engine]:
    """A started engine over a ``memory`` or ``postgres`` store (a schema of its own) with the
    SDK tests' workflows and no activity: they all run in remote workers."""
    if store == "memory":
        with dex.Engine(InMemoryAdapter(), workflows=WORKFLOWS, poll_interval=0.02) as engine:
            yield engine
        return
    from dex.adapters.postgres import PostgresAdapter
    from tests.pg import fresh_schema, postgres_dsn

    dsn = postgres_dsn()
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema, max_connections=4)
        try:
            with dex.Engine(adapter, workflows=WORKFLOWS, poll_interval=0.02) as engine:
                yield engine
        finally:
            adapter.close()


@contextmanager
def dex_web(engine: dex.Engine, service: ActivityTaskService, port: int) -> Iterator[str]:
    """``dex web``'s app over ``engine``, with ``service`` serving the remote workers, on
    ``port`` until the block ends; yields its URL."""
    app = create_app(engine, token=TOKEN, activity_task_service=service)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-dex-web", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "dex web did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """``worker.run()`` in a thread for the block; then stopped, and drained within 30 s."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failed.append(exc)

    thread = threading.Thread(target=run, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive(), "the worker did not drain"
    assert not failed, failed


def failure_text(exc: dex.WorkflowFailedError) -> str:
    """The run's failure with its causes, as one line."""
    from dex.domain.values import describe_failure

    return describe_failure(exc.failure)
