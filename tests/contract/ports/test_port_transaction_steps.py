"""The TransactionSteps port's contract (docs/reference/contract.md §9): a step's work and its completion commit
together, only while the task's lease holds; a failure rolls both back.

The work writes through the connection it is given: on PostgreSQL a row in a table of the
test's schema; on the in-memory adapter a value into a fake DB-API connection that the
adapter's ``transaction_connection`` factory hands out (committed or rolled back by it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import pytest

from dex.adapters.memory import InMemoryAdapter
from dex.app.ports.store import ActivityOutcome, ActivityTask, StepFailed, Store, TransactionStep
from dex.app.ports.transactions import Checkpointed, StepCheckpoint
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    LEASE,
    PortContract,
    PostgresBackend,
    activity,
    claim,
    decide,
    event,
    failure,
    finish,
    inbox_of,
    next_task,
    payload,
    start,
    step,
)


class FakeConnection:
    """A DB-API connection's commit and rollback over a list of written values."""

    def __init__(self, committed: list[str]) -> None:
        self.committed, self.pending = committed, list[str]()

    def write(self, value: str) -> None:
        self.pending.append(value)

    def commit(self) -> None:
        self.committed.extend(self.pending)
        self.pending.clear()

    def rollback(self) -> None:
        self.pending.clear()


class TransactionStepsContract(PortContract):
    def write(self, store: Store, conn: Any, value: str) -> None:
        raise NotImplementedError

    def written(self, store: Store) -> list[str]:
        raise NotImplementedError

    def _task(self, store: Store, clock: VirtualClock, run_id: str = "r1") -> ActivityTask:
        start(store, clock, run_id)
        step(store, clock, run_id, activities=["charge"])
        (task,) = activity(store, clock)
        return task

    def _step(self, store: Store, task: ActivityTask, value: str, calls: list[Any] | None = None) -> TransactionStep:
        def work(conn: Any) -> Any:
            if calls is not None:
                calls.append(conn)
            self.write(store, conn, value)
            return payload(value)

        return TransactionStep(task=task, isolation="read committed", work=work)

    def test_the_work_and_the_completion_commit_together(self, store: Store, clock: VirtualClock) -> None:
        task = self._task(store, clock)
        calls: list[Any] = []
        assert store.complete_in_transaction(self._step(store, task, "paid", calls)) is True
        assert len(calls) == 1 and calls[0] is not None
        assert self.written(store) == ["paid"]
        assert inbox_of(store, clock, "r1") == ["ActivityTaskCompleted"]
        clock.advance(LEASE * 3)  # the task is gone: no lease to expire, nothing to take over
        assert activity(store, clock, owner="a2") == []
        # a late outcome for the same claim finds its lease used up
        assert store.complete_activity_tasks([ActivityOutcome(task=task, result=payload(1))], clock.now()) == [False]

    def test_a_lost_lease_runs_nothing_and_writes_nothing(self, store: Store, clock: VirtualClock) -> None:
        task = self._task(store, clock)
        clock.advance(LEASE * 2)
        (taken,) = activity(store, clock, owner="a2")
        assert taken.attempt == task.attempt + 1
        calls: list[Any] = []
        assert store.complete_in_transaction(self._step(store, task, "late", calls)) is False
        assert calls == [] and self.written(store) == []
        assert store.complete_in_transaction(self._step(store, taken, "taken")) is True
        assert self.written(store) == ["taken"]

    def test_a_failed_work_rolls_back_and_leaves_the_task_to_its_lease(self, store: Store, clock: VirtualClock) -> None:
        task = self._task(store, clock)

        def work(conn: Any) -> Any:
            self.write(store, conn, "doomed")
            raise StepFailed(ValueError("declined"))

        with pytest.raises(StepFailed):
            store.complete_in_transaction(TransactionStep(task=task, isolation="read committed", work=work))
        assert self.written(store) == []
        assert inbox_of(store, clock, "r1") == []
        # the claim still holds: its failure goes the ordinary way
        assert store.complete_activity_tasks([ActivityOutcome(task=task, failure=failure())], clock.now()) == [True]
        assert inbox_of(store, clock, "r1") == ["ActivityTaskFailed"]

    def test_a_task_of_an_ended_run_is_gone(self, store: Store, clock: VirtualClock) -> None:
        task = self._task(store, clock)
        finish(store, clock, "r1", RunStatus.CANCELLED)
        assert store.complete_in_transaction(self._step(store, task, "ghost")) is False
        assert self.written(store) == []

    def test_two_holders_racing_commit_exactly_once(self, store: Store, clock: VirtualClock) -> None:
        """The first holder's lease expires while its work runs and a second worker tries to take
        the task over: however the store orders them, exactly one commit."""
        task = self._task(store, clock)
        results: list[bool] = []

        def work(conn: Any) -> Any:
            self.write(store, conn, "first")
            clock.advance(LEASE * 2)
            for taken in activity(store, clock, owner="a2"):  # a store that locks the row has none to give
                results.append(store.complete_in_transaction(self._step(store, taken, "second")))
            return payload("first")

        results.insert(
            0, store.complete_in_transaction(TransactionStep(task=task, isolation="serializable", work=work))
        )
        assert results.count(True) == 1
        assert len(self.written(store)) == 1
        assert inbox_of(store, clock, "r1") == ["ActivityTaskCompleted"]


class TestTransactionStepsMemory(TransactionStepsContract):
    @contextmanager
    def open_store(self, clock: VirtualClock) -> Iterator[Store]:
        committed: list[str] = []
        store = InMemoryAdapter(clock=clock, transaction_connection=lambda: FakeConnection(committed))
        store.committed = committed  # type: ignore[attr-defined]
        yield store

    def write(self, store: Store, conn: Any, value: str) -> None:
        conn.write(value)

    def written(self, store: Store) -> list[str]:
        return list(store.committed)  # type: ignore[attr-defined]


class TestTransactionStepsPostgres(PostgresBackend, TransactionStepsContract):
    @contextmanager
    def open_store(self, clock: VirtualClock) -> Iterator[Store]:
        from dex.adapters.postgres import PostgresAdapter
        from tests.pg import fresh_schema, postgres_dsn

        # four connections: a step holds one while its work makes other calls of the store
        with fresh_schema(postgres_dsn()) as schema:
            store = PostgresAdapter(postgres_dsn(), schema=schema, clock=clock, max_connections=4)
            try:
                with self._connect() as conn:
                    conn.execute(f"CREATE TABLE {self._table(store)} (value text)")
                yield store
            finally:
                store.close()

    @staticmethod
    def _connect() -> Any:
        import psycopg

        from tests.pg import postgres_dsn

        return psycopg.connect(postgres_dsn(), autocommit=True)

    @staticmethod
    def _table(store: Store) -> str:
        return f'"{store.schema}".port_ledger'  # type: ignore[attr-defined]

    def write(self, store: Store, conn: Any, value: str) -> None:
        conn.execute(f"INSERT INTO {self._table(store)} VALUES (%s)", [value])

    def written(self, store: Store) -> list[str]:
        with self._connect() as conn:
            return [row[0] for row in conn.execute(f"SELECT value FROM {self._table(store)}").fetchall()]


class StepCheckpointsContract(TransactionStepsContract):
    """``checkpoint_steps``: first attempts of steps run inside their workflow tasks, a group at a
    time; each step's writes commit with its task's result so far and its outcome in the inbox."""

    def _parked(
        self,
        store: Store,
        clock: VirtualClock,
        run_id: str,
        value: str,
        calls: list[str] | None = None,
        fails: bool = False,
    ) -> StepCheckpoint:
        start(store, clock, run_id)
        task = next_task(store, clock, run_id)
        result = decide(store, task, clock.now(), activities=["charge"])
        (spec,) = result.activity_tasks

        def work(conn: Any) -> Any:
            if calls is not None:
                calls.append(value)
            self.write(store, conn, value)
            if fails:
                raise StepFailed(ValueError(f"{value} declined"))
            return payload(value)

        return StepCheckpoint(task=task, result=attrs.evolve(result, activity_tasks=()), step=spec, work=work)

    def test_a_group_commits_each_step_with_its_tasks_checkpoint_and_keeps_the_tasks(
        self, store: Store, clock: VirtualClock
    ) -> None:
        first, second = self._parked(store, clock, "r1", "a"), self._parked(store, clock, "r2", "b")
        outcomes = store.checkpoint_steps([first, second], clock.now())
        assert [type(o).__name__ for o in outcomes] == ["Checkpointed", "Checkpointed"]
        assert sorted(self.written(store)) == ["a", "b"]
        for item, outcome in zip([first, second], outcomes, strict=True):
            assert isinstance(outcome, Checkpointed)
            assert outcome.last_seq == item.result.new_events[-1].sequence_number
            assert outcome.message.created_seq == item.step.created_seq and outcome.message.result == payload(
                "a" if item is first else "b"
            )
            assert inbox_of(store, clock, item.task.run_id) == ["ActivityTaskCompleted"]
            assert store.load_history(item.task.run_id)[-1].sequence_number == outcome.last_seq
        assert activity(store, clock, names=["charge"]) == []  # the steps were answered: no task made
        # the tasks are still held: each goes on from its step's outcome and completes as usual
        for item in (first, second):
            result = decide(store, item.task, clock.now(), complete=RunStatus.COMPLETED)
            assert (
                result.consumed and result.expected_last_seq == store.load_history(item.task.run_id)[-1].sequence_number
            )
            assert store.complete_workflow_tasks([(item.task, result)], clock.now()) == [True]
            assert store.get_run(item.task.run_id).status is RunStatus.COMPLETED  # type: ignore[union-attr]

    def test_a_failed_step_is_left_out_alone_and_its_task_goes_on_as_before(
        self, store: Store, clock: VirtualClock
    ) -> None:
        calls: list[str] = []
        doomed = self._parked(store, clock, "r1", "doomed", calls, fails=True)
        fine = self._parked(store, clock, "r2", "fine", calls)
        before = store.load_history("r1")
        outcomes = store.checkpoint_steps([doomed, fine], clock.now())
        assert isinstance(outcomes[0], ValueError) and "doomed declined" in str(outcomes[0])
        assert isinstance(outcomes[1], Checkpointed)
        assert self.written(store) == ["fine"]  # whatever ran more than once committed once
        assert calls.count("doomed") == 1
        assert store.load_history("r1") == before and inbox_of(store, clock, "r1") == ["RunStarted"]
        # the failed step's task still holds its claim: its result is written the ordinary way
        ordinary = attrs.evolve(doomed.result, activity_tasks=(doomed.step,))
        assert store.complete_workflow_tasks([(doomed.task, ordinary)], clock.now()) == [True]
        assert [t.name for t in activity(store, clock, names=["charge"])] == ["charge"]

    def test_a_task_taken_over_or_moved_on_runs_nothing(self, store: Store, clock: VirtualClock) -> None:
        calls: list[str] = []
        lost = self._parked(store, clock, "r1", "lost", calls)
        clock.advance(LEASE * 2)
        (taken,) = claim(store, clock, owner="w2")
        assert taken.run_id == "r1"
        moved = self._parked(store, clock, "r2", "moved", calls)
        store.send_message("r2", event("e"), clock.now())  # not consumed: the history stays
        assert store.complete_workflow_tasks([(moved.task, moved.result)], clock.now()) == [True]
        outcomes = store.checkpoint_steps([lost, moved], clock.now())
        assert outcomes == [None, None]
        assert calls == [] and self.written(store) == []
        assert store.checkpoint_steps([], clock.now()) == []


class TestStepCheckpointsMemory(StepCheckpointsContract, TestTransactionStepsMemory):
    pass


class TestStepCheckpointsPostgres(StepCheckpointsContract, TestTransactionStepsPostgres):
    pass
