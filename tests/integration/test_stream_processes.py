"""A stream read from a second process while the run goes on (docs/reference/contract.md §14).

The reader is its own Python process with its own engine over the same schema
(:mod:`tests.integration.stream_reader`); it must see each item while the run still waits for
the event that lets it write the next, in order, and end when the stream is closed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]


@dex.workflow(name="paced-stream")
async def paced_stream(ctx: dex.WorkflowContext, count: int) -> int:
    for i in range(count):
        await ctx.write_stream("paced", {"item": i})
        if i < count - 1:
            await ctx.wait_for_event("next")
    ctx.close_stream("paced")
    await ctx.wait_for_event("finish")
    return count


def _lines(path: Path) -> list[str]:
    """The complete lines the reader printed so far (a line being written is not one yet)."""
    text = path.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def _await_lines(path: Path, count: int, process: subprocess.Popen[bytes], timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(_lines(path)) < count:
        if process.poll() is not None and len(_lines(path)) < count:
            raise AssertionError(
                f"the reader exited early:\n{path.read_text()}\n{path.with_suffix('.err').read_text()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"the reader printed {_lines(path)} after {timeout} s")
        time.sleep(0.01)
    return _lines(path)


def test_a_second_process_reads_the_stream_live_and_in_order(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    adapter = PostgresAdapter(pg_dsn, schema=pg_schema)
    engine = dex.Engine(adapter, workflows=[paced_stream], poll_interval=0.02, workflow_task_lease=timedelta(seconds=5))
    engine.start()
    out = tmp_path / "reader.out"
    process: subprocess.Popen[bytes] | None = None
    try:
        run_id = engine.start_workflow(paced_stream, 4)
        with open(out, "wb") as sink, open(tmp_path / "reader.err", "wb") as errors:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.stream_reader", pg_dsn, pg_schema, run_id, "paced"],
                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                stdin=subprocess.DEVNULL, stdout=sink, stderr=errors,
            )  # fmt: skip
        for i in range(4):
            lines = _await_lines(out, i + 2, process)  # "ready", then the items so far
            assert lines[0] == "ready", lines
            # the items so far, and no other: the next one waits for its event (after the last
            # one the stream is closed, and the reader may have printed "end" already)
            assert [json.loads(line) for line in lines[1 : i + 2]] == [{"item": n} for n in range(i + 1)]
            assert lines[i + 2 :] in ([], ["end"] if i == 3 else []), lines
            # the run waits for the event that lets it write the next item: it is read live
            assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
            if i < 3:
                engine.send_event(run_id, "next")
        lines = _await_lines(out, 6, process)
        assert lines[-1] == "end"  # closed: the reader ends while the run still goes on
        assert process.wait(timeout=20) == 0
        assert engine.get_run(run_id).status is dex.RunStatus.RUNNING
        engine.send_event(run_id, "finish")
        assert engine.wait(run_id, timeout=20) == 4
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        engine.stop(timeout=5)
        adapter.close()
