"""Queries: ask a running workflow what it knows, recording nothing (docs/how-to/talk-to-a-running-workflow.md).

A counter workflow counts "tick" events with an event handler and answers the queries "count"
and "last"; the query is answered while it runs, and again after it ended (by replaying its
history). Run it as it is (in memory, a virtual clock), or with ``DEX_DATABASE_URL`` set, on
PostgreSQL with a started engine (schema ``DEX_SCHEMA``, default ``dex_examples``):

    python examples/hello_query.py
"""

from __future__ import annotations

import os
import time

import dex


@dex.workflow(name="hello-counter")
async def counter(ctx: dex.WorkflowContext, goal: int) -> int:
    ticks: list[str] = []

    @ctx.on_event("tick")  # every "tick" event, in arrival order
    def tick(label: str) -> None:
        ticks.append(label)

    @ctx.on_query("count")
    def count() -> int:
        return len(ticks)

    @ctx.on_query("last")
    def last(default: str = "none yet") -> str:
        return ticks[-1] if ticks else default

    await ctx.wait_condition(lambda: len(ticks) >= goal)
    return len(ticks)


def make_engine() -> dex.Engine:
    url = os.environ.get("DEX_DATABASE_URL")
    if url:
        from dex.adapters.postgres import PostgresAdapter

        return dex.Engine(
            PostgresAdapter(url, schema=os.environ.get("DEX_SCHEMA", "dex_examples")), workflows=[counter]
        )
    from dex.adapters.memory import InMemoryAdapter
    from dex.testing import VirtualClock

    return dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[counter])


def settled(engine: dex.Engine, run_id: str, name: str, wanted: object) -> object:
    """The query's answer once it is ``wanted``: on a started engine the run takes its events (and,
    at first, registers its handlers) in its next task, a moment after they were sent."""
    deadline = time.monotonic() + 30
    while True:
        try:
            answer = engine.query(run_id, name)
        except dex.QueryError:
            if time.monotonic() > deadline:
                raise
            answer = None  # its code has not run yet: no handler is registered
        if answer == wanted or time.monotonic() > deadline:
            return answer
        time.sleep(0.01)


def main() -> None:
    engine = make_engine()
    started = bool(os.environ.get("DEX_DATABASE_URL"))
    if started:
        engine.start()
    try:
        run_id = engine.start_workflow(counter, 3)
        print("last before any tick:", settled(engine, run_id, "last", "none yet"))
        engine.send_event(run_id, "tick", "first")
        engine.send_event(run_id, "tick", "second")
        print("count:", settled(engine, run_id, "count", 2))
        print("last:", engine.query(run_id, "last"))
        try:
            engine.query(run_id, "average")
        except dex.QueryError as exc:
            print("refused:", exc)
        engine.send_event(run_id, "tick", "third")
        if not started:
            engine.drain()
        print("result:", engine.wait(run_id, timeout=30))
        print("count after the end:", engine.query(run_id, "count"))
    finally:
        if started:
            engine.stop()
        engine.store.close()


if __name__ == "__main__":
    main()
