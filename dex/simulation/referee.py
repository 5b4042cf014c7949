"""The referee of a simulation: every store call checked as it happens, and each run at the end.

The observed adapter (``observed.py``) reports to a :class:`Referee` every call that grants,
extends or gives back a lease, writes a workflow result or changes the leadership; the referee
checks it at once against its ledgers and keeps its own copy of each run's history (every
generation). The end-of-run checks read those copies, so they still see runs that retention
has deleted.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import attrs

from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import ActivityOutcome, AnsweredStep, RunRecord, WorkflowTask
from dex.app.ports.updates import UpdateAnswers
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter
from dex.domain.errors import InvalidStateError
from dex.domain.state import fold
from dex.domain.status import RunStatus
from dex.domain.task import UpdateAnswer, WorkflowTaskResult, split_blocks
from dex.simulation.invariants import (
    InvariantViolation,
    check_activity_results,
    check_cleanup_before_end,
    check_events_not_lost,
    check_events_received,
    check_history,
    check_nothing_after_end,
    check_replays,
    check_sequence_numbers,
    check_updates_answered,
)
from dex.simulation.ledgers import LeaderLedger, LeaseLedger, StatusWatch
from dex.simulation.workload import Workload


@attrs.define
class RunLog:
    """What the referee knows of one run: its histories and what clients asked of it."""

    run_id: str
    workflow_name: str
    parent_run_id: str | None
    history: list[ev.HistoryEvent]  # the current generation
    generations: list[list[ev.HistoryEvent]] = attrs.Factory(list)  # generations continued as new
    sent: Counter[tuple[str, bytes]] = attrs.Factory(Counter)
    requests: list[tuple[RunStatus, datetime]] = attrs.Factory(list)  # accepted cancel/suspend/resume
    # update ids sent to the run, each with what its callers were told, in order
    updates: dict[str, list[UpdateAnswer]] = attrs.Factory(dict)
    # when the last applied workflow task began (its first block): blocks a task adds by running
    # activities inline carry later times, but the task decided from what it loaded then
    last_task_at: datetime | None = None

    def all_generations(self) -> list[list[ev.HistoryEvent]]:
        return [*self.generations, self.history]


# errors of the machinery, which may fail a task but never a run
MACHINERY_ERRORS = frozenset(
    {"ConnectionError", "TimeoutError", "StoreUnavailable", "StoreRejectedError", "OperationalError", "PoolTimeout"}
)

Delivery = tuple[str, Any]  # ("workflow", (task, result)) or ("activity", outcome)


class Referee:
    """Checks every store call as it happens and everything written at the end."""

    def __init__(self, retention: timedelta, cleanups: Mapping[str, str] | None = None) -> None:
        # the workflows whose code catches a cancel to run a cleanup step: that step's name
        self.cleanups: Mapping[str, str] = cleanups or {}
        self.leases = LeaseLedger()
        self.leader = LeaderLedger()
        self.statuses = StatusWatch(retention)
        self.runs: dict[str, RunLog] = {}
        self.deliveries: deque[Delivery] = deque(maxlen=32)  # recent completions, to deliver again
        self.counts: Counter[str] = Counter()
        # violations found inside store calls: the engine may catch what a store raises (a
        # failed leadership renewal is logged and ignored), so the simulator looks here too
        self.violations: list[InvariantViolation] = []
        # when each claim that wrote checkpoints began (its first block): the blocks after a
        # checkpoint go on from what the task loaded then, as inline blocks do
        self._claims_began: dict[tuple[int, int], datetime | None] = {}
        # (run id, update id) of the updates whose callers still wait for an answer
        self.awaiting: set[tuple[str, str]] = set()

    @contextmanager
    def judging(self) -> Iterator[None]:
        """Remember an invariant violation raised inside, then let it go on up."""
        try:
            yield
        except InvariantViolation as violation:
            self.violations.append(violation)
            raise

    # -- during the run ---------------------------------------------------------------------------
    def run_created(self, run_id: str, history: list[ev.HistoryEvent]) -> None:
        created = history[0].event
        assert isinstance(created, ev.RunCreated)
        if run_id in self.runs:
            raise InvariantViolation("history-as-decided", f"run {run_id} was created twice")
        self.runs[run_id] = RunLog(run_id, created.workflow_name, created.parent_run_id, history)
        check_history(run_id, history)

    def workflow_result(self, task: WorkflowTask, result: WorkflowTaskResult, applied: bool, again: bool) -> None:
        if isinstance(task, AnsweredStep):
            # an answered step holds the activity's claim; one the store declined wrote nothing
            # and ended no lease (its outcome goes the ordinary way), so it is no delivery
            if not applied and not again:
                self.counts["answers declined"] += 1
                return
            if applied:
                self.counts["answered"] += 1
                self.leases.completed("activity", task.outcome.task.task_id, task.outcome.task.lease, applied)
        else:
            self.leases.completed("workflow", task.task_id, task.lease, applied)
        self._delivered(("workflow", (task, result)), applied, again)
        if applied:
            self.checkpoint(task, result)

    def checkpoint(self, task: WorkflowTask, result: WorkflowTaskResult, kept: bool = False) -> None:
        """``result`` was written for ``task``; ``kept``: as a checkpoint, the task's lease goes on."""
        self.counts["checkpointed"] += kept
        claim = (task.task_id, task.lease.version)
        log = self.runs.get(result.run_id)
        if log is None:
            raise InvariantViolation("history-as-decided", f"a result was applied to unknown run {result.run_id}")
        if result.expected_last_seq != log.history[-1].sequence_number:
            raise InvariantViolation(
                "unique-sequence-numbers",
                f"run {log.run_id}: a result expecting event {result.expected_last_seq} was applied "
                f"after event {log.history[-1].sequence_number}",
            )
        written = [*log.history, *result.new_events]
        cleanup = self.cleanups.get(log.workflow_name)
        check_history(log.run_id, written, cleanup=cleanup)
        if result.new_events:
            log.last_task_at = self._claims_began.get(claim, result.new_events[0].timestamp)
        if kept:
            self._claims_began.setdefault(claim, log.last_task_at)
        else:
            self._claims_began.pop(claim, None)
        if result.new_history is not None:
            log.generations.append(written)
            log.history = list(result.new_history)
            check_history(log.run_id, log.history, cleanup=cleanup)
            # a run's sequence numbers never repeat: the new generation numbers on
            check_sequence_numbers(log.run_id, log.history, first=written[-1].sequence_number + 1)
        else:
            log.history = written

    def activity_outcome(self, outcome: ActivityOutcome, applied: bool, again: bool) -> None:
        self.leases.completed("activity", outcome.task.task_id, outcome.task.lease, applied)
        self._delivered(("activity", outcome), applied, again)

    def _delivered(self, delivery: Delivery, applied: bool, again: bool) -> None:
        if again:
            self.counts["redelivered"] += 1
            if applied:
                raise InvariantViolation(
                    "duplicates-discarded", f"a {delivery[0]} result delivered twice was applied twice"
                )
            return
        self.counts["applied" if applied else "discarded"] += 1
        self.deliveries.append(delivery)

    def update_sent(self, run_id: str, update_id: str, answer: UpdateAnswer | None) -> None:
        """A client sent update ``update_id`` to the run; ``answer``: what the call returned at once
        (a recorded answer, or a refusal at the call), None when the caller waits for it."""
        told = self.runs[run_id].updates.setdefault(update_id, [])
        if answer is None:
            self.awaiting.add((run_id, update_id))
        else:
            told.append(answer)

    def collect_answers(self, store: UpdateAnswers) -> int:
        """What the callers waiting for update answers are told now (each is woken when its
        answer is written); how many got one."""
        got = 0
        for run_id, update_id in sorted(self.awaiting):
            answer = store.update_answer(run_id, update_id)
            if answer is not None:
                self.runs[run_id].updates[update_id].append(answer)
                self.awaiting.discard((run_id, update_id))
                got += 1
        return got

    def records(self, store: InMemoryAdapter, everything: bool = True) -> dict[str, RunRecord | None]:
        """The runs as the store has them now (only those not seen ended, unless ``everything``)."""
        last, deleted = self.statuses.last, self.statuses.deleted
        return {
            run_id: store.get_run(run_id)
            for run_id in self.runs
            if everything or not (run_id in deleted or (run_id in last and last[run_id].status.is_terminal))
        }

    # -- at the end -------------------------------------------------------------------------------
    def final_checks(
        self, store: InMemoryAdapter, workload: Workload, executions: Any, converter: PayloadConverter
    ) -> None:
        """Every run ended exactly once, replays, and got only what really happened."""
        self.collect_answers(store)
        for run_id, log in self.runs.items():
            record = store.get_run(run_id)
            if record is None:
                record = self.statuses.last[run_id]  # deleted by retention: it was terminal then
            else:
                actual = store.load_history(run_id)
                if actual != log.history:
                    raise InvariantViolation(
                        "history-as-decided", f"run {run_id}: the store's history is not the one written"
                    )
            if not record.status.is_terminal:
                raise InvariantViolation(
                    "every-run-ends", f"run {run_id} ({log.workflow_name}) is still {record.status.value}"
                )
            self._check_run(log, record, workload, executions, converter)
            self._check_conversation(log, record, store, workload, converter)

    def _check_run(
        self, log: RunLog, record: RunRecord, workload: Workload, executions: Any, converter: PayloadConverter
    ) -> None:
        fn = workload.workflow(log.workflow_name)
        generations = log.all_generations()
        for index, history in enumerate(generations):
            last = index == len(log.generations)
            following = None if last else generations[index + 1][0].event
            check_history(log.run_id, history, finished=last, cleanup=self.cleanups.get(log.workflow_name))
            if not last:
                if any(isinstance(item.event, ev.RunCompleted) for item in history):
                    raise InvariantViolation("one-terminal-state", f"run {log.run_id}: a generation ended twice")
                check_sequence_numbers(log.run_id, generations[index + 1], first=history[-1].sequence_number + 1)
            assert following is None or isinstance(following, ev.RunCreated)
            check_replays(
                fn,
                log.run_id,
                history,
                activities=workload.activities,
                workflows=workload.workflows,
                continued_with=None if following is None else following.input,
                converter=converter,
            )
            check_activity_results(log.run_id, history, executions, workload.activity_result, converter)
            check_events_received(log.run_id, history, log.sent)
        completion = log.history[-2].event
        assert isinstance(completion, ev.RunCompleted)
        if completion.status is not record.status or completion.result != record.result:
            raise InvariantViolation(
                "one-terminal-state",
                f"run {log.run_id}: history says {completion.status.value}, the store {record.status.value}",
            )
        try:
            folded = fold(log.history).status
        except InvalidStateError as exc:
            raise InvariantViolation("history-folds", f"run {log.run_id}: {exc}") from None
        if folded is not record.status:
            raise InvariantViolation(
                "history-folds", f"run {log.run_id}: folds to {folded.value}, is {record.status.value}"
            )
        self._check_failed_by_its_code(log, record)
        self._check_requests_honoured(log)
        created = log.history[0].event
        assert isinstance(created, ev.RunCreated)
        inputs = [converter.decode(p) for p in created.input]
        result = converter.decode(record.result) if record.result is not None else None
        problem = workload.check_outcome(record, inputs, result)
        if problem is not None:
            raise InvariantViolation("workflow-results", f"run {log.run_id} ({log.workflow_name}{inputs}): {problem}")
        self._check_children(log)

    def _check_conversation(
        self, log: RunLog, record: RunRecord, store: InMemoryAdapter, workload: Workload, converter: PayloadConverter
    ) -> None:
        """Updates answered once and as told, nothing after the end (the store's streams too), a
        cancelled run's cleanup before its end, no event taken by a losing wait (docs/reference/contract.md §14)."""
        generations = log.all_generations()
        check_updates_answered(log.run_id, generations, log.updates, ended=True)
        streams = None
        keys = sorted(
            {
                item.event.key
                for history in generations
                for item in history
                if isinstance(item.event, ev.StreamItemWritten)
            }
        )
        if keys and store.get_run(log.run_id) is not None:
            streams = {
                key: [value for _position, value in store.read_stream(log.run_id, key, 0, 10**6).items] for key in keys
            }
        check_nothing_after_end(log.run_id, generations, streams)
        cleanup = self.cleanups.get(log.workflow_name)
        if cleanup is not None:
            check_cleanup_before_end(log.run_id, log.history, cleanup)
        event_id = workload.reads.get(log.workflow_name)
        if event_id is not None and record.status is RunStatus.COMPLETED and record.result is not None:
            read = converter.decode(record.result)["read"]
            check_events_not_lost(log.run_id, log.history, event_id, read, record.unread_events, converter)

    def _check_failed_by_its_code(self, log: RunLog, record: RunRecord) -> None:
        """A run is FAILED only by its workflow code or an activity's final failure, never by
        the machinery: a store error, a refused write, a lost connection (docs/reference/contract.md §8)."""
        failure = record.failure if record.status is RunStatus.FAILED else None
        while failure is not None:
            if failure.type in MACHINERY_ERRORS:
                raise InvariantViolation(
                    "machinery-never-fails-a-run",
                    f"run {log.run_id} ({log.workflow_name}) FAILED of {failure.type}: {failure.message}",
                )
            failure = failure.cause

    def _check_requests_honoured(self, log: RunLog) -> None:
        """An accepted cancel or suspend reaches the history, unless a task that started no
        later than the request ended the run first (a task handed over by eager dispatch starts
        when its input was loaded, and the blocks of activities it ran inline are part of it)."""
        _created, blocks = split_blocks(log.history)
        ended_at = log.last_task_at or blocks[-1].started.timestamp
        recorded = Counter(type(item.event) for history in log.all_generations() for item in history)
        early = Counter(target for target, at in log.requests if at < ended_at)
        # a second cancel while one is on its way is accepted and merged with it
        missing = [
            target.value
            for target, kind, needed in (
                (RunStatus.CANCELLED, ev.RunCancelled, min(early[RunStatus.CANCELLED], 1)),
                (RunStatus.SUSPENDED, ev.RunSuspended, early[RunStatus.SUSPENDED]),
            )
            if recorded[kind] < needed
        ]
        if missing:
            raise InvariantViolation(
                "requests-honoured",
                f"run {log.run_id}: an accepted {' and '.join(missing)} request never reached the history, "
                f"though the run went on until a task at {ended_at.isoformat()}",
            )

    def _check_children(self, log: RunLog) -> None:
        """A parent learns exactly how its child ended."""
        for history in log.all_generations():
            for item in history:
                if not isinstance(item.event, (ev.ChildRunCompleted, ev.ChildRunFailed)):
                    continue
                child = self.runs.get(item.event.child_run_id)
                end = child.history[-2].event if child is not None else None
                if isinstance(item.event, ev.ChildRunCompleted):
                    told_right = isinstance(end, ev.RunCompleted) and end.result == item.event.result
                else:  # a child that could not be created (its instance id was taken) never ran
                    told_right = end is None or (
                        isinstance(end, ev.RunCompleted) and end.status is not RunStatus.COMPLETED
                    )
                if not told_right:
                    raise InvariantViolation(
                        "child-outcomes",
                        f"run {log.run_id} was told {item.kind} by child {item.event.child_run_id}, which ended {end}",
                    )
