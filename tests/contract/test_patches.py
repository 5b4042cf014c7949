"""ctx.patched / ctx.deprecate_patch on every adapter (docs/reference/contract.md §11): runs started by old code keep
the old branch, new runs take the new one and record PatchApplied, the answer holds for the
rest of the run, and deprecate_patch accepts histories with or without the event."""

from __future__ import annotations

from typing import Any

import pytest

import dex
from dex.domain import events as ev


@dex.activity
def charge_a() -> str:
    return "a"


@dex.activity
def charge_b() -> str:
    return "b"


@dex.workflow(name="billing")
async def billing_v1(ctx: dex.WorkflowContext) -> str:
    first = await ctx.activity(charge_a)
    await ctx.wait_for_event("go")
    second = await ctx.activity(charge_a)
    return f"{first}{second}"


@dex.workflow(name="billing")
async def billing_v2(ctx: dex.WorkflowContext) -> str:
    # the same question twice: the second answer must be the first one, whatever comes between
    first = await ctx.activity(charge_b if ctx.patched("use-b") else charge_a)
    await ctx.wait_for_event("go")
    second = await ctx.activity(charge_b if ctx.patched("use-b") else charge_a)
    return f"{first}{second}"


@dex.workflow(name="billing")
async def billing_v3(ctx: dex.WorkflowContext) -> str:
    ctx.deprecate_patch("use-b")  # every run left either took the new branch or started here
    first = await ctx.activity(charge_b)
    await ctx.wait_for_event("go")
    second = await ctx.activity(charge_b)
    return f"{first}{second}"


def _kinds(engine: dex.Engine, run_id: str) -> list[str]:
    return [item.kind for item in engine.history(run_id)]


def test_a_run_started_by_old_code_replays_the_old_branch_to_the_end(make_engine: Any) -> None:
    old = make_engine([billing_v1], [charge_a, charge_b])
    run_id = old.start_workflow(billing_v1)
    old.drain()
    new = make_engine([billing_v2], [charge_a, charge_b])
    new.send_event(run_id, "go")
    new.drain()
    # past the patch point, patched() asked again keeps the answer the replay gave: False
    assert new.wait(run_id, timeout=5) == "aa"
    assert "PatchApplied" not in _kinds(new, run_id)
    dex.testing.replay(billing_v2, new.history(run_id))


def test_a_new_run_takes_the_new_branch_and_records_the_patch_once(make_engine: Any) -> None:
    engine = make_engine([billing_v2], [charge_a, charge_b])
    run_id = engine.start_workflow(billing_v2)
    engine.drain()
    # a second engine replays the recorded block (its cache is empty) and goes on
    fresh = make_engine([billing_v2], [charge_a, charge_b])
    fresh.send_event(run_id, "go")
    fresh.drain()
    assert fresh.wait(run_id, timeout=5) == "bb"
    history = fresh.history(run_id)
    patches = [item.event for item in history if isinstance(item.event, ev.PatchApplied)]
    assert patches == [ev.PatchApplied(patch_id="use-b")]
    kinds = [item.kind for item in history]
    assert kinds.index("PatchApplied") < kinds.index("ActivityTaskCreated")
    dex.testing.replay(billing_v2, history)
    # the old code cannot replay it: the recorded patch is a step it never takes
    with pytest.raises(dex.NonDeterminismError, match="patch 'use-b'"):
        dex.testing.replay(billing_v1, history)


def test_deprecate_patch_accepts_histories_with_and_without_the_event(make_engine: Any) -> None:
    patched = make_engine([billing_v2], [charge_a, charge_b])
    with_event = patched.start_workflow(billing_v2)
    patched.drain()
    deprecated = make_engine([billing_v3], [charge_a, charge_b])
    without_event = deprecated.start_workflow(billing_v3)
    deprecated.drain()
    for run_id in (with_event, without_event):
        deprecated.send_event(run_id, "go")
    deprecated.drain()
    assert deprecated.wait(with_event, timeout=5) == "bb"
    assert deprecated.wait(without_event, timeout=5) == "bb"
    assert "PatchApplied" in _kinds(deprecated, with_event)
    assert "PatchApplied" not in _kinds(deprecated, without_event)
    for run_id in (with_event, without_event):
        dex.testing.replay(billing_v3, deprecated.history(run_id))


POISONED_IDS = ("bad\x00id", "bad\ud800id", "", "x" * 129, "no spaces", 7)


@dex.workflow
async def asks_with_poisoned_patch_ids(ctx: dex.WorkflowContext) -> list[str]:
    # the ids come from the code, as they do in real use (a NUL or surrogate cannot be input text)
    refused = []
    for patch_id in POISONED_IDS:
        for ask in (ctx.patched, ctx.deprecate_patch):
            try:
                ask(patch_id)  # type: ignore[arg-type]
            except ValueError as exc:
                refused.append(str(exc))
    return refused


@dex.workflow
async def healthy_patched(ctx: dex.WorkflowContext) -> str:
    return "new" if ctx.patched("healthy") else "old"


def test_invalid_patch_ids_are_refused_with_a_value_error(make_engine: Any) -> None:
    engine = make_engine([asks_with_poisoned_patch_ids, healthy_patched])
    run_id = engine.start_workflow(asks_with_poisoned_patch_ids)
    engine.drain()
    refused = engine.wait(run_id, timeout=5)
    assert len(refused) == 2 * len(POISONED_IDS)
    assert all(text.startswith("invalid patch id") for text in refused)
    assert "PatchApplied" not in _kinds(engine, run_id)
    healthy = engine.start_workflow(healthy_patched)
    engine.drain()
    assert engine.wait(healthy, timeout=5) == "new"


@dex.workflow
async def patches_with_nul(ctx: dex.WorkflowContext) -> str:
    return "new" if ctx.patched("nul\x00here") else "old"


def test_an_uncaught_invalid_patch_id_fails_only_its_own_run(make_engine: Any) -> None:
    engine = make_engine([patches_with_nul, healthy_patched])
    poisoned = engine.start_workflow(patches_with_nul)
    healthy = engine.start_workflow(healthy_patched)
    engine.drain()
    info = engine.get_run(poisoned)
    assert info.status is dex.RunStatus.FAILED
    assert info.failure is not None and info.failure.type == "ValueError"
    assert "invalid patch id" in info.failure.message
    assert engine.wait(healthy, timeout=5) == "new"
    after = engine.start_workflow(healthy_patched)
    engine.drain()
    assert engine.wait(after, timeout=5) == "new"
