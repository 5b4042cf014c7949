"""The AttemptReads port's ``step_endings``: the outcomes of some activity steps, found in a
bounded stretch of history after them.

A page of a long history shows the steps scheduled on it, and each step's outcome lies anywhere
after it. The store reads at most ``limit`` events after ``after_seq`` and gives the outcomes
(``ActivityTaskCompleted``, ``ActivityTaskFailed``) of the steps asked about among them; it says
the answer is ``complete`` when every step was found or the stretch reached the history's end,
so a caller can tell a step still open from one whose outcome lies beyond what was read.
"""

from __future__ import annotations

from dex.app.ports.store import ActivityOutcome, StepEndings, Store
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


def _outcome_of(item: ev.HistoryEvent, wanted: set[int]) -> bool:
    outcome = isinstance(item.event, (ev.ActivityTaskCompleted, ev.ActivityTaskFailed))
    return outcome and item.event.created_seq in wanted  # type: ignore[union-attr]


class StepEndingsContract(PortContract):
    def _run(self, store: Store, clock: VirtualClock) -> list[int]:
        """A run of four steps (in two blocks) with events between: the first completes, the
        third fails for good, the others stay open; their ActivityTaskCreated numbers."""
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT])
        store.send_message("r1", event("between"), clock.now())
        step(store, clock, "r1", activities=[ACT, ACT])
        seqs = [i.sequence_number for i in store.load_history("r1") if isinstance(i.event, ev.ActivityTaskCreated)]
        first, _second, third, _fourth = sorted(activity(store, clock), key=lambda t: t.created_seq)
        ended = [done(first), ActivityOutcome(task=third, failure=failure("declined"))]
        assert store.complete_activity_tasks(ended, clock.now()) == [True, True]
        step(store, clock, "r1")  # the outcomes come into the history
        for i in range(3):  # and more history after them
            store.send_message("r1", event(f"later {i}"), clock.now())
            step(store, clock, "r1")
        return seqs

    def test_the_outcomes_asked_for_among_the_events_read(self, store: Store, clock: VirtualClock) -> None:
        seqs = self._run(store, clock)
        whole = store.load_history("r1")
        (completed,) = [i for i in whole if isinstance(i.event, ev.ActivityTaskCompleted)]
        (failed,) = [i for i in whole if isinstance(i.event, ev.ActivityTaskFailed)]
        assert (completed.event.created_seq, failed.event.created_seq) == (seqs[0], seqs[2])
        got = store.step_endings("r1", seqs, seqs[0] - 1, 10_000)
        assert got == StepEndings(events=(completed, failed), complete=True)  # read to the end
        for wanted in ({seqs[0]}, {seqs[2]}, {seqs[1], seqs[3]}, set(seqs)):
            for after in range(-1, len(whole) + 2):
                for limit in (1, 2, 5, len(whole), len(whole) + 3):
                    window = [i for i in whole if i.sequence_number > after][:limit]
                    found = tuple(i for i in window if _outcome_of(i, wanted))
                    expected = StepEndings(events=found, complete=len(window) < limit or len(found) == len(wanted))
                    assert store.step_endings("r1", wanted, after, limit) == expected, (wanted, after, limit)

    def test_a_stretch_that_stops_short_of_an_outcome_says_so(self, store: Store, clock: VirtualClock) -> None:
        seqs = self._run(store, clock)
        whole = store.load_history("r1")
        (completed,) = [i for i in whole if isinstance(i.event, ev.ActivityTaskCompleted)]
        short = completed.sequence_number - seqs[0] - 1  # ends just before the outcome
        assert store.step_endings("r1", [seqs[0]], seqs[0], short) == StepEndings(events=(), complete=False)
        assert store.step_endings("r1", [seqs[0]], seqs[0], short + 1) == StepEndings(events=(completed,))
        # a step still open is not found however far the read goes, and that is complete
        assert store.step_endings("r1", [seqs[1]], seqs[1], 10_000) == StepEndings()

    def test_nothing_for_nothing(self, store: Store, clock: VirtualClock) -> None:
        seqs = self._run(store, clock)
        assert store.step_endings("r1", [], 0, 100) == StepEndings()
        assert store.step_endings("r1", seqs, 0, 0) == StepEndings(complete=False)
        assert store.step_endings("r1", seqs, 2**63 - 1, 10) == StepEndings()  # beyond the end: no overflow
        assert store.step_endings("no-such-run", seqs, 0, 100) == StepEndings()


class TestStepEndingsMemory(MemoryBackend, StepEndingsContract):
    pass


class TestStepEndingsPostgres(PostgresBackend, StepEndingsContract):
    pass
