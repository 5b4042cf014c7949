"""Workflows that converse and end well in the deterministic simulation (docs/reference/contract.md §14).

The conversation workload (``dex/simulation/conversation_workload.py``) runs carts that take
updates while they finish, sagas cancelled (by clients or their deadlines) while an activity
completes, with a cleanup step the deadline may fire during, and races of a ping, a timer and an
activity (``ctx.first``) beside event handlers — on nodes that crash, lose the store and redeliver.
Besides every invariant of the simulator, each simulation checks the conversation invariants;
each of those is shown here to fail on a doctored history, so that a green simulation means
something. A few fixed schedules run in the default suite; ``-m slow`` explores many more.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from hypothesis import given, note, settings

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.domain import events as ev
from dex.domain.task import UpdateAnswer, split_blocks
from dex.serialization.payloads import PayloadConverter
from dex.simulation import FAULT_KINDS, Fault, Simulator
from dex.simulation.conversation_workload import CONVERSATION_WORKLOAD, cart, race, saga
from dex.simulation.invariants import (
    InvariantViolation,
    check_cancel_stops,
    check_cleanup_before_end,
    check_events_not_lost,
    check_history,
    check_nothing_after_end,
    check_updates_answered,
)
from dex.simulation.workload import World, inhabiting
from dex.testing import VirtualClock
from tests.simulation.test_simulation import SIMULATION, STEPS, fault_schedules, seeds

CONVERTER = PayloadConverter()
EVERY_FAULT = [Fault(10 + 20 * i, kind, i) for i, kind in enumerate(sorted(FAULT_KINDS))]
UNCACHED = {"engine_options": {"executor_cache_size": 0}}


def converse(seed: int, faults: list[Fault], *, noting: bool = False, **options: Any) -> Simulator:
    simulator = Simulator(seed, faults, steps=STEPS, max_runs=6, workload=CONVERSATION_WORKLOAD, **options)
    if noting:  # (hypothesis prints it with a failing example; a failure names it anyway)
        note(f"replay with: {simulator.reproduction()}")
    simulator.run()
    return simulator


# -- seeded simulations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "faults", "options"),
    [
        (0, [], {}),
        (1, EVERY_FAULT, {}),
        (4, [], {}),
        (5, EVERY_FAULT, UNCACHED),
        (9, EVERY_FAULT, {}),
        (12, EVERY_FAULT, {"inline": True}),
        (21, [Fault(30, "crash", 0), Fault(60, "crash-mid-flush", 1), Fault(90, "lease-expiry", 0)], UNCACHED),
        (33, [Fault(20, "write-ack-lost", 1), Fault(45, "crash-after-execute", 2), Fault(80, "duplicate", 0)], {}),
    ],
    ids=lambda value: None if isinstance(value, (list, dict)) else str(value),
)
def test_conversations_keep_every_invariant_under_these_schedules(
    seed: int, faults: list[Fault], options: dict[str, Any]
) -> None:
    converse(seed, faults, **options)


@settings(SIMULATION, max_examples=40)
@given(seeds, fault_schedules)
def test_conversations_keep_every_invariant_under_some_schedules(seed: int, faults: list[Fault]) -> None:
    converse(seed, faults, noting=True)


@pytest.mark.slow
@settings(SIMULATION, max_examples=1500)
@given(seeds, fault_schedules)
def test_conversations_keep_every_invariant_under_many_schedules(seed: int, faults: list[Fault]) -> None:
    converse(seed, faults, noting=True)


@pytest.mark.slow
@settings(SIMULATION, max_examples=700)
@given(seeds, fault_schedules)
def test_conversations_keep_every_invariant_without_the_executor_cache(seed: int, faults: list[Fault]) -> None:
    converse(seed, faults, noting=True, **UNCACHED)


@pytest.mark.slow
@settings(SIMULATION, max_examples=700)
@given(seeds, fault_schedules)
def test_conversations_keep_every_invariant_with_inline_activities(seed: int, faults: list[Fault]) -> None:
    converse(seed, faults, noting=True, inline=True)


def test_the_conversations_race_what_they_must() -> None:
    """Not vacuous: across a few seeds, with and without faults, updates are answered, refused by
    a validator, answered with a failure because the cart ended while their handler ran, and
    refused because it ended before taking them; a cancel and an activity's result reach one
    saga task, cleanups are scheduled by the task that takes the cancel, deadlines cancel sagas
    and fire during a cleanup; losers of ``first`` are cancelled; event handlers take notes."""
    seen: Counter[str] = Counter()
    for seed in range(20):
        simulator = converse(seed, EVERY_FAULT if seed % 2 else [])
        for log in simulator.referee.runs.values():
            for told in log.updates.values():
                seen.update(
                    "answered"
                    if a.failure is None
                    else "ended while handled"
                    if not a.rejected and "ended" in a.failure.message
                    else "refused, ended"
                    if a.rejected and a.failure.type == "InvalidStateError"
                    else "refused"
                    if a.rejected
                    else "failed"
                    for a in told
                )
            _created, blocks = split_blocks(log.history)
            for block in blocks:
                messages = {type(m) for _seq, m in block.messages}
                if ev.RunCancelled in messages and messages & {ev.ActivityTaskCompleted, ev.ActivityTaskFailed}:
                    seen["cancel with a result"] += 1
                if ev.RunCancelled in messages and any(
                    isinstance(c.event, ev.ActivityTaskCreated) and c.event.name == "sim-refund" for c in block.commands
                ):
                    seen["cleanup"] += 1
                if ev.ExternalEventReceived in messages and log.workflow_name == "sim-race":
                    seen["race events"] += 1
            reasons = [item.event.reason for item in log.history if isinstance(item.event, ev.RunCancelled)]
            if "timeout" in reasons:
                seen["deadline"] += 1
                if reasons.index("timeout") > 0:
                    seen["deadline during cleanup"] += 1
            seen["loser cancelled"] += sum(isinstance(item.event, ev.CancelRequested) for item in log.history)
    wanted = (
        "answered",
        "ended while handled",
        "refused, ended",
        "refused",
        "cancel with a result",
        "cleanup",
        "deadline",
        "deadline during cleanup",
        "loser cancelled",
        "race events",
    )
    assert [what for what in wanted if not seen[what]] == [], seen
    # without the executor cache every task replays its run from the start: races whose later
    # tasks replayed a ctx.first (and the handlers) decided in an earlier one, under crashes
    replayed = 0
    for seed in range(4):
        simulator = converse(seed, EVERY_FAULT, **UNCACHED)
        for log in simulator.referee.runs.values():
            _created, blocks = split_blocks(log.history)
            replayed += log.workflow_name == "sim-race" and len(blocks) > 1
    assert replayed > 0


# -- each conversation invariant catches what it must --------------------------------------------------


@attrs.frozen
class Recorded:
    engine: dex.Engine
    run_id: str
    history: list[ev.HistoryEvent]


@pytest.fixture
def world() -> Iterator[World]:
    with inhabiting(World(random.Random(0), failure_rate=0.0)) as world:
        yield world


def make_engine() -> dex.Engine:
    return dex.Engine(
        InMemoryAdapter(clock=VirtualClock()),
        workflows=CONVERSATION_WORKLOAD.workflows,
        activities=CONVERSATION_WORKLOAD.activities,
    )


def renumbered(events: list[ev.HistoryEvent]) -> list[ev.HistoryEvent]:
    return [attrs.evolve(item, sequence_number=i) for i, item in enumerate(events, start=1)]


def raises(invariant: str) -> Any:
    return pytest.raises(InvariantViolation, match=rf"^\[{invariant}\]")


def test_an_update_answered_twice_never_or_otherwise_than_told_is_caught(world: World) -> None:
    engine = make_engine()
    run_id = engine.start_workflow(cart, 1)
    assert engine.update(run_id, "add", 3, update_id="u1") == 1
    history = engine.history(run_id)
    told = {"u1": [engine.store.update_answer(run_id, "u1")]}
    assert told["u1"][0] is not None and not told["u1"][0].rejected
    check_updates_answered(run_id, [history], told, ended=True)
    at = next(i for i, item in enumerate(history) if isinstance(item.event, ev.UpdateCompleted))
    answer = history[at]
    with raises("updates-answered-once"):  # answered twice
        check_updates_answered(run_id, [renumbered([*history[: at + 1], answer, *history[at + 1 :]])], told, ended=True)
    with raises("updates-answered-once"):  # never answered
        check_updates_answered(run_id, [renumbered([*history[:at], *history[at + 1 :]])], told, ended=True)
    with raises("updates-answered-once"):  # its caller was told another result
        check_updates_answered(
            run_id, [history], {"u1": [UpdateAnswer(update_id="u1", result=CONVERTER.encode(2))]}, ended=True
        )
    with raises("updates-answered-once"):  # its caller never got the answer: lost
        check_updates_answered(run_id, [history], {"u1": []}, ended=True)
    check_updates_answered(run_id, [history], {"u1": []}, ended=False)  # still waiting: fine
    with raises("updates-answered-once"):  # an update the run never accepted, answered as if it had
        check_updates_answered(
            run_id, [history], {**told, "u2": [UpdateAnswer(update_id="u2", result=None)]}, ended=True
        )
    refused = UpdateAnswer(
        update_id="u2", failure=dex.FailureInfo(type="InvalidStateError", message="ended"), rejected=True
    )
    check_updates_answered(run_id, [history], {**told, "u2": [refused]}, ended=True)


def test_an_event_taken_by_a_losing_wait_is_caught(world: World) -> None:
    engine = make_engine()
    run_id = engine.start_workflow(race, 2)
    for n in (11, 12, 13):  # all there when its code first runs: each round's ping wins
        engine.send_event(run_id, "ping", n)
    engine.drain()
    result = engine.wait(run_id, timeout=5)
    history = engine.history(run_id)
    unread = engine.get_run(run_id).unread_events
    assert result["read"] == [11, 12] and unread == 1  # 13 reserved by the last round's new wait
    check_events_not_lost(run_id, history, "ping", [11, 12], unread, CONVERTER)
    with raises("events-not-taken-by-losers"):  # a later wait got the second: the first was taken
        check_events_not_lost(run_id, history, "ping", [12, 13], 1, CONVERTER)
    with raises("events-not-taken-by-losers"):  # one vanished: neither read nor unread
        check_events_not_lost(run_id, history, "ping", [11, 12], 0, CONVERTER)


def test_anything_recorded_after_the_end_is_caught(world: World) -> None:
    engine = make_engine()
    run_id = engine.start_workflow(race, 1)
    engine.send_event(run_id, "ping", 7)
    engine.drain()
    history = engine.history(run_id)
    streams = {"pings": [value for _at, value in engine.store.read_stream(run_id, "pings", 0, 100).items]}
    assert streams["pings"] == [CONVERTER.encode(7)]
    check_nothing_after_end(run_id, [history], streams)
    late = ev.HistoryEvent(
        sequence_number=0,
        timestamp=history[-1].timestamp,
        event=ev.StreamItemWritten(key="pings", value=CONVERTER.encode(8)),
    )
    with raises("nothing-after-the-end"):
        check_nothing_after_end(run_id, [renumbered([*history[:-1], late, history[-1]])], None)
    with raises("nothing-after-the-end"):  # the store kept an item the history never wrote
        check_nothing_after_end(run_id, [history], {"pings": [*streams["pings"], CONVERTER.encode(8)]})
    with raises("nothing-after-the-end"):  # or lost one it wrote
        check_nothing_after_end(run_id, [history], {"pings": []})


def test_a_cancelled_run_that_ended_before_its_cleanup_is_caught(world: World) -> None:
    engine = make_engine()
    run_id = engine.start_workflow(saga, "s1", 5)
    engine.drain(advance_time=False)  # charged, asleep
    engine.cancel(run_id, "stop")
    engine.drain(advance_time=False)
    assert engine.get_run(run_id).status is dex.RunStatus.CANCELLED
    history = engine.history(run_id)
    check_history(run_id, history, finished=True, cleanup="sim-refund")
    check_cleanup_before_end(run_id, history, "sim-refund")
    with raises("cancel-stops-the-run"):  # without a cleanup, the task that took the cancel must end the run
        check_cancel_stops(run_id, history)
    refund = next(
        i
        for i, item in enumerate(history)
        if isinstance(item.event, ev.ActivityTaskCreated) and item.event.name == "sim-refund"
    )
    created = history[refund].event
    assert isinstance(created, ev.ActivityTaskCreated)
    renamed = [
        *history[:refund],
        attrs.evolve(history[refund], event=attrs.evolve(created, name="sim-ship")),
        *history[refund + 1 :],
    ]
    with raises("cleanup-before-the-end"):  # no cleanup step at all
        check_cleanup_before_end(run_id, renamed, "sim-refund")
    with raises("cancel-stops-the-run"):  # nor from the task that took the cancel
        check_cancel_stops(run_id, renamed, cleanup="sim-refund")
    outcome = next(
        i
        for i, item in enumerate(history)
        if isinstance(item.event, ev.ActivityTaskCompleted)
        and item.event.created_seq == history[refund].sequence_number
    )
    with raises("cleanup-before-the-end"):  # ended before the cleanup's outcome was recorded
        check_cleanup_before_end(run_id, renumbered([*history[:outcome], *history[outcome + 1 :]]), "sim-refund")
