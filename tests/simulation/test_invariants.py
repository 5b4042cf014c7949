"""Each invariant checker of the simulator catches what it must: fed a doctored history or a
contradicting sequence of grants, it raises :class:`InvariantViolation` naming its invariant;
fed the real thing, it stays quiet. A checker that cannot fail would make every simulation
pass, so these tests are what give the green simulations their meaning.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import Lease, RunRecord
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.serialization.payloads import PayloadConverter
from dex.simulation.invariants import (
    InvariantViolation,
    check_activity_results,
    check_appended,
    check_blocks,
    check_cancel_stops,
    check_events_received,
    check_history,
    check_outcomes_once,
    check_replays,
    check_sequence_numbers,
    check_single_completion,
    check_timers,
)
from dex.simulation.ledgers import LeaderLedger, LeaseLedger, StatusWatch
from dex.simulation.referee import Referee, RunLog
from dex.simulation.workload import ACTIVITIES, STANDARD_WORKLOAD, WORKFLOWS, World, approval, inhabiting, order
from dex.testing import VirtualClock

CONVERTER = PayloadConverter()
T0 = datetime(2024, 1, 1, tzinfo=dex.testing.VirtualClock().now().tzinfo)


@attrs.frozen
class Recorded:
    run_id: str
    history: list[ev.HistoryEvent]
    executions: Counter[tuple[str, str, str]]


def record(workflow: Callable[..., Any], *args: Any, events: tuple[tuple[str, Any], ...] = ()) -> Recorded:
    """Run ``workflow`` to its end on one engine, activities never failing."""
    world = World(random.Random(0), failure_rate=0.0)
    with inhabiting(world):
        engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=WORKFLOWS, activities=ACTIVITIES)
        run_id = engine.start_workflow(workflow, *args)
        engine.drain(advance_time=False)
        for event_id, payload in events:
            engine.send_event(run_id, event_id, payload)
        engine.drain()
    assert engine.get_run(run_id).status is RunStatus.COMPLETED
    return Recorded(run_id, engine.history(run_id), world.executions)


@pytest.fixture(scope="module")
def shipped() -> Recorded:
    """sim-order: charge, a timer, ship, completed."""
    return record(order, "o1", 5)


def renumbered(events: list[ev.HistoryEvent]) -> list[ev.HistoryEvent]:
    return [attrs.evolve(item, sequence_number=i) for i, item in enumerate(events, start=1)]


def index_of(history: list[ev.HistoryEvent], kind: type, nth: int = 0) -> int:
    return [i for i, item in enumerate(history) if isinstance(item.event, kind)][nth]


def raises(invariant: str) -> AbstractContextManager[Any]:
    return pytest.raises(InvariantViolation, match=rf"^\[{invariant}\]")


def test_the_recorded_history_passes_every_check(shipped: Recorded) -> None:
    check_history(shipped.run_id, shipped.history, finished=True)
    check_replays(order, shipped.run_id, shipped.history, activities=ACTIVITIES, workflows=WORKFLOWS)
    check_activity_results(
        shipped.run_id, shipped.history, shipped.executions, STANDARD_WORKLOAD.activity_result, CONVERTER
    )
    check_events_received(shipped.run_id, shipped.history, Counter())
    kinds = {item.kind for item in shipped.history}
    assert {"ActivityTaskCompleted", "TimerCreated", "TimerElapsed", "RunCompleted"} <= kinds


# -- one history ------------------------------------------------------------------------------------


def test_a_sequence_number_used_twice_or_skipped_is_caught(shipped: Recorded) -> None:
    twice = list(shipped.history)
    twice[5] = attrs.evolve(twice[5], sequence_number=5)
    with raises("unique-sequence-numbers"):
        check_sequence_numbers(shipped.run_id, twice)
    skipped = [
        attrs.evolve(item, sequence_number=item.sequence_number + (i >= 3)) for i, item in enumerate(shipped.history)
    ]
    with raises("unique-sequence-numbers"):
        check_sequence_numbers(shipped.run_id, skipped)


def test_an_event_rewritten_under_its_sequence_number_is_caught(shipped: Recorded) -> None:
    before = shipped.history[:8]
    after = list(shipped.history)
    at = index_of(after, ev.TimerCreated)
    timer = after[at].event
    assert isinstance(timer, ev.TimerCreated)
    after[at] = attrs.evolve(after[at], event=attrs.evolve(timer, fire_at=timer.fire_at + timedelta(seconds=1)))
    check_appended(shipped.run_id, before, shipped.history)
    with raises("unique-sequence-numbers"):
        check_appended(shipped.run_id, before, after)


def test_a_second_run_completed_or_none_at_all_is_caught(shipped: Recorded) -> None:
    completion = shipped.history[-2]
    again = renumbered([*shipped.history, shipped.history[-4], completion, shipped.history[-1]])
    with raises("one-terminal-state"):
        check_single_completion(shipped.run_id, again, finished=True)
    unfinished = shipped.history[:-4]  # without its last block
    check_single_completion(shipped.run_id, unfinished, finished=False)
    with raises("one-terminal-state"):
        check_single_completion(shipped.run_id, unfinished, finished=True)


def test_a_timer_that_fired_early_is_caught(shipped: Recorded) -> None:
    history = list(shipped.history)
    elapsed = index_of(history, ev.TimerElapsed)
    started = elapsed - 1
    assert isinstance(history[started].event, ev.WorkflowTaskStarted)
    timer = history[index_of(history, ev.TimerCreated)].event
    assert isinstance(timer, ev.TimerCreated)
    check_timers(shipped.run_id, history)
    history[started] = attrs.evolve(history[started], timestamp=timer.fire_at - timedelta(milliseconds=1))
    with raises("timers-not-early"):
        check_timers(shipped.run_id, history)


def test_a_second_outcome_for_one_activity_is_caught(shipped: Recorded) -> None:
    history = list(shipped.history)
    charge_done = history[index_of(history, ev.ActivityTaskCompleted, 0)]
    last_message = index_of(history, ev.ActivityTaskCompleted, 1)
    doubled = renumbered([*history[: last_message + 1], charge_done, *history[last_message + 1 :]])
    check_blocks(shipped.run_id, doubled)  # the shape is fine: only the meaning is wrong
    with raises("outcomes-once"):
        check_outcomes_once(shipped.run_id, doubled)


def test_an_outcome_for_a_step_never_taken_is_caught(shipped: Recorded) -> None:
    history = list(shipped.history)
    at = index_of(history, ev.ActivityTaskCompleted, 1)
    done = history[at].event
    assert isinstance(done, ev.ActivityTaskCompleted)
    history[at] = attrs.evolve(history[at], event=attrs.evolve(done, created_seq=2))
    with raises("outcomes-once"):
        check_outcomes_once(shipped.run_id, history)


def test_a_cancel_that_did_not_stop_the_run_is_caught(shipped: Recorded) -> None:
    history = list(shipped.history)
    at = index_of(history, ev.ActivityTaskCompleted, 1)
    cancelled = attrs.evolve(history[at], event=ev.RunCancelled(reason="stop"))
    doctored = renumbered([*history[: at + 1], cancelled, *history[at + 1 :]])
    with raises("cancel-stops-the-run"):
        check_cancel_stops(shipped.run_id, doctored)


def test_a_block_left_open_or_a_message_after_a_command_is_caught(shipped: Recorded) -> None:
    with raises("history-shape"):
        check_blocks(shipped.run_id, renumbered(shipped.history[:-1] + shipped.history[-4:-3]))
    history = list(shipped.history)
    at = index_of(history, ev.TimerCreated)
    late_message = attrs.evolve(history[at], event=ev.RunResumed())
    with raises("history-shape"):
        check_blocks(shipped.run_id, renumbered([*history[: at + 1], late_message, *history[at + 1 :]]))


def test_a_history_the_code_no_longer_produces_is_caught(shipped: Recorded) -> None:
    history = list(shipped.history)
    at = index_of(history, ev.ActivityTaskCreated)
    created = history[at].event
    assert isinstance(created, ev.ActivityTaskCreated)
    history[at] = attrs.evolve(
        history[at], event=attrs.evolve(created, input=(CONVERTER.encode("o2"), created.input[1]))
    )
    with raises("replays-deterministically"):
        check_replays(order, shipped.run_id, history, activities=ACTIVITIES, workflows=WORKFLOWS)


def test_a_recorded_result_the_code_would_not_return_is_caught(shipped: Recorded) -> None:
    # replay matches only the completion's status: the result needs its own check
    history = list(shipped.history)
    end = history[-2].event
    assert isinstance(end, ev.RunCompleted)
    history[-2] = attrs.evolve(history[-2], event=attrs.evolve(end, result=CONVERTER.encode({"status": "forged"})))
    dex.testing.replay(order, history, activities=ACTIVITIES, workflows=WORKFLOWS)
    with raises("replays-deterministically"):
        check_replays(order, shipped.run_id, history, activities=ACTIVITIES, workflows=WORKFLOWS)


def test_a_generation_that_continued_with_other_arguments_is_caught(shipped: Recorded) -> None:
    with raises("replays-deterministically"):
        check_replays(
            order,
            shipped.run_id,
            shipped.history[:-4],
            activities=ACTIVITIES,
            workflows=WORKFLOWS,
            continued_with=(CONVERTER.encode(1),),
        )


def test_a_result_no_execution_produced_is_caught(shipped: Recorded) -> None:
    with raises("activities-at-least-once"):
        check_activity_results(shipped.run_id, shipped.history, Counter(), STANDARD_WORKLOAD.activity_result, CONVERTER)
    history = list(shipped.history)
    at = index_of(history, ev.ActivityTaskCompleted)
    done = history[at].event
    assert isinstance(done, ev.ActivityTaskCompleted)
    history[at] = attrs.evolve(history[at], event=attrs.evolve(done, result=CONVERTER.encode("receipt:forged")))
    with raises("activities-at-least-once"):
        check_activity_results(
            shipped.run_id, history, shipped.executions, STANDARD_WORKLOAD.activity_result, CONVERTER
        )


def test_an_event_never_sent_or_received_twice_is_caught() -> None:
    recorded = record(approval, "a1", events=(("decision", "no"),))
    received = [item for item in recorded.history if isinstance(item.event, ev.ExternalEventReceived)]
    assert len(received) == 1
    sent = Counter({("decision", CONVERTER.encode("no").data): 1})
    check_events_received(recorded.run_id, recorded.history, sent)
    with raises("events-delivered-once"):
        check_events_received(recorded.run_id, recorded.history, Counter())
    at = recorded.history.index(received[0])
    twice = renumbered([*recorded.history[: at + 1], received[0], *recorded.history[at + 1 :]])
    with raises("events-delivered-once"):
        check_events_received(recorded.run_id, twice, sent)


# -- ledgers -----------------------------------------------------------------------------------------


def lease(owner: str, version: int, until: datetime) -> Lease:
    return Lease(owner=owner, until=until, version=version)


def test_a_task_granted_under_a_live_lease_is_caught() -> None:
    ledger = LeaseLedger()
    ledger.claimed("activity", 7, "r1", lease("a", 1, T0 + timedelta(seconds=30)), T0)
    with raises("no-two-live-leases"):
        ledger.claimed("activity", 7, "r1", lease("b", 2, T0 + timedelta(seconds=40)), T0 + timedelta(seconds=10))
    ledger.extended("activity", 7, lease("a", 1, T0), T0 + timedelta(seconds=60))
    with raises("no-two-live-leases"):  # the heartbeat pushed the lease on
        ledger.claimed("activity", 7, "r1", lease("b", 2, T0 + timedelta(minutes=2)), T0 + timedelta(seconds=45))
    ledger.claimed("activity", 7, "r1", lease("b", 2, T0 + timedelta(minutes=2)), T0 + timedelta(seconds=61))
    with raises("no-two-live-leases"):  # the old holder lost it: its completion must not apply
        ledger.completed("activity", 7, lease("a", 1, T0), applied=True)
    ledger.completed("activity", 7, lease("a", 1, T0), applied=False)
    ledger.completed("activity", 7, lease("b", 2, T0), applied=True)  # released: claimable at once
    ledger.claimed("activity", 7, "r1", lease("c", 3, T0 + timedelta(minutes=3)), T0 + timedelta(seconds=62))
    with raises("no-two-live-leases"):
        ledger.claimed("activity", 7, "r1", lease("d", 3, T0 + timedelta(minutes=9)), T0 + timedelta(minutes=5))


def test_a_completion_applied_twice_is_caught() -> None:
    ledger = LeaseLedger()
    held = lease("a", 1, T0 + timedelta(seconds=30))
    ledger.claimed("workflow", 1, "r1", held, T0)
    ledger.completed("workflow", 1, held, applied=True)
    ledger.completed("workflow", 1, held, applied=False)  # sent again after a lost acknowledgement
    with raises("duplicates-discarded"):
        ledger.completed("workflow", 1, held, applied=True)


def test_two_workflow_tasks_of_one_run_at_once_are_caught() -> None:
    ledger = LeaseLedger()
    ledger.claimed("workflow", 1, "r1", lease("a", 1, T0 + timedelta(seconds=30)), T0)
    with raises("no-two-live-leases"):
        ledger.claimed("workflow", 2, "r1", lease("b", 1, T0 + timedelta(seconds=90)), T0 + timedelta(seconds=60))
    ledger.completed("workflow", 1, lease("a", 1, T0), applied=True)
    ledger.claimed("workflow", 2, "r1", lease("b", 1, T0 + timedelta(seconds=90)), T0 + timedelta(seconds=60))


def test_two_leaders_at_once_are_caught() -> None:
    ledger = LeaderLedger()
    ttl = timedelta(seconds=15)
    ledger.granted("a", T0, ttl)
    ledger.granted("a", T0 + timedelta(seconds=5), ttl)  # a renewal
    with raises("one-leader"):
        ledger.granted("b", T0 + timedelta(seconds=19), ttl)
    ledger.granted("b", T0 + timedelta(seconds=20), ttl)  # a's lease lapsed
    ledger.released("b")
    ledger.granted("a", T0 + timedelta(seconds=21), ttl)


def run_record(run_id: str, status: RunStatus, **fields: Any) -> RunRecord:
    values: dict[str, Any] = {
        "run_id": run_id,
        "workflow_name": "w",
        "queue": "default",
        "status": status,
        "instance_id": None,
        "priority": 0,
        "concurrency_key": None,
        "labels": (),
        "parent_run_id": None,
        "created_at": T0,
    }
    if status.is_terminal:
        values["completed_at"] = T0
    values.update(fields)
    return RunRecord(**values)


def test_a_status_that_leaves_a_terminal_one_or_moves_illegally_is_caught() -> None:
    watch = StatusWatch(timedelta(minutes=5))
    watch.observe({"r": run_record("r", RunStatus.CREATED)}, T0)
    watch.observe({"r": run_record("r", RunStatus.SUSPENDED)}, T0)  # through RUNNING between two looks
    watch.observe({"r": run_record("r", RunStatus.COMPLETED)}, T0)
    with raises("terminal-is-final"):
        watch.observe({"r": run_record("r", RunStatus.RUNNING)}, T0)
    with raises("terminal-is-final"):
        watch.observe({"r": run_record("r", RunStatus.COMPLETED, custom_status="changed")}, T0)
    with raises("terminal-is-final"):
        StatusWatch(timedelta(minutes=5)).observe({"r": run_record("r", RunStatus.FAILED, completed_at=None)}, T0)


def test_two_runs_under_one_concurrency_key_or_instance_id_are_caught() -> None:
    watch = StatusWatch(timedelta(minutes=5))
    keyed = {
        "a": run_record("a", RunStatus.RUNNING, concurrency_key="k"),
        "b": run_record("b", RunStatus.CREATED, concurrency_key="k"),
        "c": run_record("c", RunStatus.COMPLETED, concurrency_key="k"),
    }
    watch.observe(keyed, T0)
    with raises("concurrency-key"):
        watch.observe({**keyed, "b": run_record("b", RunStatus.SUSPENDED, concurrency_key="k")}, T0)
    with raises("instance-id"):
        StatusWatch(timedelta(minutes=5)).observe(
            {
                "a": run_record("a", RunStatus.CREATED, instance_id="i"),
                "b": run_record("b", RunStatus.RUNNING, instance_id="i"),
            },
            T0,
        )


def test_a_run_deleted_while_live_or_before_its_retention_is_caught() -> None:
    watch = StatusWatch(timedelta(minutes=5))
    watch.observe({"live": run_record("live", RunStatus.RUNNING), "done": run_record("done", RunStatus.COMPLETED)}, T0)
    with raises("retention"):
        watch.observe({"live": None}, T0 + timedelta(hours=1))
    with raises("retention"):
        watch.observe({"done": None}, T0 + timedelta(minutes=4))
    watch.observe({"done": None}, T0 + timedelta(minutes=6))
    with raises("terminal-is-final"):
        watch.observe({"done": run_record("done", RunStatus.COMPLETED)}, T0 + timedelta(minutes=7))


# -- the referee's end checks -------------------------------------------------------------------------


def test_a_request_that_never_reached_the_history_is_caught(shipped: Recorded) -> None:
    referee = Referee(timedelta(minutes=5))
    last_start = shipped.history[-4].timestamp
    log = RunLog(shipped.run_id, "sim-order", None, list(shipped.history))
    log.requests.append((RunStatus.CANCELLED, last_start))  # as the last task started: it may miss it
    referee._check_requests_honoured(log)
    log.requests.append((RunStatus.SUSPENDED, last_start - timedelta(seconds=1)))
    with raises("requests-honoured"):
        referee._check_requests_honoured(log)


def test_a_duplicate_delivery_that_applied_is_caught() -> None:
    referee = Referee(timedelta(minutes=5))
    referee._delivered(("activity", object()), applied=False, again=True)
    with raises("duplicates-discarded"):
        referee._delivered(("activity", object()), applied=True, again=True)


def test_a_child_result_its_child_never_returned_is_caught(shipped: Recorded) -> None:
    referee = Referee(timedelta(minutes=5))
    child = RunLog("child", "sim-leaf", "parent", list(shipped.history))
    referee.runs["child"] = child
    end = shipped.history[-2].event
    assert isinstance(end, ev.RunCompleted) and end.result is not None
    told = ev.ChildRunCompleted(child_run_id="child", result=end.result)
    parent = RunLog("parent", "sim-parent", None, [attrs.evolve(shipped.history[0], event=told)])
    referee._check_children(parent)
    forged = ev.ChildRunCompleted(child_run_id="child", result=CONVERTER.encode(0))
    with raises("child-outcomes"):
        referee._check_children(RunLog("parent", "sim-parent", None, [attrs.evolve(shipped.history[0], event=forged)]))
