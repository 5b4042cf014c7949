"""A write that always fails for one run's data holds only that run, on every adapter.

The store may answer a batch with an error that is not a value it refuses: a statement of the
adapter's that fails for one shape of result (a bug), a trigger of the database's that raises.
Such a batch used to be kept whole and sent again with the flusher's backoff for ever, holding
every other run's results in it. Now the buffer splits it, writes the healthy results at once,
and retries the one that fails alone with a backoff: its workflow task given back, its activity
attempt retried as the same attempt, its event's sender told. A store that is unavailable is
different: the whole batch waits, unsplit.

:class:`FailingStore` wraps an adapter and counts, per run, the batch writes that held its
result; on the in-memory adapter it fails every batch holding an item that carries :data:`MARK`
with ``StoreWriteError`` (as the PostgreSQL adapter raises it); on PostgreSQL a trigger of the
test's raises for real (``RAISE EXCEPTION``: SQLSTATE P0001) — on the ``runs`` row a result
updates, or on the ``inbox`` row an activity's outcome or an event inserts — and the adapter must
classify it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.machinery.buffer import ResultBuffer
from dex.app.ports.store import StoreRejectedError, StoreWriteError
from dex.domain import events as ev
from dex.testing import VirtualClock
from tests.buffers import Flushers

MARK = "POISON"


class FailingStore:
    """An adapter whose batch writes are counted per run; on the in-memory adapter, batches that
    hold a result or outcome carrying :data:`MARK` fail with StoreWriteError (an event carrying
    it too); with ``unavailable`` set, the next that many batch writes fail with ConnectionError."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.inject = isinstance(store, InMemoryAdapter)  # PostgreSQL fails by itself (a trigger)
        self.writes: Counter[str] = Counter()  # run id -> batch writes that held its result
        self.batches: list[int] = []  # the size of every batch write of workflow results
        self.unavailable = 0
        self.healed = False  # the fault is fixed (a deploy, a trigger dropped)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    @property
    def clock(self) -> Any:
        return self.store.clock

    def _check(self, poisoned: bool) -> None:
        if self.unavailable:
            self.unavailable -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        if poisoned and self.inject and not self.healed:
            raise StoreWriteError("the test store fails this batch's statement")

    def _results(self, results: Any) -> None:
        self.batches.append(len(results))
        self.writes.update({r.run_id for _t, r in results})
        self._check(any(r.custom_status == MARK for _t, r in results))

    def _outcomes(self, outcomes: Any) -> None:
        self.writes.update({o.task.run_id for o in outcomes})
        self._check(any(o.result is not None and MARK.encode() in o.result.data for o in outcomes))

    def complete_workflow_tasks(self, results: Any, now: Any) -> Any:
        self._results(results)
        return self.store.complete_workflow_tasks(results, now)

    def complete_workflow_tasks_then_claim(self, results: Any, now: Any, claim: Any) -> Any:
        self._results(results)
        return self.store.complete_workflow_tasks_then_claim(results, now, claim)

    def complete_activity_tasks(self, outcomes: Any, now: Any) -> Any:
        self._outcomes(outcomes)
        return self.store.complete_activity_tasks(outcomes, now)

    def complete_activity_tasks_then_claim(self, outcomes: Any, now: Any, claim: Any) -> Any:
        self._outcomes(outcomes)
        return self.store.complete_activity_tasks_then_claim(outcomes, now, claim)

    def send_messages(self, items: Any, now: Any) -> Any:
        self._check(any(isinstance(m, ev.ExternalEventReceived) and MARK.encode() in m.payload.data for _r, m in items))
        return self.store.send_messages(items, now)


@pytest.fixture
def failing(
    adapter_factory: Callable[[], Any],
) -> Iterator[Callable[..., tuple[dex.Engine, FailingStore, Callable[[], None]]]]:
    """An engine over a FailingStore, and what heals the store's fault."""
    engines: list[dex.Engine] = []

    def make(
        workflows: Any, activities: Any = (), on: str = "runs"
    ) -> tuple[dex.Engine, FailingStore, Callable[[], None]]:
        store = FailingStore(adapter_factory())
        heal = _poison_with_a_trigger(store.store, on)
        engine = dex.Engine(store, workflows=workflows, activities=activities)  # type: ignore[arg-type]
        engines.append(engine)

        def healed() -> None:
            store.healed = True
            heal()

        return engine, store, healed

    yield make
    for engine in engines:
        engine.stop(timeout=5)


def _poison_with_a_trigger(adapter: Any, table: str) -> Callable[[], None]:
    """On PostgreSQL, a trigger that raises (an operator's trigger, or anything the server
    answers for one row): on ``runs``, for a run whose custom status a result sets to
    :data:`MARK`; on ``inbox``, for a message that holds it (an outcome, an event). What drops it."""
    if isinstance(adapter, InMemoryAdapter):
        return lambda: None
    import psycopg
    from psycopg import sql

    from tests.pg import postgres_dsn

    schema = sql.Identifier(adapter.schema)
    if table == "runs":
        when, event = sql.SQL("NEW.custom_status = {}").format(sql.Literal(MARK)), sql.SQL("UPDATE")
    else:
        when, event = sql.SQL("position({} in NEW.message) > 0").format(sql.Literal(MARK.encode())), sql.SQL("INSERT")
    with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.poisoned() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN RAISE EXCEPTION 'the test trigger fails run %', NEW.run_id; END $$"
            ).format(schema)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER poisoned BEFORE {} ON {}.{} FOR EACH ROW WHEN ({}) EXECUTE FUNCTION {}.poisoned()"
            ).format(event, schema, sql.Identifier(table), when, schema)
        )

    def drop() -> None:
        with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TRIGGER poisoned ON {}.{}").format(schema, sql.Identifier(table)))

    return drop


@dex.workflow
async def labelled(ctx: dex.WorkflowContext, status: str) -> str:
    ctx.set_status(status)
    return status.lower()


def test_a_result_that_always_fails_holds_only_its_own_run(failing: Any, clock: VirtualClock) -> None:
    engine, store, heal = failing([labelled])
    statuses = ["A", "B", MARK, "C", "D", "E"]
    run_ids = [engine.start_workflow(labelled, status) for status in statuses]
    poisoned = run_ids[2]
    engine.workflow_scheduler.step()
    assert engine.workflow_worker.poll_once() == 6  # one round: its results go out as one batch
    # one flush writes the five others (split around the one that fails) and gives that one back
    assert engine.buffer.flush() == 6 and len(engine.buffer) == 0
    # halves written apart, down to the one that fails: 6, 3, 1, 2, 1, 1, 3 when it is the third
    assert store.batches[0] == 6 and len(store.batches) <= 7
    for status, run_id in zip(statuses, run_ids, strict=True):
        info = engine.get_run(run_id)
        if run_id == poisoned:
            assert not info.status.is_terminal  # not failed: its task is retried later
        else:
            assert info.status is dex.RunStatus.COMPLETED and info.result == status.lower()
    names = frozenset({"labelled"})
    assert store.claim_workflow_tasks(names, "other", clock.now(), timedelta(seconds=5), 1) == []  # backing off
    # a minute of virtual time: the poisoned run is retried with its backoff, which grows with
    # its task's lease version (a claim and a give-back each count: some 1 s, 4 s, 16 s apart),
    # never in a loop; a healthy run started meanwhile completes
    began, writes = clock.now(), store.writes[poisoned]
    healthy = engine.start_workflow(labelled, "H")
    engine.drain(until=timedelta(seconds=60))
    assert engine.wait(healthy, timeout=5) == "h"
    assert clock.now() - began >= timedelta(seconds=60)
    retries = store.writes[poisoned] - writes
    assert 2 <= retries <= 6, retries  # three or so claims in a minute, a write each
    assert not engine.get_run(poisoned).status.is_terminal
    # the fault is fixed: the next retry writes the run's result
    heal()
    engine.drain(until=timedelta(minutes=10))
    assert engine.wait(poisoned, timeout=5) == MARK.lower()


def test_a_started_engine_writes_the_others_while_one_result_always_fails(failing: Any) -> None:
    """The flushers' path (complete, then claim): the healthy runs end in real time, and the
    failing run's result is not sent again meanwhile: its backoff is on the virtual clock, which
    stands still, where the whole batch used to go again after every flusher backoff."""
    engine, store, _heal = failing([labelled])
    statuses = ["A", MARK, "B", "C"]
    run_ids = [engine.start_workflow(labelled, status) for status in statuses]
    engine.workflow_scheduler.step()  # the tasks are due at the worker's first claim
    engine.start()
    healthy = [run_id for status, run_id in zip(statuses, run_ids, strict=True) if status != MARK]
    assert [engine.wait(run_id, timeout=10) for run_id in healthy] == ["a", "b", "c"]
    poisoned = run_ids[1]
    written = store.writes[poisoned]
    time.sleep(2.5)  # longer than the flusher's longest backoff (2 s)
    assert store.writes[poisoned] == written <= 4  # no write of it since: it waits for its backoff
    assert not engine.get_run(poisoned).status.is_terminal
    after = engine.start_workflow(labelled, "D")
    assert engine.wait(after, timeout=10) == "d"


def test_an_unavailable_store_keeps_the_batch_whole_and_unsplit(failing: Any) -> None:
    engine, store, _heal = failing([labelled])
    run_ids = [engine.start_workflow(labelled, status) for status in ["A", "B", "C", "D"]]
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    store.unavailable = 3
    for _ in range(3):
        with pytest.raises(ConnectionError):
            engine.buffer.flush()
    assert store.batches == [4, 4, 4]  # one write per flush: no split
    assert len(engine.buffer) == 4
    assert engine.buffer.flush() == 4
    assert [engine.wait(run_id, timeout=1) for run_id in run_ids] == ["a", "b", "c", "d"]


@dex.activity
def echo(word: str) -> str:
    return word


@dex.workflow
async def fetch(ctx: dex.WorkflowContext, word: str) -> str:
    return await ctx.activity(echo, word)  # type: ignore[no-any-return]


def test_an_activity_outcome_that_always_fails_is_retried_alone_as_the_same_attempt(
    failing: Any, clock: VirtualClock
) -> None:
    engine, store, heal = failing([fetch], [echo], on="inbox")
    words = ["a", "b", MARK, "c"]
    run_ids = [engine.start_workflow(fetch, word) for word in words]
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    engine.buffer.flush()
    engine.activity_scheduler.step()
    assert engine.activity_worker.poll_once() == 4  # the four outcomes go out as one batch
    assert engine.buffer.flush() == 4 and len(engine.buffer) == 0
    began, writes = clock.now(), store.writes[run_ids[2]]
    engine.drain(until=timedelta(seconds=60))
    assert [engine.wait(run_id, timeout=5) for run_id in (run_ids[0], run_ids[1], run_ids[3])] == ["a", "b", "c"]
    assert clock.now() - began >= timedelta(seconds=60)
    assert 3 <= store.writes[run_ids[2]] - writes <= 20  # with a backoff, not in a loop
    assert engine.get_run(run_ids[2]).status is dex.RunStatus.RUNNING
    heal()
    engine.drain(until=timedelta(minutes=10))
    assert engine.wait(run_ids[2], timeout=5) == MARK
    attempts = [e.event for e in engine.history(run_ids[2]) if isinstance(e.event, ev.ActivityTaskCompleted)]
    assert len(attempts) == 1  # the retries were the same attempt: none failed the activity


@dex.workflow
async def listener(ctx: dex.WorkflowContext) -> str:
    word: str = await ctx.wait_for_event("word")
    return word


def test_an_event_that_always_fails_is_reported_to_its_sender_only(failing: Any) -> None:
    engine, _store, _heal = failing([listener], on="inbox")
    run_ids = [engine.start_workflow(listener) for _ in range(3)]
    engine.drain()
    buffer = ResultBuffer(engine.store, dispatch=Flushers())  # the senders wait for this test's flush
    errors: dict[int, BaseException | None] = {}

    def send(index: int, word: str) -> None:
        try:
            buffer.send_message(
                run_ids[index], ev.ExternalEventReceived(event_id="word", payload=engine.converter.encode(word))
            )
            errors[index] = None
        except BaseException as exc:  # noqa: BLE001 - what the sender gets is the finding
            errors[index] = exc

    senders = [threading.Thread(target=send, args=(i, w)) for i, w in enumerate(["x", MARK, "z"])]
    for sender in senders:
        sender.start()
    while len(buffer) < 3:
        threading.Event().wait(0.005)
    assert buffer.flush() == 3
    for sender in senders:
        sender.join(5)
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], StoreWriteError) and not isinstance(errors[1], StoreRejectedError)
    engine.drain()
    assert engine.wait(run_ids[0], timeout=5) == "x" and engine.wait(run_ids[2], timeout=5) == "z"


def test_the_postgresql_adapter_tells_a_failed_statement_from_an_unavailable_server() -> None:
    """``batch_refusals``: an error the server answers for what a batch's statements were given
    is StoreWriteError (split); its own failures, and what fails every batch alike, go through
    unchanged (the batch waits whole); refused data stays StoreRejectedError."""
    import psycopg
    import psycopg.errors as errors

    from dex.adapters.postgres.refusals import batch_refusals

    answered = (
        errors.CardinalityViolation("ON CONFLICT DO UPDATE command cannot affect row a second time"),
        errors.RaiseException("a trigger raised"),
        errors.DatatypeMismatch("column is of type integer"),
        errors.FeatureNotSupported("not supported"),
    )
    for exc in answered:
        with pytest.raises(StoreWriteError, match="PostgreSQL failed the write") as raised, batch_refusals():
            raise exc
        assert not isinstance(raised.value, StoreRejectedError)
    with pytest.raises(StoreRejectedError), batch_refusals():
        raise errors.CharacterNotInRepertoire("0x00")
    kept = (
        psycopg.OperationalError("server closed the connection unexpectedly"),  # no SQLSTATE
        errors.AdminShutdown("terminating connection due to administrator command"),
        errors.CannotConnectNow("the database system is starting up"),
        errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),  # a standby
        errors.DeadlockDetected("deadlock detected"),
        errors.QueryCanceled("canceling statement due to statement timeout"),
        errors.DiskFull("could not extend file"),
        errors.InternalError_("cache lookup failed"),
        errors.UndefinedTable("relation does not exist"),  # dropped: every batch fails alike
        errors.InsufficientPrivilege("permission denied"),  # revoked: likewise
        TimeoutError(),
        ConnectionError(),
    )
    for exc in kept:
        with pytest.raises(type(exc)) as raised, batch_refusals():
            raise exc
        assert raised.value is exc
