"""Replay properties over random workflow programs.

One generic workflow, :func:`interpreter`, runs a *program* passed as its JSON argument: a
list of steps (an activity, a fan-out of activities through ``ctx.gather``, a timer, a wait
for an external event, a child workflow, a side effect). Hypothesis generates programs and
how to drive them (which events are sent before the run starts and which later, whether the
run is suspended or cancelled, where engines crash), and every recorded history must:

1. replay with ``dex.testing.replay``; and from every prefix cut at a workflow-task boundary,
   ``decide`` must produce exactly the next recorded block (the same commands, numbers, times);
2. come out the same when the engines driving it are thrown away and re-created part way;
3. fold with ``dex.domain.state.fold`` into the status its ``RunCompleted`` records;
4. fail replay with a ``NonDeterminismError`` naming both steps once the program changes.

Known engine bugs found here are pinned by ``xfail(strict=True)`` tests at the end.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import attrs
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.definitions.registry import ACTIVITY_ATTRIBUTE, WORKFLOW_ATTRIBUTE
from dex.domain import events as ev
from dex.domain.definitions import ActivityDefinition, WorkflowDefinition
from dex.domain.state import fold
from dex.domain.status import RunStatus, transition
from dex.domain.task import InboxMessage, decide, replay_history, split_blocks
from dex.serialization.payloads import PayloadConverter
from dex.testing import VirtualClock

# -- the activities and workflows that programs use ---------------------------------------------

# No randomisation: a retry's delay is then a function of the attempt alone, so two drivings of
# one program see the same timestamps.
FLAKY_RETRY = dex.RetryPolicy(
    initial_delay=timedelta(seconds=1),
    multiplier=2.0,
    randomization_factor=0.0,
    max_delay=timedelta(seconds=30),
    max_attempts=10,  # room for the failures a program asks for plus attempts lost to crashes
)
DOOMED_RETRY = dex.RetryPolicy(initial_delay=timedelta(seconds=1), randomization_factor=0.0, max_attempts=2)

# Executions of ``flaky`` per (run, step key), so that it fails a set number of *executions*:
# an attempt whose claim is lost in a crash never ran and does not count.
FLAKY_EXECUTIONS: Counter[tuple[str, str]] = Counter()
# Calls of the side-effect function per (run, step index).
SIDE_EFFECT_CALLS: Counter[tuple[str, int]] = Counter()


@dex.activity(name="echo")
def echo(x: int) -> int:
    return x


@dex.activity(name="shout")
def shout(x: int) -> int:
    return x * 10


@dex.activity(name="flaky", retry=FLAKY_RETRY)
def flaky(key: str, x: int, fails: int) -> int:
    run_id = dex.activity_context().run_id
    FLAKY_EXECUTIONS[(run_id, key)] += 1
    if FLAKY_EXECUTIONS[(run_id, key)] <= fails:
        raise RuntimeError(f"flaky {key} fails on purpose")
    return x + 1000


@dex.activity(name="doomed", retry=DOOMED_RETRY)
def doomed(x: int) -> int:
    raise RuntimeError(f"doomed {x}")


ACTIVITIES = (echo, shout, flaky, doomed)
ACTIVITY_BY_NAME: dict[str, Callable[..., Any]] = {"echo": echo, "shout": shout, "flaky": flaky, "doomed": doomed}


@dex.workflow(name="child-wf")
async def child_wf(ctx: dex.WorkflowContext, spec: dict[str, Any]) -> int:
    value: int = await ctx.activity(echo, spec["arg"])
    if spec["sleep"]:
        await ctx.sleep(spec["sleep"])
    if spec["fail"]:
        raise ValueError("child asked to fail")
    return value + 1


def side_effect_value(run_id: str, index: int, arg: int) -> int:
    SIDE_EFFECT_CALLS[(run_id, index)] += 1
    return arg * 7


def _activity_call(ctx: dex.WorkflowContext, key: str, spec: dict[str, Any]) -> Any:
    fn = ACTIVITY_BY_NAME[spec["fn"]]
    if spec["fn"] == "flaky":
        return ctx.activity(fn, key, spec["arg"], spec["fails"])
    return ctx.activity(fn, spec["arg"])


async def _run_step(ctx: dex.WorkflowContext, index: int, step: dict[str, Any]) -> Any:
    op = step["op"]
    if op == "act":
        try:
            return await _activity_call(ctx, str(index), step)
        except dex.ActivityFailedError as exc:
            return {"failed": exc.failure.message}
    if op == "gather":
        calls = [_activity_call(ctx, f"{index}.{j}", item) for j, item in enumerate(step["items"])]
        return await ctx.gather(*calls)
    if op == "timer":
        before = ctx.now()
        await ctx.sleep(step["seconds"])
        return {"slept_enough": ctx.now() - before >= timedelta(seconds=step["seconds"])}
    if op == "wait":
        before = ctx.now()
        try:
            return {"got": await ctx.wait_for_event(step["id"], timeout=step["timeout"])}
        except dex.WaitTimeoutError:
            return {"timeout_after_enough": ctx.now() - before >= timedelta(seconds=step["timeout"])}
    if op == "child":
        try:
            return await ctx.child(child_wf, {"arg": step["arg"], "sleep": step["sleep"], "fail": step["fail"]})
        except dex.ChildWorkflowFailedError as exc:
            return {"child_failed": exc.failure.message}
    if op == "side":
        return ctx.side_effect(step["name"], side_effect_value, ctx.run_id, index, step["arg"])
    raise AssertionError(f"unknown step {step!r}")


@dex.workflow(name="interpreter")
async def interpreter(ctx: dex.WorkflowContext, program: dict[str, Any]) -> list[Any]:
    """Run ``program["steps"]`` one after the other and return what each gave."""
    results = []
    for index, step in enumerate(program["steps"]):
        results.append(await _run_step(ctx, index, step))
    if program["end"] == "raise":
        raise RuntimeError("program asked to fail")
    return results


WORKFLOWS = (interpreter, child_wf)
DEFINITIONS: dict[str, WorkflowDefinition] = {d.name: d for d in (getattr(fn, WORKFLOW_ATTRIBUTE) for fn in WORKFLOWS)}
ACTIVITY_DEFINITIONS: dict[str, ActivityDefinition] = {
    d.name: d for d in (getattr(fn, ACTIVITY_ATTRIBUTE) for fn in ACTIVITIES)
}
CONVERTER = PayloadConverter()


# -- what the program should return, computed without the engine ----------------------------------


def expected_activity(spec: dict[str, Any]) -> Any:
    match spec["fn"]:
        case "echo":
            return spec["arg"]
        case "shout":
            return spec["arg"] * 10
        case "flaky":
            return spec["arg"] + 1000
        case "doomed":
            return {"failed": f"doomed {spec['arg']}"}
    raise AssertionError(spec)


def lost_last_attempt(step: dict[str, Any], value: Any) -> bool:
    """A ``doomed`` step whose last allowed attempt was lost in a crash: a lost attempt counts
    against ``max_attempts``, so no further attempt runs and the step fails LeaseExpiredError."""
    return (
        step["fn"] == "doomed"
        and isinstance(value, dict)
        and str(value.get("failed", "")).startswith("attempt ")
        and "lost its lease" in value["failed"]
    )


def check_result(
    program: dict[str, Any], result: list[Any], sent: dict[str, list[Any]], *, lossy: bool = False
) -> None:
    """Every step gave what the model says; waits got the sent payloads FIFO per event id.

    ``lossy``: crashes lost claims, so a ``doomed`` step may have lost its last attempt."""
    assert len(result) == len(program["steps"])
    received: dict[str, list[Any]] = defaultdict(list)
    for step, value in zip(program["steps"], result, strict=True):
        match step["op"]:
            case "act":
                assert value == expected_activity(step) or (lossy and lost_last_attempt(step, value))
            case "gather":
                assert value == [expected_activity(item) for item in step["items"]]
            case "timer":
                assert value == {"slept_enough": True}
            case "wait":
                if "got" in value:
                    received[step["id"]].append(value["got"])
                else:
                    assert step["timeout"] is not None, "a wait without timeout timed out"
                    assert value == {"timeout_after_enough": True}
            case "child":
                assert value == ({"child_failed": "child asked to fail"} if step["fail"] else step["arg"] + 1)
            case "side":
                assert value == step["arg"] * 7
    for event_id, payloads in received.items():
        # a wait takes the oldest buffered payload: the k-th wait that got one got the k-th sent
        assert payloads == sent[event_id][: len(payloads)]


# -- generating programs -----------------------------------------------------------------------


def activity_specs(*, may_fail_for_good: bool) -> st.SearchStrategy[dict[str, Any]]:
    names = ["echo", "shout", "flaky", "doomed"] if may_fail_for_good else ["echo", "shout", "flaky"]
    return st.builds(
        lambda fn, arg, fails: {"op": "act", "fn": fn, "arg": arg, "fails": fails if fn == "flaky" else 0},
        st.sampled_from(names),
        st.integers(0, 50),
        st.integers(0, 2),
    )


# A gather member that fails for good would leave its siblings pending while the program goes
# on; when their late results land then depends on timing, so gathers hold only steps that
# eventually succeed (a lone "doomed" step still covers ActivityTaskFailed).
gather_steps = st.lists(activity_specs(may_fail_for_good=False), min_size=1, max_size=3).map(
    lambda items: {"op": "gather", "items": items}
)
timer_steps = st.sampled_from([0, 1, 5, 90]).map(lambda seconds: {"op": "timer", "seconds": seconds})
wait_steps = st.builds(
    lambda event_id, timeout, send: {"op": "wait", "id": event_id, "timeout": timeout, "send": send},
    st.sampled_from(["a", "b"]),
    st.sampled_from([None, 2, 30]),
    st.sampled_from(["early", "late", "never"]),
)
child_steps = st.builds(
    lambda arg, sleep, fail: {"op": "child", "arg": arg, "sleep": sleep, "fail": fail},
    st.integers(0, 50),
    st.sampled_from([0, 3]),
    st.booleans(),
)
side_steps = st.builds(
    lambda name, arg: {"op": "side", "name": name, "arg": arg},
    st.sampled_from(["pick", "roll"]),
    st.integers(0, 50),
)


def _fix_waits(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Make every wait without a timeout sure to get a payload: then no run waits forever.

    Each wait takes at most one payload, so when every wait on an id has its payload sent,
    the k-th wait on that id finds one at the latest once the late events are sent.
    """
    needs_all = {s["id"] for s in steps if s["op"] == "wait" and s["timeout"] is None}
    return [
        {**s, "send": "late"} if s["op"] == "wait" and s["id"] in needs_all and s["send"] == "never" else s
        for s in steps
    ]


@st.composite
def programs(
    draw: st.DrawFn, *, waits: bool = True, endings: Sequence[str] = ("return", "return", "return", "raise")
) -> dict[str, Any]:
    kinds = [activity_specs(may_fail_for_good=True), gather_steps, timer_steps, child_steps, side_steps]
    if waits:
        kinds.append(wait_steps)
    steps = draw(st.lists(st.one_of(kinds), min_size=1, max_size=7))
    return {"steps": _fix_waits(steps), "end": draw(st.sampled_from(endings))}


@attrs.frozen
class Scenario:
    """A program and how a test drives its run."""

    program: dict[str, Any]
    suspend: bool = False
    cancel: bool = False

    def sends(self, when: str) -> list[tuple[str, dict[str, int]]]:
        return [
            (step["id"], {"wait": index})
            for index, step in enumerate(self.program["steps"])
            if step["op"] == "wait" and step["send"] == when
        ]

    def sent(self) -> dict[str, list[Any]]:
        by_id: dict[str, list[Any]] = defaultdict(list)
        for event_id, payload in self.sends("early") + self.sends("late"):
            by_id[event_id].append(payload)
        return by_id


scenarios = st.builds(
    Scenario,
    program=programs(),
    suspend=st.booleans(),
    cancel=st.sampled_from([False, False, False, True]),
)


# -- driving a run, with or without crashes -------------------------------------------------------

BENIGN = "between-rounds"
# a crash that loses work in flight: the claims come back when their leases expire
LOSSY = ("claim-workflow-tasks", "claim-activity-tasks", "claim-all", "lose-workflow-results", "lose-activity-results")

Crash = tuple[int, str]  # (drain steps to take first, what the dying engine leaves behind)


@attrs.frozen
class Recorded:
    """One driven run: its id, final state and history, and its children's."""

    run_id: str
    info: dex.RunInfo
    history: list[ev.HistoryEvent]
    children: list[tuple[dex.RunInfo, list[ev.HistoryEvent]]]


def _step(engine: dex.Engine, clock: VirtualClock, advance_time: bool) -> bool:
    """One step of ``Engine.drain``: a round of every component, else a jump of the clock."""
    if engine.runtime.rounds.drain():
        return True
    if not advance_time:
        return False
    due = engine.store.next_due_time(clock.now())
    if due is None:
        return False
    clock.advance_to(due)
    return True


def _die(engine: dex.Engine, kind: str) -> None:
    """What the engine does just before it is thrown away."""
    now = engine.store.clock.now()
    match kind:
        case "between-rounds":
            pass
        case "claim-workflow-tasks":
            engine.workflow_scheduler.step()
            engine.store.claim_workflow_tasks(
                frozenset(engine.registry.workflows), engine.node_id, now, timedelta(seconds=60), 16
            )
        case "claim-activity-tasks":
            engine.activity_scheduler.step()
            engine.activity_worker.claim()
        case "claim-all":
            _die(engine, "claim-activity-tasks")
            _die(engine, "claim-workflow-tasks")
        case "lose-workflow-results":
            engine.workflow_scheduler.step()
            engine.workflow_worker.poll_once()  # decided, but the results die in the buffer
        case "lose-activity-results":
            engine.activity_scheduler.step()
            engine.activity_worker.poll_once()  # executed, but the outcomes die in the buffer
        case _:
            raise AssertionError(kind)


def _drive(
    make: Callable[[], dex.Engine],
    engine: dex.Engine,
    clock: VirtualClock,
    crashes: Sequence[Crash],
    advance_time: bool,
) -> dex.Engine:
    for steps, kind in crashes:
        for _ in range(steps):
            if not _step(engine, clock, advance_time):
                break
        _die(engine, kind)
        engine = make()
    engine.drain(advance_time=advance_time)
    return engine


def record(scenario: Scenario, early_crashes: Sequence[Crash] = (), late_crashes: Sequence[Crash] = ()) -> Recorded:
    """Run ``scenario`` to its end in a fresh store.

    The run first goes as far as it can without time passing (``early_crashes`` happen then);
    then the late events are sent, the run is suspended and resumed and perhaps cancelled;
    then it runs to its end, time jumping ahead (``late_crashes`` happen then). Crashes that
    lose claims only happen late: lost claims come back only when time passes.
    """
    clock = VirtualClock()
    adapter = InMemoryAdapter(clock=clock)

    def make() -> dex.Engine:
        return dex.Engine(adapter, workflows=WORKFLOWS, activities=ACTIVITIES, rng=random.Random(0))

    engine = make()
    run_id = engine.start_workflow(interpreter, scenario.program)
    for event_id, payload in scenario.sends("early"):
        engine.send_event(run_id, event_id, payload)
    engine = _drive(make, engine, clock, early_crashes, advance_time=False)
    if not engine.get_run(run_id).status.is_terminal:
        for event_id, payload in scenario.sends("late"):
            engine.send_event(run_id, event_id, payload)
    if scenario.suspend and engine.get_run(run_id).status is RunStatus.RUNNING:
        engine.suspend(run_id)
        engine.drain(advance_time=False)
        engine.resume(run_id)
    if scenario.cancel and not engine.get_run(run_id).status.is_terminal:
        engine.cancel(run_id, "the test says so")
    engine = _drive(make, engine, clock, late_crashes, advance_time=True)

    history = engine.history(run_id)
    children = [
        (engine.get_run(item.event.child_run_id), engine.history(item.event.child_run_id))
        for item in history
        if isinstance(item.event, ev.ChildRunCreated)
    ]
    return Recorded(run_id=run_id, info=engine.get_run(run_id), history=history, children=children)


# -- checks on one recorded history ---------------------------------------------------------------


def check_outcome(scenario: Scenario, recorded: Recorded, *, lossy: bool = False) -> None:
    """The run ended the way the program and the driving say it must."""
    info = recorded.info
    assert info.status.is_terminal, f"the run did not finish: {info.status}"
    if scenario.cancel and info.status is RunStatus.CANCELLED:
        return  # cancelled before it could finish: nothing more is promised
    if scenario.program["end"] == "raise":
        assert info.status is RunStatus.FAILED
        assert info.failure is not None and info.failure.message == "program asked to fail"
        return
    assert info.status is RunStatus.COMPLETED, info.failure
    check_result(scenario.program, info.result, scenario.sent(), lossy=lossy)


def decide_from_every_prefix(workflow_name: str, run_id: str, history: Sequence[ev.HistoryEvent]) -> None:
    """From each workflow-task boundary, ``decide`` given the next block's messages writes that block."""
    definition = DEFINITIONS[workflow_name]
    _created, blocks = split_blocks(history)
    assert all(block.completed for block in blocks)
    position = 1  # after RunCreated
    for block in blocks:
        prefix = history[:position]
        executor = replay_history(
            definition, run_id, prefix, CONVERTER, activities=ACTIVITY_DEFINITIONS.get, workflows=DEFINITIONS.get
        )
        assert executor.nondeterminism is None, executor.nondeterminism
        size = 2 + len(block.messages) + len(block.commands)
        recorded_block = history[position : position + size]
        inbox = [
            InboxMessage(message_id=1000 + i, event=cast(ev.Message, event))
            for i, (_seq, event) in enumerate(block.messages)
        ]
        result = decide(
            definition,
            run_id,
            prefix,
            inbox,
            block.started.timestamp,
            CONVERTER,
            activities=ACTIVITY_DEFINITIONS.get,
            workflows=DEFINITIONS.get,
        )
        assert list(result.new_events) == list(recorded_block)
        assert result.expected_last_seq == prefix[-1].sequence_number
        assert result.consumed == tuple(m.message_id for m in inbox)
        position += size
    assert position == len(history)
    # a finished run drops whatever still arrives and writes nothing
    late = InboxMessage(message_id=1, event=ev.ExternalEventReceived(event_id="late", payload=CONVERTER.encode(None)))
    after = decide(definition, run_id, history, [late], history[-1].timestamp, CONVERTER)
    assert after.new_events == () and after.consumed == (1,)


def check_fold(info: dex.RunInfo, history: Sequence[ev.HistoryEvent]) -> None:
    """``fold`` reads the whole history and ends in the status its RunCompleted records."""
    completions = [item.event for item in history if isinstance(item.event, ev.RunCompleted)]
    assert len(completions) == 1, "a finished run records its outcome exactly once"
    state = fold(history)
    assert state.status is completions[0].status is info.status
    assert state.last_sequence_number == len(history) == history[-1].sequence_number
    assert [item.sequence_number for item in history] == list(range(1, len(history) + 1))
    assert not state.in_workflow_task and not state.suspended
    assert state.workflow_name == info.workflow_name
    # before RunCompleted no prefix is terminal
    end = next(i for i, item in enumerate(history) if isinstance(item.event, ev.RunCompleted))
    assert not fold(history[:end]).status.is_terminal


def check_run(recorded: Recorded) -> None:
    """Replay, prefix-decide and fold hold for the run and each of its children."""
    runs = [(recorded.info, recorded.history), *recorded.children]
    for info, history in runs:
        fn = interpreter if info.workflow_name == "interpreter" else child_wf
        dex.testing.replay(fn, history, activities=ACTIVITIES, workflows=WORKFLOWS)
        decide_from_every_prefix(info.workflow_name, info.run_id, history)
        check_fold(info, history)


# -- property 1 and 3: every recorded history replays, from every prefix, and folds ---------------


def _recorded_histories_replay(scenario: Scenario) -> None:
    note(f"program: {scenario.program}")
    recorded = record(scenario)
    check_outcome(scenario, recorded)
    # a side effect's function runs once per step, however often the run was replayed
    side_steps_run = {i for i, s in enumerate(scenario.program["steps"]) if s["op"] == "side"}
    calls = {i: n for (run, i), n in SIDE_EFFECT_CALLS.items() if run == recorded.run_id}
    assert set(calls) <= side_steps_run and all(n == 1 for n in calls.values())
    if recorded.info.status is RunStatus.COMPLETED:
        assert set(calls) == side_steps_run
    check_run(recorded)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_recorded_histories_replay_from_every_prefix(scenario: Scenario) -> None:
    _recorded_histories_replay(scenario)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios)
def test_recorded_histories_replay_from_every_prefix_many(scenario: Scenario) -> None:
    _recorded_histories_replay(scenario)


# -- property 2: crashes and restarts change nothing ----------------------------------------------


def _normalized_ids(recorded: Recorded) -> dict[str | None, str | None]:
    names: dict[str | None, str | None] = {None: None, recorded.run_id: "run"}
    for index, (info, _history) in enumerate(recorded.children):
        names[info.run_id] = f"child-{index}"
    return names


def _without_ids(event: ev.Event, names: dict[str | None, str | None]) -> ev.Event:
    for field in ("child_run_id", "parent_run_id"):
        if hasattr(event, field):
            event = attrs.evolve(event, **{field: names[getattr(event, field)]})  # type: ignore[arg-type]
    if isinstance(event, ev.RunCreated) and event.parent_run_id is not None and hasattr(event, "random_seed"):
        event = attrs.evolve(event, random_seed=0)  # a child's seed derives from its run id
    if isinstance(event, ev.RunCancelled):
        reason = event.reason
        for run_id, name in names.items():
            if run_id is not None and name is not None:
                reason = reason.replace(run_id, name)
        event = attrs.evolve(event, reason=reason)
    return event


def exact_view(recorded: Recorded, history: Sequence[ev.HistoryEvent]) -> list[tuple[int, Any, ev.Event]]:
    """The history as it is, only with run ids named by role (two stores make different ids)."""
    names = _normalized_ids(recorded)
    return [(item.sequence_number, item.timestamp, _without_ids(item.event, names)) for item in history]


def _failure_view(failure: dex.FailureInfo | None) -> Any:
    return None if failure is None else (failure.type, failure.message, failure.terminal)


def timing_free_view(recorded: Recorded, history: Sequence[ev.HistoryEvent]) -> tuple[list[Any], list[Any]]:
    """The commands in order and the messages as a multiset, free of times and positions.

    A crash that loses claims delays the run by a lease; messages that would have come one
    per workflow task may then come several to a task, which moves sequence numbers and
    times but must not change which steps the code took or what it was told.
    """
    names = _normalized_ids(recorded)
    command_index: dict[int, int] = {}
    commands: list[Any] = []
    messages: list[Any] = []
    _created, blocks = split_blocks(history)
    last = blocks[-1]
    if any(isinstance(event, ev.RunCancelled) for _seq, event in last.messages):
        # what else reached the run in the task that cancelled it never reached its code
        ignored = {seq for seq, event in last.messages if not isinstance(event, ev.RunCancelled)}
        history = [item for item in history if item.sequence_number not in ignored]
    for item in history:
        event = _without_ids(item.event, names)
        match event:
            case ev.TimerCreated():
                command_index[item.sequence_number] = len(commands)
                commands.append(("TimerCreated", event.fire_at - item.timestamp))
            case ev.RunCompleted():
                commands.append(("RunCompleted", event.status, event.result, _failure_view(event.failure)))
            case ev.ActivityTaskCreated() | ev.ChildRunCreated() | ev.SideEffectExecuted():
                command_index[item.sequence_number] = len(commands)
                commands.append(event)
            case ev.ActivityTaskCompleted() | ev.TimerElapsed():
                messages.append(attrs.evolve(event, created_seq=command_index[event.created_seq]))
            case ev.ActivityTaskFailed():
                messages.append(("ActivityTaskFailed", command_index[event.created_seq], _failure_view(event.failure)))
            case ev.ChildRunFailed():
                messages.append(("ChildRunFailed", event.child_run_id, _failure_view(event.failure)))
            case ev.RunCreated() | ev.WorkflowTaskStarted() | ev.WorkflowTaskCompleted():
                pass
            case _:
                messages.append(event)
    return commands, sorted(messages, key=repr)


crash_kinds = st.sampled_from([BENIGN, *LOSSY])
early_crash_plans = st.lists(st.tuples(st.integers(0, 4), st.just(BENIGN)), max_size=2)
# mostly few steps between crashes: a crash hurts only while the run still has work in flight
late_crash_plans = st.lists(st.tuples(st.sampled_from([0, 0, 1, 2, 3, 6]), crash_kinds), min_size=1, max_size=3)


def _no_short_timeout_on_late_events(scenario: Scenario) -> Scenario:
    # A crash delays the run by a lease expiry, so virtual time moves on before a "late" event
    # is sent: a short timeout may then legitimately fire first, which a run without crashes
    # would not see. Long timeouts keep this property about everything else.
    steps = scenario.program["steps"]
    late_ids = {s["id"] for s in steps if s["op"] == "wait" and s["send"] == "late"}
    steps = [
        {**s, "timeout": 86400} if s["op"] == "wait" and s["id"] in late_ids and s["timeout"] is not None else s
        for s in steps
    ]
    return attrs.evolve(scenario, program={**scenario.program, "steps": steps})


def _crashes_change_nothing(scenario: Scenario, early: list[Crash], late: list[Crash]) -> None:
    scenario = _no_short_timeout_on_late_events(scenario)
    note(f"program: {scenario.program}")
    straight = record(scenario)
    crashed = record(scenario, early, late)
    benign = all(kind == BENIGN for _steps, kind in late)
    check_outcome(scenario, crashed, lossy=not benign)
    check_run(crashed)
    assert crashed.info.status is straight.info.status
    if any(
        isinstance(item.event, ev.ActivityTaskFailed) and item.event.failure.type == "LeaseExpiredError"
        for item in crashed.history
    ):
        # the one difference a lost claim may make: a doomed step's last allowed attempt was
        # lost (a lost attempt counts against max_attempts; check_outcome checked which step);
        # from there on result and history differ by design
        assert not benign
        event("lossy crash: a doomed step lost its last attempt")
        return
    assert crashed.info.result == straight.info.result
    assert _failure_view(crashed.info.failure) == _failure_view(straight.info.failure)
    runs = [(straight.history, crashed.history)]
    assert len(crashed.children) == len(straight.children)
    if benign or crashed.info.status is not RunStatus.CANCELLED:
        # (a cancel that a crash delays may come after a child finished: then it finished)
        assert [(i.status, i.result) for i, _h in crashed.children] == [
            (i.status, i.result) for i, _h in straight.children
        ]
        runs += [(s, c) for (_i, s), (_j, c) in zip(straight.children, crashed.children, strict=True)]
    if benign:
        # nothing was in flight when the engines died: the very same histories, times included
        for s, c in runs:
            assert exact_view(crashed, c) == exact_view(straight, s)
    else:
        for s, c in runs:
            assert timing_free_view(crashed, c) == timing_free_view(straight, s)
        same = exact_view(crashed, crashed.history) == exact_view(straight, straight.history)
        event("lossy crash: same history" if same else "lossy crash: history regrouped or delayed")
    event(f"outcome: {crashed.info.status.value}")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios, early_crash_plans, late_crash_plans)
def test_crashes_and_restarts_change_neither_result_nor_history(
    scenario: Scenario, early: list[Crash], late: list[Crash]
) -> None:
    _crashes_change_nothing(scenario, early, late)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios, early_crash_plans, late_crash_plans)
def test_crashes_and_restarts_change_neither_result_nor_history_many(
    scenario: Scenario, early: list[Crash], late: list[Crash]
) -> None:
    _crashes_change_nothing(scenario, early, late)


# -- property 3 (status machine): nothing leaves a terminal status ---------------------------------

SPEC_TRANSITIONS = {
    # TERMINATED (docs/reference/contract.md §14) is reachable from every live status
    RunStatus.CREATED: {RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.TERMINATED},
    RunStatus.RUNNING: {
        RunStatus.SUSPENDED,
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.TERMINATED,
    },
    RunStatus.SUSPENDED: {RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.TERMINATED},
    RunStatus.COMPLETED: set(),
    RunStatus.FAILED: set(),
    RunStatus.CANCELLED: set(),
    RunStatus.TERMINATED: set(),
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(RunStatus)), st.lists(st.sampled_from(list(RunStatus)), max_size=30))
def test_status_requests_follow_the_spec_and_never_leave_a_terminal_status(
    start: RunStatus, requests: list[RunStatus]
) -> None:
    status = start
    for target in requests:
        before = status
        if target in SPEC_TRANSITIONS[before]:
            status = transition(before, target)
            assert status is target
        else:
            with pytest.raises(dex.InvalidStateError):
                transition(before, target)
        if before.is_terminal:
            assert status is before, f"left terminal {before} for {target}"


# -- property 4: a changed program is caught, naming both steps ----------------------------------


def _describe_activity(spec: dict[str, Any]) -> str:
    return f"activity {spec['fn']!r}"


def _command_count(step: dict[str, Any]) -> int:
    return len(step["items"]) if step["op"] == "gather" else 1


def _describe_first_command(step: dict[str, Any], at: Any) -> str:
    """How non-determinism messages name the first command of ``step``, issued at time ``at``."""
    match step["op"]:
        case "act":
            return _describe_activity(step)
        case "gather":
            return _describe_activity(step["items"][0])
        case "timer":
            return f"timer firing at {(at + timedelta(seconds=step['seconds'])).isoformat()}"
        case "child":
            return "child workflow 'child-wf'"
        case "side":
            return f"side effect {step['name']!r}"
    raise AssertionError(step)


@st.composite
def mutations(draw: st.DrawFn, program: dict[str, Any]) -> tuple[dict[str, Any], int, Callable[[Any], str], str]:
    """A changed program, the index of the first command that differs, and the wording expected.

    Returns (program, command index, requested(at) -> description, detail).
    """
    steps = program["steps"]
    index = draw(st.integers(0, len(steps) - 1))
    step = steps[index]
    first = sum(_command_count(s) for s in steps[:index])
    options = ["insert", "drop-rest", "replace-kind"]
    if step["op"] in ("act", "gather"):
        options += ["rename", "argument"]
    if step["op"] == "timer":
        options.append("duration")
    if step["op"] == "child":
        options.append("argument")
    if step["op"] == "side":
        options.append("rename")
    how = draw(st.sampled_from(options))
    new_steps = list(steps)
    detail = ""
    member = 0
    if how == "insert":
        inserted = {"op": "side", "name": "inserted", "arg": 1}
        new_steps.insert(index, inserted)
        return _mutated(program, new_steps), first, lambda _at: "side effect 'inserted'", detail
    if how == "drop-rest":
        # the code ends where history goes on
        new_steps = new_steps[:index]
        return _mutated(program, new_steps), first, lambda _at: "run completion (COMPLETED)", detail
    if how == "replace-kind":
        replacement = (
            {"op": "timer", "seconds": 7} if step["op"] != "timer" else {"op": "side", "name": "swapped", "arg": 0}
        )
        new_steps[index] = replacement
        return _mutated(program, new_steps), first, lambda at: _describe_first_command(replacement, at), detail
    if step["op"] == "gather":
        member = draw(st.integers(0, len(step["items"]) - 1))
        target = step["items"][member]
    else:
        target = step
    if how == "rename" and step["op"] == "side":
        changed = {**target, "name": "renamed"}
    elif how == "rename":
        changed = {**target, "fn": {"echo": "shout", "shout": "echo", "flaky": "echo", "doomed": "echo"}[target["fn"]]}
    elif how == "argument":
        changed = {**target, "arg": target["arg"] + 1}
        detail = "with a different arguments"
    else:  # duration
        changed = {**target, "seconds": target["seconds"] + 1}
        detail = "with a different timer duration"
    if step["op"] == "gather":
        items = list(step["items"])
        items[member] = changed
        new_steps[index] = {**step, "items": items}
    else:
        new_steps[index] = changed
    described = changed if step["op"] != "gather" else {"op": "act", **changed}
    return _mutated(program, new_steps), first + member, lambda at: _describe_first_command(described, at), detail


def _mutated(program: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {**program, "steps": steps}


def _describe_recorded(event: ev.Event) -> str:
    match event:
        case ev.ActivityTaskCreated():
            return f"activity {event.name!r}"
        case ev.TimerCreated():
            return f"timer firing at {event.fire_at.isoformat()}"
        case ev.ChildRunCreated():
            return f"child workflow {event.workflow_name!r}"
        case ev.SideEffectExecuted():
            return f"side effect {event.name!r}"
        case ev.RunCompleted():
            return f"run completion ({event.status.value})"
    raise AssertionError(event)


def _changed_program_is_caught(program: dict[str, Any], data: st.DataObject) -> None:
    recorded = record(Scenario(program=program))
    assert recorded.info.status is RunStatus.COMPLETED, recorded.info.failure
    changed, command_at, requested, detail = data.draw(mutations(program))
    note(f"changed program: {changed}")
    commands = [item for item in recorded.history if isinstance(item.event, ev.COMMAND_EVENT_TYPES)]
    recorded_step = commands[command_at]
    history = [
        attrs.evolve(item, event=attrs.evolve(item.event, input=(CONVERTER.encode(changed),)))
        if isinstance(item.event, ev.RunCreated)
        else item
        for item in recorded.history
    ]
    with pytest.raises(dex.NonDeterminismError) as caught:
        dex.testing.replay(interpreter, history, activities=ACTIVITIES, workflows=WORKFLOWS)
    message = str(caught.value)
    expected_recorded = (
        f"history recorded {_describe_recorded(recorded_step.event)} at event {recorded_step.sequence_number}"
    )
    expected_requested = f"the workflow code asked for {requested(recorded_step.timestamp)}"
    assert expected_recorded in message
    assert expected_requested in message
    assert message.index(expected_recorded) < message.index(expected_requested)
    assert detail in message
    # and the unchanged program still replays
    dex.testing.replay(interpreter, recorded.history, activities=ACTIVITIES, workflows=WORKFLOWS)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(waits=False, endings=("return",)), st.data())
def test_a_changed_program_fails_replay_naming_both_steps(program: dict[str, Any], data: st.DataObject) -> None:
    _changed_program_is_caught(program, data)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(waits=False, endings=("return",)), st.data())
def test_a_changed_program_fails_replay_naming_both_steps_many(program: dict[str, Any], data: st.DataObject) -> None:
    _changed_program_is_caught(program, data)


# -- single cases: ctx.random on replay, and a known bug pinned ----------------------------------


@dex.workflow(name="random-pick")
async def random_pick(ctx: dex.WorkflowContext) -> int:
    value: int = await ctx.activity(echo, ctx.random().randint(0, 10**6))
    return value


def test_replay_gives_ctx_random_the_recorded_values() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[random_pick], activities=[echo])
    run_id = engine.start_workflow(random_pick)
    engine.drain()
    assert engine.get_run(run_id).status is RunStatus.COMPLETED
    exported = engine.export_history(run_id)
    for history in (engine.history(run_id), exported, dex.testing.load_history(exported)):
        dex.testing.replay(random_pick, history, activities=[echo])


@dex.workflow(name="event-or-timeout")
async def event_or_timeout(ctx: dex.WorkflowContext) -> str:
    try:
        value: str = await ctx.wait_for_event("go", timeout=timedelta(seconds=5))
    except dex.WaitTimeoutError:
        return "timed out"
    return value


def _event_before_timeout(crash: bool) -> str:
    clock = VirtualClock()
    adapter = InMemoryAdapter(clock=clock)
    engine = dex.Engine(adapter, workflows=[event_or_timeout])
    run_id = engine.start_workflow(event_or_timeout)
    engine.drain(advance_time=False)  # the run waits; its 5 s timeout timer is set
    engine.send_event(run_id, "go", "arrived")  # at 0 s, long before the timeout
    if crash:
        engine.workflow_scheduler.step()
        assert engine.workflow_worker.poll_once() == 1  # decided, then the worker dies unflushed
        engine = dex.Engine(adapter, workflows=[event_or_timeout])
    engine.drain()  # the lost task's lease (60 s) expires after the timer (5 s) fired
    result: str = engine.get_run(run_id).result
    return result


def test_event_that_arrived_before_its_timeout_wins_without_crash() -> None:
    assert _event_before_timeout(crash=False) == "arrived"


def test_event_that_arrived_before_its_timeout_wins_after_a_worker_crash() -> None:
    assert _event_before_timeout(crash=True) == "arrived"


def test_a_resume_without_a_suspension_folds_to_the_status_it_found() -> None:
    # before resume was refused for a CREATED run, such a resume was recorded after RunStarted;
    # those histories still fold (the web's timeline folds them), the run RUNNING
    now = datetime(2026, 1, 1, tzinfo=UTC)
    created = ev.RunCreated(workflow_name="w", input=(), queue="default")
    events = [created, ev.WorkflowTaskStarted(), ev.RunStarted(), ev.RunResumed(), ev.WorkflowTaskCompleted()]
    history = [ev.HistoryEvent(sequence_number=n, timestamp=now, event=e) for n, e in enumerate(events, 1)]
    state = fold(history)
    assert state.status is RunStatus.RUNNING and not state.suspended
    with pytest.raises(dex.InvalidStateError):  # a status move that cannot happen still raises
        fold([*history, ev.HistoryEvent(sequence_number=6, timestamp=now, event=ev.RunStarted())])
