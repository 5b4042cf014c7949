"""A run that streams its progress, and a caller that reads it live (docs/reference/contract.md §14).

A report is built from several sources, one activity each. The workflow publishes its stage
(``ctx.publish``) and writes a progress item after every source (``ctx.write_stream``); each
activity also streams the lines it reads (``dex.activity_context().write_stream``). The caller
starts the run and prints every progress item as it arrives, while the run goes on, then the
last published stage and the result.

    python examples/progress_stream.py                  # in memory
    DEX_DATABASE_URL=postgresql://... python examples/progress_stream.py [--schema NAME]

With a database, the reader could as well be another process: ``engine.read_stream`` reads the
stream's own table, never the run's history.
"""

from __future__ import annotations

import argparse
import os
import time

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import Store

SOURCES = ["orders", "refunds", "stock", "shipping"]


@dex.activity(name="read-source")
def read_source(source: str) -> int:
    rows = 0
    for line in range(3):  # stands in for reading a file or a table
        time.sleep(0.01)
        rows += 1
        dex.activity_context().write_stream("lines", f"{source}: line {line + 1}")
    return rows


@dex.workflow(name="build-report")
async def build_report(ctx: dex.WorkflowContext, sources: list[str]) -> dict[str, int]:
    ctx.publish("stage", "reading")
    counts: dict[str, int] = {}
    for done, source in enumerate(sources, start=1):
        counts[source] = await ctx.activity(read_source, source)
        await ctx.write_stream("progress", {"source": source, "done": done, "of": len(sources)})
    ctx.close_stream("progress")
    ctx.publish("stage", "written")
    return counts


def adapter(schema: str) -> Store:
    url = os.environ.get("DEX_DATABASE_URL")
    if not url:
        return InMemoryAdapter()
    from dex.adapters.postgres import PostgresAdapter

    return PostgresAdapter(url, schema=schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schema", default="dex_examples")
    store = adapter(parser.parse_args().schema)
    with dex.Engine(store, workflows=[build_report], activities=[read_source], poll_interval=0.01) as engine:
        run_id = engine.start_workflow(build_report, SOURCES)
        for item in engine.read_stream(run_id, "progress", timeout=30):  # as each is written
            print(f"progress: {item['done']}/{item['of']} ({item['source']})", flush=True)
        print(f"stage: {engine.get_published(run_id, 'stage', timeout=30)}")
        print(f"result: {engine.wait(run_id, timeout=30)}")
        lines = list(engine.read_stream(run_id, "lines", timeout=30))  # ended with the run
        print(f"lines streamed by the activities: {len(lines)}")
    store.close()


if __name__ == "__main__":
    main()
