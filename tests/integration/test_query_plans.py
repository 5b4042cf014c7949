"""The polling queries stay cheap however many finished runs the database holds.

Every engine polls several times a second (the schedulers, the claims, ``next_due_time``,
leadership, retention) and writes back what its workers did (completions). Their cost must
not grow with the finished runs and their histories, which pile up until retention deletes
them, nor with the runs that wait on timers. So this test fills a schema with 20,000 finished
runs (40,000 history rows: two blocks each), 2,000 sleeping runs and 2,000 activity tasks waiting for a
retry, what the finished runs published and streamed, next to a little live work, and checks the plans of the statements the adapter really
sends (recorded from the adapter's own functions, on a session configured as the adapter's):

* no sequential scan of any table that grows with the data (see ``SMALL_TABLES`` for the
  few that may be read whole), and
* the pages each statement touches (``EXPLAIN (ANALYZE, BUFFERS)``) barely change between a
  tenth of the rows and all of them.

Each statement is explained as a prepared statement already executed six times, which is
when PostgreSQL may have switched it to a generic plan (psycopg prepares repeated statements).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import activity_tasks, completion, queues, runs, workflow_tasks
from dex.adapters.postgres.schema import Statements
from dex.adapters.postgres.sessions import session_settings
from dex.app.ports.store import ActivityOutcome
from dex.testing import VirtualClock
from tests.integration import workload

pytestmark = pytest.mark.postgres

FINISHED_RUNS = 20_000  # with 2,000 sleeping runs; measured at a tenth of that, and at all of it
EVENTS_PER_RUN = 6
# Tables that stay small whatever the load, which the planner may rightly read whole: a few
# rows each (queues, leader), and the workflow tasks of a queue (a run's task is deleted when
# it completes, and the scheduler creates no more than the queue's capacity).
SMALL_TABLES = re.compile(r"queues|leader|workflow_tasks__.*")

Operation = Callable[[psycopg.Connection, Statements, datetime], Any]


def operations(engine: dex.Engine) -> dict[str, Operation]:
    """What the engine's loops do over and over: poll (schedule, claim, due time, leadership,
    retention) and write back what the workers did (the claimed tasks, completed)."""

    def complete_workflow_tasks(conn: psycopg.Connection, q: Statements, now: datetime) -> list[bool]:
        tasks = workflow_tasks.claim_workflow_tasks(conn, q, {"pipeline"}, "plan-node", now, timedelta(seconds=60), 16)
        results = [(task, engine.workflow_worker.execute(task)) for task in tasks]
        return completion.complete_workflow_tasks(conn, q, results, now)

    def complete_activity_tasks(conn: psycopg.Connection, q: Statements, now: datetime) -> list[bool]:
        tasks = activity_tasks.claim_activity_tasks(
            conn, q, {"step", "short-step"}, "plan-node", now, timedelta(seconds=30), 16
        )
        outcomes = [ActivityOutcome(task=task, result=engine.converter.encode(1)) for task in tasks]
        return activity_tasks.complete_activity_tasks(conn, q, outcomes, now)

    return {
        "schedule workflow tasks": lambda conn, q, now: workflow_tasks.schedule_workflow_tasks(conn, q, now, 256),
        "claim workflow tasks": lambda conn, q, now: workflow_tasks.claim_workflow_tasks(
            conn, q, {"pipeline"}, "plan-node", now, timedelta(seconds=60), 16
        ),
        "schedule activity tasks": lambda conn, q, now: activity_tasks.schedule_activity_tasks(conn, q, now, 256),
        "claim activity tasks": lambda conn, q, now: activity_tasks.claim_activity_tasks(
            conn, q, {"step", "short-step"}, "plan-node", now, timedelta(seconds=30), 16
        ),
        "next due time": lambda conn, q, now: queues.next_due_time(conn, q, now),
        "leadership": lambda conn, q, now: queues.try_lead(conn, q, "plan-node", now, timedelta(seconds=15)),
        "retention": lambda conn, q, now: runs.delete_finished_runs(conn, q, now - timedelta(days=7), 500),
        "complete workflow tasks": complete_workflow_tasks,
        "complete activity tasks": complete_activity_tasks,
    }


class Recorder:
    """Stands in for a connection: passes statements on and remembers them with their parameters."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn
        self.statements: list[tuple[str, Any]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if isinstance(query, sql.Composable):
            text = query.as_string(self._conn)
        else:  # the adapter's statements come rendered, as bytes
            text = query.decode() if isinstance(query, bytes) else str(query)
        self.statements.append((text, params))
        return self._conn.execute(query, params, **kwargs)


def record(
    conn: psycopg.Connection, q: Statements, now: datetime, operation: Operation
) -> tuple[Any, list[tuple[str, Any]]]:
    """Run ``operation`` (rolled back) and return its result and the statements it sent."""
    recorder = Recorder(conn)
    with conn.transaction(force_rollback=True):
        result = operation(recorder, q, now)  # type: ignore[arg-type]
    return result, recorder.statements


_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]|%[sb]|%%")


def as_prepared(conn: psycopg.Connection, text: str, params: Any) -> tuple[str, list[str]]:
    """The statement with ``$n`` placeholders, and its arguments as SQL literals in that order."""
    names: list[Any] = []
    position = iter(range(len(params) if isinstance(params, (list, tuple)) else 0))

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        key: Any = match.group(1) if match.group(1) is not None else next(position)
        if key not in names:
            names.append(key)
        return f"${names.index(key) + 1}"

    converted = _PLACEHOLDER.sub(number, text) if params is not None else text
    literals = [sql.Literal(params[key]).as_string(conn) for key in names]
    return converted, literals


def explain(conn: psycopg.Connection, text: str, params: Any) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of one statement prepared and executed a few times first,
    as psycopg prepares a statement the adapter repeats (everything rolled back)."""
    converted, literals = as_prepared(conn, text, params)
    execute = sql.SQL("EXECUTE dex_plan{}").format(sql.SQL(f"({', '.join(literals)})" if literals else ""))
    conn.execute(sql.SQL("PREPARE dex_plan AS {}").format(sql.SQL(converted)))
    try:
        for _ in range(6):  # past the five custom plans after which PostgreSQL may go generic
            with conn.transaction(force_rollback=True):
                conn.execute(execute)
        with conn.transaction(force_rollback=True):
            row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + execute).fetchone()
    finally:
        conn.execute("DEALLOCATE dex_plan")
    assert row is not None
    return row[0][0]  # type: ignore[no-any-return]


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def seq_scans(plan: dict[str, Any]) -> set[str]:
    return {node["Relation Name"] for node in nodes(plan["Plan"]) if node["Node Type"] == "Seq Scan"}


def outline(plan: dict[str, Any]) -> str:
    """The scans of a plan, e.g. ``Seq Scan queues, Index Scan runs(runs_pkey)``."""
    return ", ".join(
        f"{node['Node Type']} {node['Relation Name']}" + (f"({node['Index Name']})" if "Index Name" in node else "")
        for node in nodes(plan["Plan"])
        if "Relation Name" in node
    )


def pages(plan: dict[str, Any]) -> int:
    """Shared buffers the statement touched (the top node's counts include its children's),
    plus those its triggers touched (foreign-key checks of an insert)."""
    top = plan["Plan"]
    return int(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))


def measure(
    conn: psycopg.Connection, q: Statements, now: datetime, ops: dict[str, Operation]
) -> dict[tuple[str, int], dict[str, Any]]:
    """The plan of every statement of every operation."""
    plans = {}
    for name, operation in ops.items():
        _, statements = record(conn, q, now, operation)
        for index, (text, params) in enumerate(statements):
            plans[(name, index)] = explain(conn, text, params) | {"statement": text}
    return plans


def make_live_work(engine: dex.Engine) -> None:
    """A little of everything the pollers look for: runs to schedule, workflow tasks to claim,
    activity tasks to schedule and to claim, leases running."""
    for n in range(11):
        engine.start_workflow(workload.pipeline, n, 0.0, "step")
    engine.workflow_scheduler.step()
    engine.workflow_worker.poll_once()
    engine.buffer.flush()  # 11 runs wait on their first activity (CREATED tasks)
    engine.activity_scheduler.step()  # ... now claimable (QUEUED)
    engine.activity_worker.claim(3)  # three are running under a lease
    for n in range(10):
        engine.start_workflow(workload.pipeline, n, 0.0, "short-step")
    engine.workflow_scheduler.step()  # 10 workflow tasks to claim
    for n in range(10):
        engine.start_workflow(workload.pipeline, n, 0.0, "short-step")  # 10 runs to schedule


def add_finished_and_waiting_rows(
    conn: psycopg.Connection, q: Statements, now: datetime, first: int, last: int
) -> None:
    """Bulk rows straight in SQL, numbered ``first`` to ``last``: finished runs with histories;
    and for every tenth, a sleeping run with a timer in its inbox and an activity task waiting
    for its retry."""
    params = {"now": now, "first": first, "last": last, "events": EVENTS_PER_RUN}
    with conn.transaction():
        conn.execute(
            q(
                "INSERT INTO {s}.runs (run_id, workflow_name, queue, status, priority, labels, created_at,"
                " started_at, completed_at, last_seq, result)"
                " SELECT 'done-' || g, 'pipeline', %(queue)s, (ARRAY['COMPLETED', 'FAILED', 'CANCELLED'])[1 + mod(g, 3)],"
                "  mod(g, 3), '{{}}', %(now)s - make_interval(secs => g * 4), %(now)s - make_interval(secs => g * 4 - 1),"
                "  %(now)s - make_interval(secs => g * 4 - 2), %(events)s, '\\x00'"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g"
            ),
            params | {"queue": workload.WORKFLOW_QUEUE},
        )
        conn.execute(
            q(
                # two blocks per run, as a run written by one task has: RunCreated, then the task's events
                "INSERT INTO {s}.history (run_id, first_seq, last_seq, events)"
                " SELECT 'done-' || g, b, CASE b WHEN 1 THEN 1 ELSE %(events)s END, decode(repeat('ab', 40 * b), 'hex')"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g, generate_series(1, 2) b"
            ),
            params,
        )
        conn.execute(
            q(
                "INSERT INTO {s}.runs (run_id, workflow_name, queue, status, priority, labels, created_at,"
                " started_at, last_seq)"
                " SELECT 'sleeping-' || g, 'pipeline', %(queue)s, 'RUNNING', 0, '{{}}', %(now)s, %(now)s, 4"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g WHERE mod(g, 10) = 0"
            ),
            params | {"queue": workload.WORKFLOW_QUEUE},
        )
        conn.execute(
            q(
                "INSERT INTO {s}.history (run_id, first_seq, last_seq, events)"
                " SELECT 'sleeping-' || g, b, CASE b WHEN 1 THEN 1 ELSE 4 END, '\\x00'"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g, generate_series(1, 2) b"
                " WHERE mod(g, 10) = 0"
            ),
            params,
        )
        conn.execute(
            q(
                "INSERT INTO {s}.inbox (run_id, kind, message, visible_from)"
                " SELECT 'sleeping-' || g, 'TimerElapsed', '\\x00', %(now)s + make_interval(secs => g)"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g WHERE mod(g, 10) = 0"
            ),
            params,
        )
        conn.execute(
            q(
                "INSERT INTO {s}.activity_tasks (queue, run_id, created_seq, name, input, priority, retry_policy,"
                " lock_timeout, visible_from, attempt)"
                " SELECT %(queue)s, 'sleeping-' || g, 3, 'step', '\\x00', 0, '\\x00', interval '1 minute',"
                "  %(now)s + make_interval(secs => g), 2"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g WHERE mod(g, 10) = 0"
            ),
            params | {"queue": workload.ACTIVITY_QUEUE},
        )
        conn.execute(
            q(
                # the failed attempts kept: the sleeping runs' retried steps, and a step of every
                # tenth finished run that was retried before it succeeded
                "INSERT INTO {s}.activity_attempts (run_id, created_seq, failed, lost, next_attempt, attempts,"
                " kinds, at, failures)"
                " SELECT CASE WHEN mod(g, 10) = 0 THEN 'sleeping-' ELSE 'done-' END || g, 3, 1, 0, 2, ARRAY[1],"
                "  ARRAY['failed'], ARRAY[%(now)s::timestamptz], ARRAY['\\x00'::bytea]"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g WHERE mod(g, 5) = 0"
            ),
            params,
        )
        conn.execute(
            q(
                # the answers of engine.update kept: two for every run, finished or asleep, each
                # with a result of a hundred bytes
                "INSERT INTO {s}.update_answers (run_id, update_id, result, failure, rejected, answered_at)"
                " SELECT CASE WHEN mod(g, 10) = 0 THEN 'sleeping-' ELSE 'done-' END || g, 'u-' || g || '-' || u,"
                "  decode(repeat('ab', 100), 'hex'), NULL, false, %(now)s"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g, generate_series(1, 2) u"
            ),
            params,
        )
        conn.execute(
            q(
                # what the finished runs published and streamed (docs/reference/contract.md §14):
                # a value, and a closed stream of three items, each
                "INSERT INTO {s}.published (run_id, key, value, version, published_at)"
                " SELECT 'done-' || g, 'stage', '\\x00', 1, %(now)s"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g"
            ),
            params,
        )
        conn.execute(
            q(
                "INSERT INTO {s}.stream_items (run_id, key, position, value, written_at)"
                " SELECT 'done-' || g, 'progress', p, '\\x00', %(now)s"
                " FROM generate_series(%(first)s::integer, %(last)s::integer) g, generate_series(1, 3) p"
            ),
            params,
        )
        conn.execute(
            q(
                "INSERT INTO {s}.closed_streams (run_id, key, closed_at)"
                " SELECT 'done-' || g, 'progress', %(now)s FROM generate_series(%(first)s::integer, %(last)s::integer) g"
            ),
            params,
        )
    conn.execute(
        q(
            "ANALYZE {s}.runs, {s}.history, {s}.inbox, {s}.workflow_tasks, {s}.activity_tasks, {s}.queues,"
            " {s}.activity_attempts, {s}.update_answers, {s}.published, {s}.stream_items, {s}.closed_streams"
        )
    )


def test_polling_cost_does_not_grow_with_finished_runs(
    make_adapter: Callable[..., Any], pg_dsn: str, clock: VirtualClock
) -> None:
    adapter = make_adapter()
    engine = dex.Engine(adapter, workflows=workload.WORKFLOWS, activities=workload.ACTIVITIES, node_id="live")
    make_live_work(engine)
    q = Statements(adapter.schema)
    now = clock.now()
    tenth = FINISHED_RUNS // 10
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        session_settings()(conn)  # as the adapter's pooled sessions
        add_finished_and_waiting_rows(conn, q, now, 1, tenth)
        # the operations find work to do, so their plans are those of a busy engine, not an idle one
        ops = operations(engine)
        results = {name: record(conn, q, now, operation)[0] for name, operation in ops.items()}
        assert results["schedule workflow tasks"] == 10
        assert len(results["claim workflow tasks"]) == 10
        assert len(results["claim activity tasks"]) == 8
        assert results["retention"] == 0
        assert results["complete workflow tasks"] == [True] * 10
        assert results["complete activity tasks"] == [True] * 8
        small = measure(conn, q, now, ops)

        add_finished_and_waiting_rows(conn, q, now, tenth + 1, FINISHED_RUNS)
        results = {name: record(conn, q, now, operation)[0] for name, operation in ops.items()}
        assert results["schedule workflow tasks"] == 10 and results["complete workflow tasks"] == [True] * 10
        large = measure(conn, q, now, ops)

    problems, report = [], []
    for key, plan in large.items():
        scanned = {table for table in seq_scans(plan) if not SMALL_TABLES.fullmatch(table)}
        line = (
            f"{key}: {pages(small[key])} -> {pages(plan)} pages, planned in {plan['Planning Time']:.2f} ms;"
            f" {outline(plan)}"
        )
        report.append(line)
        # ten times the rows cost a few more pages for deeper indexes (more so for statements that
        # insert into them); reading the finished runs whole would cost some 350 more
        if scanned or pages(plan) > pages(small[key]) + 100:
            problems.append(f"{line}\n{plan['statement']}")
    print("\n".join(report))
    assert not problems, "\n\n".join(problems)
