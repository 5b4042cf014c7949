"""The coordinator's transition function, driven directly: the batch window, claims, the
activity slots and running attempts, nudges, stop — and a hypothesis state machine that feeds
it any sequence of events and checks its invariants after each."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import attrs
import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dex.app.ports.store import ActivityTask, Lease
from dex.app.runtime import coordinator as co
from dex.domain.retry import RetryPolicy

SETTINGS = co.Settings(poll_interval=1.0, window=0.05, activity_capacity=4, activity_batch=3, workflow_batch=8)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def task(task_id: int, version: int = 1) -> ActivityTask:
    return ActivityTask(
        task_id=task_id,
        run_id=f"run-{task_id}",
        created_seq=1,
        name="act",
        input=(),
        queue="default",
        priority=0,
        attempt=1,
        retry_policy=RetryPolicy(),
        lock_timeout=timedelta(minutes=5),
        lease=Lease(owner="node", until=T0 + timedelta(seconds=30), version=version),
    )


def step(state: co.State, event: co.Event, settings: co.Settings = SETTINGS) -> tuple[co.State, tuple[co.Command, ...]]:
    return co.transition(settings, state, event)


def test_a_round_after_work_waits_for_the_rest_of_the_window() -> None:
    state = co.State()
    assert co.window_left(SETTINGS, state, co.SCHEDULER, 100.0) == 0.0  # nothing ran yet: at once
    state = co._worked(state, co.SCHEDULER, 100.0)
    assert co.window_left(SETTINGS, state, co.SCHEDULER, 100.01) == pytest.approx(0.04)
    assert co.window_left(SETTINGS, state, "workflow", 100.01) == 0.0  # each poller has its own window
    assert co.window_left(SETTINGS, state, co.SCHEDULER, 100.05) == 0.0  # the window has passed
    _state, commands = step(state, co.SchedulerTurn(100.01))
    assert commands == (co.Pause(pytest.approx(0.04)),)
    _state, commands = step(state, co.SchedulerTurn(100.06))
    assert commands == (co.RunScheduler(),)


def test_a_zero_window_never_waits() -> None:
    settings = attrs.evolve(SETTINGS, window=0.0)
    state = co._worked(co.State(), co.SCHEDULER, 100.0)
    assert co.window_left(settings, state, co.SCHEDULER, 100.0) == 0.0


def test_a_full_round_lets_the_next_one_run_at_once() -> None:
    state = co._worked(co.State(), "workflow", 100.0)
    state, _ = step(state, co.WorkflowRound(started=100.0, now=100.01, claimed=True, worked=8, full=True))
    assert co.window_left(SETTINGS, state, "workflow", 100.01) == 0.0
    assert "workflow" in state.wanted  # it claims again at once
    state, _ = step(state, co.WorkflowRound(started=100.02, now=100.03, claimed=True, worked=2, full=False))
    assert co.window_left(SETTINGS, state, "workflow", 100.03) == pytest.approx(0.04)  # paced again


def test_full_during_a_round_is_not_undone_when_the_round_ends() -> None:
    # the scheduler makes tasks while the worker's round runs: the worker's next round comes at once
    state, commands = step(co.State(), co.Scheduled(started=100.0, now=100.01, workflow_tasks=3, activity_tasks=0))
    assert co.Wake(frozenset({co.WORKFLOWS})) in commands
    state, _ = step(state, co.WorkflowRound(started=100.005, now=100.02, claimed=True, worked=1, full=False))
    assert co.window_left(SETTINGS, state, "workflow", 100.02) == 0.0
    state, _ = step(state, co.WorkflowRound(started=100.03, now=100.04, claimed=True, worked=1, full=False))
    assert co.window_left(SETTINGS, state, "workflow", 100.04) == pytest.approx(0.04)


def test_a_written_task_hurries_a_scheduler_inside_its_window() -> None:
    state = co._worked(co.State(), co.SCHEDULER, 100.0)
    state, commands = step(state, co.TaskWritten(100.01))
    assert commands == (co.Wake(frozenset({co.SCHEDULER})),)  # a scheduler waiting out its window wakes
    assert co.window_left(SETTINGS, state, co.SCHEDULER, 100.01) == 0.0
    same, commands = step(state, co.TaskWritten(100.02))  # outside a window: nothing to do
    assert same is state and commands == ()


def test_a_nudge_leaves_a_scheduler_inside_its_window_asleep() -> None:
    """It runs at the window's end anyway, and takes what the start made then."""
    state = co._worked(co.State(), co.SCHEDULER, 100.0)
    same, commands = step(state, co.Nudged(frozenset({co.SCHEDULER}), 100.01))
    assert same is state and commands == ()  # no wake, and not a wake of every thread
    _state, commands = step(state, co.Nudged(frozenset({co.SCHEDULER, co.WORKFLOWS}), 100.01))
    assert commands == (co.Wake(frozenset({co.WORKFLOWS})),)  # the others are woken as before
    _state, commands = step(state, co.SchedulerTurn(100.02))
    assert commands == (co.Pause(pytest.approx(0.03)),)  # it sleeps until the window's end ...
    _state, commands = step(state, co.Nudged(frozenset({co.SCHEDULER}), 100.05))
    assert commands == (co.Wake(frozenset({co.SCHEDULER})),)  # ... after which a nudge wakes it
    _state, commands = step(state, co.Nudged(frozenset(), 100.01))
    assert commands == (co.Wake(frozenset()),)  # a nudge of every thread wakes every thread


def test_a_claim_comes_when_nudged_or_once_per_poll_interval() -> None:
    state, commands = step(co.State(), co.ClaimTurn("workflow", 100.0))
    assert commands == (co.Claim("workflow"),)  # never claimed: the interval has passed
    state, commands = step(state, co.ClaimTurn("workflow", 100.5))
    assert commands == ()  # within the interval, not nudged: only handed tasks run
    state, commands = step(state, co.Nudged(frozenset({co.WORKFLOWS}), 100.55))
    assert commands == (co.Wake(frozenset({co.WORKFLOWS})),)
    state, commands = step(state, co.ClaimTurn("workflow", 100.6))
    assert commands == (co.Claim("workflow"),)
    assert "workflow" not in state.wanted


def test_activity_claims_reserve_slots_and_a_full_pool_claims_when_one_is_free() -> None:
    state, commands = step(co.State(), co.ClaimTurn("activity", 100.0))
    assert commands == (co.Claim("activity", 3),) and state.used == 3
    state, commands = step(state, co.ActivitiesClaimed(3, (task(1), task(2), task(3)), 100.0, 100.0))
    assert commands == (co.RunAttempt(task(1)), co.RunAttempt(task(2)), co.RunAttempt(task(3)))
    assert state.used == 3 and len(state.running) == 3 and state.backlog  # full claim: maybe more
    state, commands = step(state, co.ReserveActivities())  # a completion's claim gets the last slot
    assert commands == (co.Claim("activity", 1),) and state.used == 4
    state, commands = step(state, co.ActivitiesClaimed(1, ()))
    assert commands == () and state.used == 3  # it claimed nothing: the slot is free again
    state = attrs.evolve(state, used=4)  # every slot taken
    state, commands = step(state, co.ClaimTurn("activity", 102.0))
    assert commands == () and state.backlog
    state, commands = step(state, co.AttemptEnded((1, 1)))
    assert commands == (co.Wake(frozenset({co.ACTIVITIES})),) and "activity" in state.wanted
    assert state.used == 3 and (1, 1) not in state.running
    same, commands = step(state, co.AttemptEnded((1, 1)))  # ended twice: counted once
    assert same is state and commands == ()


def test_a_stopping_engine_claims_nothing_and_wakes_everyone() -> None:
    state, commands = step(co.State(), co.StopRequested())
    assert commands == (co.Wake(frozenset()),) and state.stopping
    assert step(state, co.ClaimTurn("workflow", 100.0))[1] == ()
    assert step(state, co.ClaimTurn("activity", 100.0))[1] == ()
    assert step(state, co.ReserveActivities())[1] == ()
    assert step(state, co.SchedulerTurn(100.0))[1] == (co.Pause(SETTINGS.poll_interval),)


def test_a_flush_wakes_whoever_it_left_work_for() -> None:
    state, commands = step(co.State(), co.Flushed(frozenset({"activity", "scheduling"})))
    assert commands == (co.Wake(frozenset({co.ACTIVITIES, co.SCHEDULER})),)
    assert {"activity", co.SCHEDULE_ACTIVITIES} <= state.wanted and state.backlog
    state, commands = step(state, co.Leading(100.0))
    assert commands == (co.ScheduleActivities(),) and co.SCHEDULE_ACTIVITIES not in state.wanted
    assert step(state, co.Leading(100.5))[1] == ()  # not asked, within the interval
    assert step(state, co.Leading(101.0))[1] == (co.ScheduleActivities(),)  # once per interval


class CoordinatorMachine(RuleBasedStateMachine):
    """Any sequence of events keeps the slots and attempts consistent, and never claims while stopping."""

    def __init__(self) -> None:
        super().__init__()
        self.state = co.State()
        self.now = 100.0
        self.reserved: list[int] = []  # claims reserved and not yet answered
        self.serial = 0
        self.commands: tuple[co.Command, ...] = ()

    def feed(self, event: co.Event) -> None:
        before = self.state
        self.state, self.commands = co.transition(SETTINGS, self.state, event)
        for command in self.commands:
            if isinstance(command, co.Claim) and command.kind == "activity":
                assert not before.stopping
                self.reserved.append(command.limit)
            if isinstance(command, co.Pause):
                assert 0 < command.seconds <= max(SETTINGS.window, SETTINGS.poll_interval)

    @rule(dt=st.floats(0, 2))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule(kind=st.sampled_from(["workflow", "activity"]))
    def claim_turn(self, kind: str) -> None:
        self.feed(co.ClaimTurn(kind, self.now))

    @rule()
    def reserve(self) -> None:
        self.feed(co.ReserveActivities())

    @precondition(lambda self: self.reserved)
    @rule(data=st.data(), polled=st.booleans())
    def claimed(self, data: st.DataObject, polled: bool) -> None:
        limit = self.reserved.pop(0)
        got = data.draw(st.integers(0, limit))
        tasks = []
        for _ in range(got):
            self.serial += 1
            tasks.append(task(self.serial))
        self.feed(co.ActivitiesClaimed(limit, tuple(tasks), self.now if polled else None, self.now))
        assert [c.task for c in self.commands if isinstance(c, co.RunAttempt)] == tasks

    @precondition(lambda self: self.state.running)
    @rule(data=st.data())
    def attempt_ends(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.state.running)))
        self.feed(co.AttemptEnded(key))
        assert key not in self.state.running

    @rule(topics=st.frozensets(st.sampled_from([co.SCHEDULER, co.WORKFLOWS, co.ACTIVITIES])))
    def nudged(self, topics: frozenset[str]) -> None:
        waiting = co.window_left(SETTINGS, self.state, co.SCHEDULER, self.now) > 0
        self.feed(co.Nudged(topics, self.now))
        woken = topics - {co.SCHEDULER} if waiting else topics
        assert self.commands == ((co.Wake(woken),) if woken or not topics else ())

    @rule(left=st.frozensets(st.sampled_from(["workflow", "activity", "scheduling"])))
    def flushed(self, left: frozenset[str]) -> None:
        self.feed(co.Flushed(left))

    @rule(workflow_tasks=st.integers(0, 10), activity_tasks=st.integers(0, 3))
    def scheduled(self, workflow_tasks: int, activity_tasks: int) -> None:
        self.feed(co.SchedulerTurn(self.now))
        self.feed(co.Scheduled(self.now, self.now, workflow_tasks, activity_tasks))
        if workflow_tasks:
            assert "workflow" in self.state.wanted
            assert co.window_left(SETTINGS, self.state, "workflow", self.now) == 0.0

    @rule(worked=st.integers(0, 8), full=st.booleans(), claimed=st.booleans())
    def workflow_round(self, worked: int, full: bool, claimed: bool) -> None:
        self.feed(co.WorkflowRound(self.now, self.now, claimed, worked, full))

    @rule()
    def written(self) -> None:
        self.feed(co.TaskWritten(self.now))

    @rule()
    def stop(self) -> None:
        self.feed(co.StopRequested())

    @invariant()
    def slots_add_up(self) -> None:
        assert self.state.used == sum(self.reserved) + len(self.state.running)
        assert 0 <= self.state.used <= SETTINGS.activity_capacity


TestCoordinatorMachine = CoordinatorMachine.TestCase
TestCoordinatorMachine.settings = hypothesis_settings(max_examples=200, stateful_step_count=40, deadline=None)
