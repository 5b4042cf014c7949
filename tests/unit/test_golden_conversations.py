"""Golden histories of docs/reference/contract.md §14 (``tests/golden/conversations/*.binpb``):
runs recorded through ``decide()`` by the workflows below must keep reading and replaying.

Each file holds a ``dex.v1.WorkflowHistory``. Record them (only to add one: rewriting a file
hides exactly the incompatibility it exists to catch) with
``PYTHONPATH=. python -m tests.unit.test_golden_conversations``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

import dex
from dex.domain import events as ev
from dex.domain.state import fold
from dex.serialization.history import encode_history
from tests.unit.pure_runs import CONVERTER, T0, PureRun

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden" / "conversations"


@dex.activity(name="golden-conv-charge")
def charge(order: str) -> str:
    return f"receipt-{order}"


@dex.activity(name="golden-conv-release")
def release(order: str) -> str:
    return f"released-{order}"


@dex.activity(name="golden-conv-price")
def price(item: str) -> int:
    return len(item)


ACTIVITIES = (charge, release, price)


@dex.workflow(name="golden-conversation")
async def conversation(ctx: dex.WorkflowContext, order: str) -> dict[str, Any]:
    items: list[str] = []

    @ctx.on_update("add")
    async def add(item: str) -> int:
        items.append(item)
        return int(await ctx.activity(price, item))

    @add.validator
    def _(item: str) -> None:
        if not item:
            raise ValueError("an item needs a name")

    @ctx.on_query("items")
    def current() -> list[str]:
        return list(items)

    @ctx.on_event("note")
    def note(text: str) -> None:
        items.append(f"note: {text}")

    ctx.publish("stage", "collecting")
    ctx.set_labels({"stage": "collecting", "team": None})
    spare = ctx.sleep(600)
    spare.cancel()
    helper = ctx.start_workflow("golden-conv-helper", order, timeout=timedelta(hours=2))
    kid = ctx.child("golden-conv-kid", order, timeout=timedelta(hours=1))
    kid.cancel()
    index, _value = await ctx.first(ctx.wait_for_event("go"), ctx.sleep(3600))
    await ctx.wait_condition(lambda: len(items) >= 2, timeout=timedelta(hours=1))
    for i in range(2):
        await ctx.write_stream("progress", {"step": i, "first": index})
    ctx.close_stream("progress")
    ctx.publish("stage", "paying")
    try:
        return {"receipt": await ctx.activity(charge, order), "items": items, "helper": helper}
    except dex.CancelledError:
        await ctx.activity(release, order)
        raise


def record_conversation() -> PureRun:
    run = PureRun(conversation, "o7", activities=ACTIVITIES, labels=(("team", "a"),), deadline=T0 + timedelta(days=1))
    run.settle()
    run.update("add", "", update_id="refused")  # rejected by the validator: no trace
    run.update("add", "lamp", update_id="u1")
    run.send_event("note", "fragile")
    run.step()
    run.run_activities()
    run.step()  # u1 answered
    run.send_event("go", "now")
    run.step()  # first(), the condition, the streams, the charge's task
    run.update("add", "shade", update_id="u2")
    run.step()
    run.cancel("changed my mind")  # while the charge and u2's activity are pending
    run.settle()  # the cleanup runs live; u2 fails with the cancel
    return run


def record_terminated() -> PureRun:
    run = PureRun(conversation, "o8", activities=ACTIVITIES)
    run.settle()
    run.update("add", "lamp", update_id="u1")
    run.step()
    run.terminate("stuck")
    run.step()
    return run


RECORDERS: dict[str, Callable[[], PureRun]] = {"conversation": record_conversation, "terminated": record_terminated}

REQUIRED_KINDS = {
    "conversation": {
        "UpdateAccepted",
        "UpdateCompleted",
        "ValuePublished",
        "StreamItemWritten",
        "StreamClosed",
        "LabelsChanged",
        "CancelRequested",
        "DetachedRunCreated",
        "ChildRunCreated",
        "RunCancelled",
        "ActivityTaskCreated",
    },
    "terminated": {"UpdateAccepted", "UpdateCompleted", "RunTerminated"},
}
OUTCOMES = {"conversation": dex.RunStatus.CANCELLED, "terminated": dex.RunStatus.TERMINATED}


def golden(name: str) -> list[ev.HistoryEvent]:
    return dex.testing.load_history((GOLDEN_DIR / f"{name}.binpb").read_bytes())


def test_every_golden_conversation_file_has_a_recorder() -> None:
    assert {path.stem for path in GOLDEN_DIR.glob("*.binpb")} == set(RECORDERS) == set(REQUIRED_KINDS)


@pytest.mark.parametrize("name", sorted(RECORDERS))
def test_a_golden_conversation_replays_and_folds_to_its_outcome(name: str) -> None:
    history = golden(name)
    assert REQUIRED_KINDS[name] <= {item.kind for item in history}
    state = fold(history)  # also: nothing after the terminal event, each update answered once
    assert state.status is OUTCOMES[name]
    assert state.pending_updates == ()
    assert history[-2].kind == "RunCompleted" and history[-1].kind == "WorkflowTaskCompleted"
    dex.testing.replay(conversation, history, activities=ACTIVITIES)


def test_the_golden_conversation_says_what_it_did() -> None:
    history = golden("conversation")
    created = history[0].event
    assert isinstance(created, ev.RunCreated) and created.deadline == T0 + timedelta(days=1)
    accepted = [item.event.update_id for item in history if isinstance(item.event, ev.UpdateAccepted)]
    assert accepted == ["u1", "u2"]  # the refused request left no trace
    state = fold(history)
    assert state.labels == (("stage", "collecting"),)
    assert [(key, CONVERTER.decode(value)) for key, value in state.published] == [("stage", "paying")]
    assert state.streams == (("progress", 2),) and state.closed_streams == {"progress"}
    (child,) = [item.event for item in history if isinstance(item.event, ev.ChildRunCreated)]
    assert child.deadline == T0 + timedelta(hours=1)
    (detached,) = [item.event for item in history if isinstance(item.event, ev.DetachedRunCreated)]
    assert detached.deadline == T0 + timedelta(hours=2)
    # the cleanup ran live: its activity completed before the run ended
    kinds = [item.kind for item in history]
    cleanup = next(
        i
        for i, item in enumerate(history)
        if isinstance(item.event, ev.ActivityTaskCreated) and item.event.name == "golden-conv-release"
    )
    assert cleanup > kinds.index("RunCancelled")
    assert kinds.index("RunCompleted") > cleanup


@pytest.mark.parametrize("name", sorted(RECORDERS))
def test_recording_again_gives_the_golden_history(name: str) -> None:
    # the recording is deterministic: a difference means today's decide() writes another history
    # (stack traces aside: they name the files of the checkout that recorded them)
    run = RECORDERS[name]()
    assert [without_traces(item) for item in run.history] == [without_traces(item) for item in golden(name)]


def without_traces(item: ev.HistoryEvent) -> ev.HistoryEvent:
    event = item.event
    failure = getattr(event, "failure", None)
    if failure is None:
        return item
    return attrs.evolve(item, event=attrs.evolve(event, failure=_untraced(failure)))  # type: ignore[misc]


def _untraced(failure: dex.FailureInfo) -> dex.FailureInfo:
    cause = None if failure.cause is None else _untraced(failure.cause)
    return attrs.evolve(failure, stack_trace="", cause=cause)


def main(argv: list[str]) -> int:
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    for name, recorder in RECORDERS.items():
        if argv and name not in argv:
            continue
        run = recorder()
        (GOLDEN_DIR / f"{name}.binpb").write_bytes(encode_history(run.run_id, run.definition.name, run.history))
        print(f"wrote {name}.binpb: {len(run.history)} events, {run.completion.status.value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
