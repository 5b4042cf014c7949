"""BatchWindow and the start's idle rule: under load, rounds wait for the rest of the window;
after a quiet spell, nothing waits."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.dispatch import ActivitySlots, LocalDispatch
from dex.app.runner import BatchWindow, Foreground, PollingThread
from dex.testing import VirtualClock


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_round_after_work_waits_for_the_rest_of_the_window() -> None:
    clock = FakeClock()
    window = BatchWindow(0.02, clock)
    assert window.left("scheduler") == 0.0  # nothing ran yet: at once
    window.worked("scheduler", clock())
    clock.t += 0.005
    assert window.left("scheduler") == pytest.approx(0.015)
    assert window.left("workflow") == 0.0  # each poller has its own window
    clock.t += 0.015
    assert window.left("scheduler") == 0.0  # the window has passed
    clock.t += 10
    assert window.left("scheduler") == 0.0  # a quiet spell: at once


def test_a_zero_window_never_waits() -> None:
    clock = FakeClock()
    window = BatchWindow(0.0, clock)
    window.worked("scheduler", clock())
    assert window.left("scheduler") == 0.0


class Workflows:
    """What LocalDispatch reads of the workflow worker."""

    names = frozenset({"wf"})
    lease = None

    def __init__(self, idle: float) -> None:
        self.idle = idle

    def backlog(self) -> int:
        return 0

    def idle_for(self) -> float:
        return self.idle


def dispatch(workflows: Any, idle_after: float) -> LocalDispatch:
    return LocalDispatch(
        activities=None,  # type: ignore[arg-type]
        workflows=workflows,
        slots=ActivitySlots(4),
        owner="node",
        run_activity=lambda task: None,
        wake_workflows=lambda: None,
        stopping=threading.Event(),
        idle_after=idle_after,
    )


def test_a_start_claims_its_task_only_after_a_whole_idle_window() -> None:
    busy = dispatch(Workflows(idle=0.005), idle_after=0.02)
    assert busy.start_claim() is None  # the worker ran a task 5 ms ago: the scheduler batches it
    idle = dispatch(Workflows(idle=0.5), idle_after=0.02)
    claim = idle.start_claim()
    assert claim is not None and claim.names == frozenset({"wf"}) and claim.limit == 1
    assert dispatch(Workflows(idle=0.0), idle_after=0.0).start_claim() is not None  # window off


@pytest.mark.parametrize("bad", [-0.01, "soon", True])
def test_a_bad_batch_window_is_refused_by_name(bad: Any) -> None:
    with pytest.raises(ValueError, match="batch_window must be a number of seconds >= 0"):
        dex.Engine(InMemoryAdapter(clock=VirtualClock()), batch_window=bad)


def test_a_full_round_lets_the_next_one_run_at_once() -> None:
    clock = FakeClock()
    window = BatchWindow(0.05, clock)
    window.worked("workflow", clock())
    clock.t += 0.01
    assert window.left("workflow") == pytest.approx(0.04)
    window.full("workflow")  # the claim got all it asked for: more waits in the queue
    assert window.left("workflow") == 0.0
    window.worked("workflow", clock())
    assert window.left("workflow") == pytest.approx(0.05)  # a round that was not full paces again


@dex.workflow
async def quick(ctx: dex.WorkflowContext) -> int:
    return 1


def test_the_worker_says_whether_its_claim_came_back_full() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[quick])
    engine.workflow_worker._batch_size = 2  # a small batch to fill
    for _ in range(3):
        engine.start_workflow(quick)
    engine.workflow_scheduler.step()
    assert engine.workflow_worker.poll_once() == 2
    assert engine.workflow_worker.claimed_full  # two asked, two claimed: the third may wait
    assert engine.workflow_worker.poll_once() == 1
    assert not engine.workflow_worker.claimed_full


def test_the_foreground_counts_calls_in_flight_and_asks_the_worker_to_step_aside() -> None:
    foreground = Foreground(pause=0.0001)
    assert not foreground.busy() and not foreground.step_aside()  # nobody waits: no pause
    with foreground.calling():
        assert foreground.busy() and foreground.step_aside()
    with pytest.raises(RuntimeError), foreground.calling():
        raise RuntimeError("the store refused")
    assert not foreground.busy()  # a call that failed is no longer in flight
    with foreground.calling():
        assert not Foreground(pause=0).step_aside()  # a zero pause turns it off


class RecordingForeground(Foreground):
    def __init__(self) -> None:
        super().__init__(pause=0)
        self.asked = 0

    def step_aside(self) -> bool:
        self.asked += 1
        return False


def test_the_workflow_worker_steps_aside_after_each_task() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[quick])
    assert engine.workflow_worker.foreground is engine.foreground  # the engine's calls are counted
    recording = RecordingForeground()
    engine.workflow_worker.foreground = recording
    for _ in range(3):
        engine.start_workflow(quick)
    engine.workflow_scheduler.step()
    assert engine.workflow_worker.poll_once() == 3
    assert recording.asked == 3


class WatchingStore(InMemoryAdapter):
    """Notes whether the engine counted the call in flight while the store served it."""

    def __init__(self) -> None:
        super().__init__(clock=VirtualClock())
        self.foreground: Foreground | None = None
        self.seen: list[bool] = []

    def create_run(self, run_id: Any, created: Any, now: Any) -> str:
        assert self.foreground is not None
        self.seen.append(self.foreground.busy())
        return super().create_run(run_id, created, now)

    def request_transition(self, run_id: Any, target: Any, message: Any, now: Any) -> None:
        assert self.foreground is not None
        self.seen.append(self.foreground.busy())
        super().request_transition(run_id, target, message, now)


def test_starts_and_transitions_are_calls_in_flight() -> None:
    store = WatchingStore()
    engine = dex.Engine(store, workflows=[quick])
    store.foreground = engine.foreground
    run_id = engine.start_workflow(quick)
    engine.cancel(run_id)
    assert store.seen == [True, True]
    assert not engine.foreground.busy()


def test_a_scheduler_round_that_made_tasks_lets_the_worker_claim_them_at_once() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[quick], batch_window=60)
    engine._background.window.worked("workflow", engine._background.window.now())  # a claim just found work
    assert engine._background.window.left("workflow") > 50
    engine.start_workflow(quick)
    assert engine._background.schedule_round() == 1
    assert engine._background.window.left("workflow") == 0.0  # the round's tasks are the batch: no wait


def _timer_slack() -> int:
    """This thread's timer slack in nanoseconds (``prctl(PR_GET_TIMERSLACK)``)."""
    import ctypes

    return int(ctypes.CDLL(None).prctl(30, 0, 0, 0, 0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is a Linux setting")
@pytest.mark.parametrize("opted_in", [True, False])
def test_the_workflow_workers_thread_ends_its_short_pauses_on_time_when_opted_in(
    opted_in: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 50 us pause under Linux's default 50 us slack sleeps twice as long; with
    # DEX_FINE_TIMER_SLACK=1 the polling thread that runs the workflow worker asks for 1 us,
    # and only that thread is changed; without it, no thread is
    if opted_in:
        monkeypatch.setenv("DEX_FINE_TIMER_SLACK", "1")
    else:
        monkeypatch.delenv("DEX_FINE_TIMER_SLACK", raising=False)
    seen: dict[str, int] = {}
    stopping = threading.Event()

    def step_of(name: str) -> Any:
        def step() -> int:
            seen[name] = _timer_slack()
            stopping.set()
            return 0

        return step

    for name, fine in (("fine", True), ("plain", False)):
        stopping.clear()
        thread = PollingThread(name, step_of(name), threading.Event(), stopping, interval=0.01, fine_timers=fine)
        thread.start()
        thread.join(5)
    assert (seen["fine"] == 1000) is opted_in
    assert seen["plain"] == _timer_slack() != 1000  # the default, as this (untouched) thread has


def test_the_engine_gives_fine_timers_to_the_workflow_worker_only(monkeypatch: pytest.MonkeyPatch) -> None:
    made: dict[str, bool] = {}
    original = PollingThread.__init__

    def recording(self: PollingThread, name: str, *args: Any, **kwargs: Any) -> None:
        made[name] = kwargs.get("fine_timers", False)
        original(self, name, *args, **kwargs)

    monkeypatch.setattr(PollingThread, "__init__", recording)
    engine = dex.Engine(InMemoryAdapter(), workflows=[quick])
    engine.start()
    engine.stop()
    assert made.pop("dex-workflow-worker") is True
    assert made and not any(made.values())


def _waiting(window: BatchWindow, key: str, stopping: threading.Event) -> tuple[threading.Thread, list[bool]]:
    said: list[bool] = []
    thread = threading.Thread(target=lambda: said.append(window.wait(key, stopping)))
    thread.start()
    return thread, said


def test_full_ends_a_wait_for_the_window_that_has_begun() -> None:
    # the worker waits out its window; the scheduler then makes tasks: they are claimed at once
    window, stopping = BatchWindow(3600), threading.Event()
    window.worked("workflow", window.now())
    thread, said = _waiting(window, "workflow", stopping)
    window.full("scheduler")  # another poller's key: no effect on this wait
    thread.join(0.2)
    assert thread.is_alive()
    window.full("workflow")
    thread.join(30)
    assert not thread.is_alive() and said == [False]
    assert window.left("workflow") == 0.0


def test_release_ends_every_wait_when_the_engine_stops() -> None:
    window, stopping = BatchWindow(3600), threading.Event()
    window.worked("scheduler", window.now())
    thread, said = _waiting(window, "scheduler", stopping)
    stopping.set()
    window.release()
    thread.join(30)
    assert not thread.is_alive() and said == [True]
    assert window.wait("scheduler", stopping) is True  # stopping: no wait at all


def test_a_written_task_hurries_a_scheduler_inside_its_window() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[quick], batch_window=3600)
    window = engine._background.window
    engine.start_workflow(quick)
    engine.workflow_scheduler.step()
    window.worked("scheduler", window.now())  # as a scheduler round that found work does
    assert window.left("scheduler") > 0
    engine.workflow_worker.poll_once()
    engine.buffer.flush()  # the task's result is written: the task has left its queue
    assert window.left("scheduler") == 0.0


def test_full_during_a_round_is_not_undone_when_the_round_ends() -> None:
    # the scheduler makes tasks while the worker's round runs: the worker's next round comes at once
    clock = FakeClock()
    window = BatchWindow(0.05, clock)
    started = clock()
    clock.t += 0.01
    window.full("workflow")
    clock.t += 0.01
    window.worked("workflow", started)  # the round that began before full() ends
    assert window.left("workflow") == 0.0
    later = clock()
    window.worked("workflow", later)  # a round that began after it arms the window as before
    assert window.left("workflow") == pytest.approx(0.05)
