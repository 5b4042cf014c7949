"""``steps_in``: the activity steps of a stretch of a run's history (a page), read in bounded
reads on every adapter: the attempts of those steps only, and their outcomes among a bounded
number of events after the stretch. A step whose outcome lies beyond what was read shows
``unknown``, never as a step that has not ended."""

from __future__ import annotations

from dex.app.facade.steps import COMPLETED, FAILED_STEP, RUNNING, UNKNOWN, activity_steps, steps_in
from dex.app.ports.store import ActivityOutcome, Store
from dex.domain import events as ev
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    MemoryBackend,
    PortContract,
    PostgresBackend,
    activity,
    done,
    event,
    failure,
    start,
    step,
)


class PageStepsContract(PortContract):
    def _run(self, store: Store, clock: VirtualClock) -> list[int]:
        """Three steps scheduled together: the first completes, the second fails for good, the
        third is under way; then more history. Their ActivityTaskCreated numbers."""
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT, ACT])
        seqs = [i.sequence_number for i in store.load_history("r1") if isinstance(i.event, ev.ActivityTaskCreated)]
        first, second, _third = sorted(activity(store, clock), key=lambda t: t.created_seq)
        ended = [done(first), ActivityOutcome(task=second, failure=failure("declined"))]
        assert store.complete_activity_tasks(ended, clock.now()) == [True, True]
        for i in range(4):  # the outcomes come into the history, and more after them
            store.send_message("r1", event(f"later {i}"), clock.now())
            step(store, clock, "r1")
        return seqs

    def test_a_page_shows_what_the_whole_history_shows(self, store: Store, clock: VirtualClock) -> None:
        seqs = self._run(store, clock)
        page = store.load_history_after("r1", seqs[0] - 1, len(seqs))  # only the three ActivityTaskCreated
        steps = steps_in(store, "r1", page, run_ended=False)
        assert [(s.seq, s.status) for s in steps] == list(zip(seqs, (COMPLETED, FAILED_STEP, RUNNING), strict=True))
        assert steps == activity_steps(store.load_history("r1"), store.step_attempts("r1"))
        assert steps[0].ended_at is not None and steps[1].recent[0].failure.message == "declined"

    def test_an_outcome_beyond_the_events_read_is_unknown(self, store: Store, clock: VirtualClock) -> None:
        seqs = self._run(store, clock)
        whole = store.load_history("r1")
        (outcome,) = [i for i in whole if isinstance(i.event, ev.ActivityTaskCompleted)]
        page = store.load_history_after("r1", seqs[0] - 1, len(seqs))
        short = outcome.sequence_number - seqs[-1] - 1  # the read stops just before the outcomes
        steps = steps_in(store, "r1", page, run_ended=False, most=short)
        assert [s.status for s in steps] == [UNKNOWN, UNKNOWN, RUNNING]  # the third's task is known
        assert steps[0].ended_at is None
        again = steps_in(store, "r1", page, run_ended=False, most=short + 2)
        assert [s.status for s in again] == [COMPLETED, FAILED_STEP, RUNNING]

    def test_the_events_read_already_after_the_page_are_used(self, store: Store, clock: VirtualClock) -> None:
        seqs = self._run(store, clock)
        page = store.load_history_after("r1", seqs[0] - 1, len(seqs))
        rest = store.load_history_after("r1", seqs[-1], 10_000)
        steps = steps_in(store, "r1", page, run_ended=False, most=0, following=rest)  # no read of the store's
        assert [s.status for s in steps] == [COMPLETED, FAILED_STEP, RUNNING]
        assert steps == steps_in(store, "r1", page, run_ended=False)
        blind = steps_in(store, "r1", page, run_ended=False, most=0)  # nothing read after the page
        assert [s.status for s in blind] == [UNKNOWN, UNKNOWN, RUNNING]

    def test_a_page_without_steps_reads_nothing_more(self, store: Store, clock: VirtualClock) -> None:
        self._run(store, clock)
        assert steps_in(store, "r1", store.load_history_after("r1", 0, 1), run_ended=False) == []


class TestPageStepsMemory(MemoryBackend, PageStepsContract):
    pass


class TestPageStepsPostgres(PostgresBackend, PageStepsContract):
    pass
