"""The activity completion's function (migration 9) against the statements it stands in for,
and the pipelined workflow completion.

A batch of finished activity attempts is written by one call of ``complete_activities``
(``dex/adapters/postgres/activity_outcomes.py``); a batch with a retry keeps the statements.
A workflow completion is one pipelined transaction of two round trips
(``dex/adapters/postgres/dispatch.py``). The port contracts (tests/contract/ports) run
through whichever path a batch takes. Here:

- one scripted sequence of completions (duplicates in a batch, a stale lease, an outcome for
  a run that ended, a claim with its load, a message to another run) goes once through the
  function and once through the statements, and every answer and every row read back after
  each step is the same, ids included;
- a write cut off by the server mid-way (its backend terminated while it waits for a lock)
  writes nothing, fails as an unavailable store (not as refused data), and the same batch
  applies afterwards;
- a NUL or a lone surrogate in a text the function is sent fails the batch as refused data
  and writes nothing; the healthy outcome applies after it, and a run started afterwards
  completes;
- a dispatch while another transaction holds a scheduler's lock dispatches nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import cast

import attrs
import psycopg
import pytest

from dex.adapters.postgres import PostgresAdapter, activity_outcomes
from dex.adapters.postgres.schema import LOCK_SCHEDULE_ACTIVITIES, LOCK_SCHEDULE_WORKFLOWS
from dex.app.ports.store import Claim, Store, StoreRejectedError, WorkflowInput
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    ACT,
    LEASE,
    WF,
    PostgresBackend,
    activity,
    decide,
    done,
    event,
    finish,
    inbox_of,
    next_task,
    start,
    step,
)

pytestmark = pytest.mark.postgres


def store_on(clock: VirtualClock) -> AbstractContextManager[PostgresAdapter]:
    """An adapter over a fresh schema of the session's server (the port contracts' backend)."""
    return cast("AbstractContextManager[PostgresAdapter]", PostgresBackend().open_store(clock))


def scripted(store: Store, clock: VirtualClock) -> list[object]:
    """Drive completions through the store; what each answers, and what the store then holds."""
    seen: list[object] = []
    for run_id in ("r1", "r2", "r3"):
        start(store, clock, run_id)
    step(store, clock, "r1", activities=[ACT, ACT])
    step(store, clock, "r2", activities=[ACT])
    step(store, clock, "r3", activities=[ACT])
    t1a, t1b, t2, t3 = sorted(activity(store, clock), key=lambda t: t.task_id)
    finish(store, clock, "r3")  # r3 ends: its activity task goes, so t3's outcome finds nothing
    assert store.complete_activity_tasks([done(t2)], clock.now()) == [True]
    wf_claim = Claim(names=frozenset({WF}), owner="w9", limit=10, lease=LEASE, after_seqs={"r1": 3})
    applied, claimed, loaded = store.complete_activity_tasks_then_claim(
        [done(t1a), done(t1a, 7), done(t1b), done(t3), done(t2)], clock.now(), wf_claim
    )
    seen.append((applied, [(t.task_id, t.run_id, t.lease) for t in claimed]))
    seen.append(
        [
            ([e.sequence_number for e in item.events], [type(m.event).__name__ for m in item.inbox])
            if isinstance(item, WorkflowInput)
            else repr(item)
            for item in loaded
        ]
    )
    r1_task = next(t for t in claimed if t.run_id == "r1")
    result = decide(store, r1_task, clock.now(), activities=[ACT], send=[("r2", event("ping")), ("r3", event("late"))])
    act_claim = Claim(names=frozenset({ACT}), owner="a7", limit=5, lease=LEASE)
    applied_w, claimed_a = store.complete_workflow_tasks_then_claim([(r1_task, result)], clock.now(), act_claim)
    seen.append((applied_w, [(t.task_id, t.run_id, t.attempt, t.lease) for t in claimed_a]))
    # a stale duplicate of that result, and a batch that names one run twice (two rounds)
    assert store.complete_workflow_tasks([(r1_task, result)], clock.now()) == [False]
    seen.append(store.complete_activity_tasks([done(claimed_a[0], "x")], clock.now()))
    for run_id in ("r1", "r2", "r3"):
        seen.append((run_id, inbox_of(store, clock, run_id), len(store.load_history(run_id))))
        record = store.get_run(run_id)
        assert record is not None
        seen.append((record.status, record.custom_status))
    return seen


def test_the_function_writes_what_the_statements_write(monkeypatch: pytest.MonkeyPatch, pg_dsn: str) -> None:
    calls: list[str] = []
    monkeypatch.setattr(activity_outcomes, "complete_finished", _counted(calls, activity_outcomes.complete_finished))
    clock = VirtualClock()
    with store_on(clock) as store:
        by_function = scripted(store, clock)
    assert calls  # the function was called
    calls.clear()
    monkeypatch.setattr(activity_outcomes, "all_finished", lambda _outcomes: False)
    clock = VirtualClock()
    with store_on(clock) as store:
        by_statements = scripted(store, clock)
    assert calls == []  # and here they were not
    assert by_function == by_statements
    assert by_function[0][0] == [True, False, True, False, False]  # (the script's own check)


def _counted(calls: list[str], function: Callable[..., object]) -> Callable[..., object]:
    def counted(*args: object) -> object:
        calls.append(function.__name__)
        return function(*args)

    return counted


def _terminate_waiting(dsn: str, schema: str, statement: str, deadline: float) -> int:
    """Terminate the backend whose statement (on the schema's ``statement``, e.g. a function's
    name and its parenthesis) waits for a lock; its pid."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                [f'%"{schema}".{statement}%'],
            ).fetchone()
            if row is not None:
                conn.execute("SELECT pg_terminate_backend(%s)", [row[0]])
                return int(row[0])
            time.sleep(0.02)
    raise AssertionError(f"no statement on {statement} came to wait")


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except psycopg.Error as exc:  # the test looks at it
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_call_cut_off_mid_way_writes_nothing_and_the_batch_applies_later(pg_dsn: str) -> None:
    clock = VirtualClock()
    with store_on(clock) as store:
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT])
        (task,) = activity(store, clock)
        with psycopg.connect(pg_dsn) as holder:  # holds r1's row: the call waits at its FOR SHARE
            holder.execute(f'SELECT 1 FROM "{store.schema}".runs WHERE run_id = %s FOR UPDATE', ["r1"])
            thread, out = _in_thread(lambda: store.complete_activity_tasks([done(task)], clock.now()))
            _terminate_waiting(pg_dsn, store.schema, "complete_activities(", time.monotonic() + 10)
            thread.join(10)
            holder.rollback()
        (error,) = out
        assert isinstance(error, psycopg.OperationalError) and not isinstance(error, StoreRejectedError)
        assert inbox_of(store, clock, "r1") == []  # nothing was written
        assert store.complete_activity_tasks([done(task)], clock.now()) == [True]  # the lease still holds
        assert inbox_of(store, clock, "r1") == ["ActivityTaskCompleted"]

        # a workflow completion cut off inside its writes: the run ends, and its remaining
        # activity task (locked here) must be deleted by the pipelined transaction
        step(store, clock, "r1", activities=[ACT])
        store.send_message("r1", event("end"), clock.now())
        wf_task = next_task(store, clock, "r1")
        ending = decide(store, wf_task, clock.now(), complete=RunStatus.COMPLETED)
        with psycopg.connect(pg_dsn) as holder:
            holder.execute(f'SELECT 1 FROM "{store.schema}".activity_tasks WHERE run_id = %s FOR UPDATE', ["r1"])
            thread, out = _in_thread(lambda: store.complete_workflow_tasks([(wf_task, ending)], clock.now()))
            _terminate_waiting(
                pg_dsn, store.schema, "activity_tasks t WHERE (t.queue, t.task_id) IN", time.monotonic() + 10
            )
            thread.join(10)
            holder.rollback()
        (error,) = out
        assert isinstance(error, psycopg.OperationalError) and not isinstance(error, StoreRejectedError)
        record = store.get_run("r1")
        assert record is not None and record.status is RunStatus.RUNNING  # rolled back as a whole
        assert store.complete_workflow_tasks([(wf_task, ending)], clock.now()) == [True]
        record = store.get_run("r1")
        assert record is not None and record.status is RunStatus.COMPLETED
        assert activity(store, clock) == []


@pytest.mark.parametrize("bad", ["a\x00b", "a\ud800b"], ids=["NUL", "lone surrogate"])
def test_text_the_function_cannot_send_is_refused_and_nothing_is_written(pg_dsn: str, bad: str) -> None:
    clock = VirtualClock()
    with store_on(clock) as store:
        start(store, clock, "r1")
        step(store, clock, "r1", activities=[ACT, ACT])
        good, other = activity(store, clock)
        stranger = done(attrs.evolve(other, lease=attrs.evolve(other.lease, owner=bad)))
        claim = Claim(names=frozenset({bad}), owner="w1", limit=1, lease=LEASE, after_seqs={})
        with pytest.raises(StoreRejectedError):
            store.complete_activity_tasks([done(good), stranger], clock.now())
        with pytest.raises(StoreRejectedError):
            store.complete_activity_tasks_then_claim([done(good)], clock.now(), claim)
        assert inbox_of(store, clock, "r1") == []  # neither batch wrote anything
        assert store.complete_activity_tasks([done(good), done(other)], clock.now()) == [True, True]
        wf_task = next_task(store, clock, "r1")
        poisoned = decide(store, wf_task, clock.now(), activities=[ACT], status=bad)
        events_before = len(store.load_history("r1"))
        act_claim = Claim(names=frozenset({ACT}), owner="a1", limit=1, lease=LEASE)
        with pytest.raises(StoreRejectedError):
            store.complete_workflow_tasks_then_claim([(wf_task, poisoned)], clock.now(), act_claim)
        assert len(store.load_history("r1")) == events_before and activity(store, clock) == []
        # the healthy result applies, and the run, and a run started afterwards, complete
        healthy = decide(store, wf_task, clock.now(), complete=RunStatus.COMPLETED)
        assert store.complete_workflow_tasks([(wf_task, healthy)], clock.now()) == [True]
        start(store, clock, "r2")
        step(store, clock, "r2", activities=[ACT])
        (task,) = activity(store, clock)
        wf_claim = Claim(names=frozenset({WF}), owner="w1", limit=1, lease=LEASE, after_seqs={})
        applied, (r2_task,), (loaded,) = store.complete_activity_tasks_then_claim([done(task)], clock.now(), wf_claim)
        assert applied == [True] and isinstance(loaded, WorkflowInput)
        assert [type(m.event) for m in loaded.inbox] == [ev.ActivityTaskCompleted]
        ending = decide(store, r2_task, clock.now(), complete=RunStatus.COMPLETED)
        assert store.complete_workflow_tasks([(r2_task, ending)], clock.now()) == [True]
        for run_id in ("r1", "r2"):
            record = store.get_run(run_id)
            assert record is not None and record.status is RunStatus.COMPLETED


@pytest.mark.parametrize("path", ["function", "statements"])
def test_a_dispatch_waits_for_no_scheduler_and_leaves_the_work_to_it(
    monkeypatch: pytest.MonkeyPatch, pg_dsn: str, path: str
) -> None:
    """While another transaction holds a scheduler's lock, a completion dispatches nothing and
    so claims nothing (the scheduler's round makes the work claimable later); once the lock is
    free, the next completion dispatches and claims again."""
    if path == "statements":
        monkeypatch.setattr(activity_outcomes, "all_finished", lambda _outcomes: False)
    clock = VirtualClock()
    wf_claim = Claim(names=frozenset({WF}), owner="w9", limit=10, lease=LEASE, after_seqs={})
    act_claim = Claim(names=frozenset({ACT}), owner="a9", limit=10, lease=LEASE)
    with store_on(clock) as store, psycopg.connect(pg_dsn, autocommit=True) as holder:

        def hold(lock: int) -> None:
            holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [lock, store.schema])

        def release(lock: int) -> None:
            holder.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", [lock, store.schema])

        for run_id in ("r1", "r2"):
            start(store, clock, run_id)
            step(store, clock, run_id, activities=[ACT])
        first, second = sorted(activity(store, clock), key=lambda t: t.task_id)
        hold(LOCK_SCHEDULE_WORKFLOWS)
        applied, claimed, _loaded = store.complete_activity_tasks_then_claim([done(first)], clock.now(), wf_claim)
        assert (applied, claimed) == ([True], [])  # written, nothing dispatched
        assert store.claim_workflow_tasks(frozenset({WF}), "x", clock.now(), LEASE, 10) == []
        release(LOCK_SCHEDULE_WORKFLOWS)
        assert store.schedule_workflow_tasks(clock.now(), 10) == 1  # the scheduler makes r1's task
        applied, claimed, _loaded = store.complete_activity_tasks_then_claim([done(second)], clock.now(), wf_claim)
        assert applied == [True] and [t.run_id for t in claimed] == ["r1", "r2"]  # dispatched again

        one, two = claimed
        hold(LOCK_SCHEDULE_ACTIVITIES)
        result = decide(store, one, clock.now(), activities=[ACT])
        assert store.complete_workflow_tasks_then_claim([(one, result)], clock.now(), act_claim) == ([True], [])
        assert store.claim_activity_tasks(frozenset({ACT}), "x", clock.now(), LEASE, 10) == []  # it waits
        release(LOCK_SCHEDULE_ACTIVITIES)
        result = decide(store, two, clock.now(), activities=[ACT])
        applied_w, tasks = store.complete_workflow_tasks_then_claim([(two, result)], clock.now(), act_claim)
        assert applied_w == [True] and sorted(t.run_id for t in tasks) == ["r1", "r2"]  # both tasks, at once
