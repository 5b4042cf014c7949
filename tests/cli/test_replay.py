"""`dex replay MODULE:ENGINE`: stored histories replayed against new code, nothing run (docs/reference/contract.md §11)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import dex
from dex.cli.worker import load_engine
from tests.cli.conftest import ACTIVITIES, WORKFLOWS, World, invoke, one_line_error, order

pytestmark = pytest.mark.postgres

APP = """
import os
from datetime import timedelta

import dex
from dex.adapters.postgres import PostgresAdapter


@dex.activity(name="cli-greet")
def greet(name: str) -> str:
    return f"hello {name}"


@dex.workflow(name="cli-child")
async def child(ctx: dex.WorkflowContext, n: int) -> int:
    return n * 2


@dex.workflow(name="cli-order")
async def order(ctx: dex.WorkflowContext, name: str) -> dict:
    STEPS
    await ctx.sleep(timedelta(minutes=5))
    doubled = await ctx.child(child, 21)
    packed = await ctx.wait_for_event("packed")
    return {"greeting": greeting, "doubled": doubled, "packed": packed}


engine = dex.Engine(
    PostgresAdapter(os.environ["APP_DSN"], schema=os.environ["APP_SCHEMA"], min_connections=1, max_connections=1),
    workflows=[order, child],
    activities=[greet],
)
"""

SAME = "greeting = await ctx.activity(greet, name)"
CHANGED = "greeting = await ctx.activity(greet, name.upper())  # a deploy changed the argument"
PATCHED = "greeting = await ctx.activity(greet, name.upper() if ctx.patched('shout') else name)  # v2, patched"


def _module(directory: Path, steps: str) -> str:
    name = f"replayapp_{uuid.uuid4().hex[:8]}"
    (directory / f"{name}.py").write_text(APP.replace("STEPS", steps))
    return name


def _replay(world: World, directory: Path, steps: str, *args: str) -> tuple[int, str, str]:
    name = _module(directory, steps)
    env = {"APP_DSN": world.dsn, "APP_SCHEMA": world.schema}
    result = invoke("replay", f"{name}:engine", "--app-dir", str(directory), *args, env=env)
    return result.exit_code, result.stdout, result.stderr


def test_replay_reports_each_mismatch_and_exits_1(world: World, tmp_path: Path) -> None:
    waiting = world.engine.start_workflow(order, "ann")
    world.engine.drain()  # greeted, slept, child done: it waits for "packed"
    code, out, err = _replay(world, tmp_path, CHANGED)
    assert code == 1, (out, err)
    assert "cli-order: 1 replayed, 0 match, 1 do not" in out
    assert f"run {waiting}: " in out
    assert "activity 'cli-greet'" in out and "different arguments" in out
    assert "deploying it would hold them" in err
    # nothing ran and nothing was written: the run stands where it stood
    assert [item.kind for item in world.engine.history(waiting)][-1] == "WorkflowTaskCompleted"
    for steps in (SAME, PATCHED):  # the old code, and the new code behind a patch, both match
        code, out, err = _replay(world, tmp_path, steps)
        assert code == 0, (out, err)
        assert "cli-order: 1 replayed, 1 match, 0 do not" in out
    # the filters: finished runs only (there are none of cli-order), then one workflow
    code, out, _ = _replay(world, tmp_path, CHANGED, "--status", "completed", "--workflow", "cli-order")
    assert code == 0 and out == "cli-order: 0 replayed, 0 match, 0 do not\n"


def test_replay_of_a_workflow_the_engine_does_not_register_is_a_one_line_error(world: World, tmp_path: Path) -> None:
    name = _module(tmp_path, SAME)
    env = {"APP_DSN": world.dsn, "APP_SCHEMA": world.schema}
    result = invoke("replay", f"{name}:engine", "--app-dir", str(tmp_path), "--workflow", "nope", env=env)
    assert result.exit_code == 2
    assert "registers no workflow 'nope'" in one_line_error(result)


def test_runs_list_filters_by_code_version_and_show_says_why_a_run_is_held(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    versioned = dex.Engine(world.engine.store, workflows=WORKFLOWS, activities=ACTIVITIES, code_version="v9")
    run_id = versioned.start_workflow(order, "bea")
    other = world.engine.start_workflow(order, "cy")
    result = world.invoke("runs", "list", "--code-version", "v9", "--json")
    assert result.exit_code == 0, result.stderr
    listed = json.loads(result.stdout)
    assert [item["run_id"] for item in listed] == [run_id] and listed[0]["code_version"] == "v9"
    assert other not in result.stdout
    # a run held by code that does not match its history: show says why
    versioned.drain()
    name = _module(tmp_path, CHANGED)
    monkeypatch.setenv("APP_DSN", world.dsn)  # what the module reads on import
    monkeypatch.setenv("APP_SCHEMA", world.schema)
    held_by = load_engine(f"{name}:engine", str(tmp_path))
    try:
        world.engine.send_event(run_id, "packed", "box")
        held_by.workflow_scheduler.step()
        held_by.workflow_worker.poll_once()  # the new code claims the task, and holds the run
    finally:
        held_by.store.close()  # type: ignore[attr-defined]
    shown = world.invoke("runs", "show", run_id)
    assert shown.exit_code == 0, shown.stderr
    assert "code version" in shown.stdout and "v9" in shown.stdout
    assert "held" in shown.stdout and "NonDeterminismError" in shown.stdout
