"""PostgresAdapter against a real server: schema, partitions, claims, leases, keys, leadership."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import attrs
import psycopg
import pytest
from psycopg import sql

import dex
from dex.adapters.postgres import LATEST_VERSION, DatabaseConnectionError, PostgresAdapter, migrate, schema_version
from dex.adapters.postgres import schema as pg_schema_module
from dex.app.ports.store import ActivityOutcome, WorkflowInput, WorkflowTask
from dex.domain import events as ev
from dex.domain.retry import RetryPolicy
from dex.domain.task import NewActivityTask, WorkflowTaskResult
from dex.domain.values import Payload
from dex.testing import VirtualClock

pytestmark = pytest.mark.postgres

MakeAdapter = Callable[..., PostgresAdapter]
LEASE = timedelta(seconds=30)


def new_run(
    store: PostgresAdapter,
    clock: VirtualClock,
    *,
    queue: str = "main",
    instance_id: str | None = None,
    priority: int = 0,
    concurrency_key: str | None = None,
) -> str:
    created = ev.RunCreated(
        workflow_name="wf",
        input=(),
        queue=queue,
        instance_id=instance_id,
        priority=priority,
        concurrency_key=concurrency_key,
    )
    return store.create_run(str(uuid.uuid4()), created, clock.now())


def first_task_result(
    store: PostgresAdapter, task: WorkflowTask, clock: VirtualClock, **extra: object
) -> WorkflowTaskResult:
    """What a worker would write for a run's first task: start it, optionally add effects."""
    history, inbox = store.load_workflow_task(task, clock.now())
    last = history[-1].sequence_number
    now = clock.now()
    events = [ev.WorkflowTaskStarted(), *(m.event for m in inbox), ev.WorkflowTaskCompleted()]
    return WorkflowTaskResult(
        run_id=task.run_id,
        expected_last_seq=last,
        new_events=tuple(
            ev.HistoryEvent(sequence_number=last + i + 1, timestamp=now, event=e) for i, e in enumerate(events)
        ),
        consumed=tuple(m.message_id for m in inbox),
        started=True,
        **extra,  # type: ignore[arg-type]
    )


def table_names(dsn: str, schema: str, parent: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n ON n.oid = p.relnamespace"
            " WHERE n.nspname = %s AND p.relname = %s",
            [schema, parent],
        ).fetchall()
    return {row[0] for row in rows}


# -- schema ---------------------------------------------------------------------------------


def test_migrations_are_idempotent_and_serialise(pg_dsn: str, pg_schema: str) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            assert migrate(pg_dsn, pg_schema) == LATEST_VERSION
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert migrate(pg_dsn, pg_schema) == LATEST_VERSION
    with psycopg.connect(pg_dsn) as conn:
        assert schema_version(conn, pg_schema) == LATEST_VERSION


def schema_at_version(conn: psycopg.Connection, schema: str, version: int) -> pg_schema_module.Statements:
    """Create ``schema`` as the migrations up to ``version`` left it; return its Statements."""
    assert migrate(conn, schema, version=version) == version
    return pg_schema_module.Statements(schema)


def test_migration_3_drops_the_foreign_keys_of_an_older_schema(pg_dsn: str, pg_schema: str) -> None:
    def foreign_keys(conn: psycopg.Connection) -> int:
        row = conn.execute(
            "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = %s AND c.contype = 'f'",
            [pg_schema],
        ).fetchone()
        return row[0] if row else -1

    with psycopg.connect(pg_dsn) as conn:
        with conn.transaction():  # a schema as version 2 left it: foreign keys to runs
            schema_at_version(conn, pg_schema, 2)
        pg_schema_module.create_partition(conn, pg_schema, "workflow", "main")
        conn.commit()
        assert foreign_keys(conn) > 0
        assert migrate(conn, pg_schema) == LATEST_VERSION
        assert foreign_keys(conn) == 0  # the partitions' copies went with the parents'
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}.schema_version").format(sql.Identifier(pg_schema)))
        assert count.fetchone() == (LATEST_VERSION,)


def test_migration_5_turns_the_stored_events_into_one_event_blocks(
    make_adapter: MakeAdapter, pg_dsn: str, pg_schema: str
) -> None:
    from dex.serialization.history import encode_event

    # events of 1-, 2- and 3-byte lengths: the migration writes each length as a varint
    moment = datetime(2024, 5, 6, tzinfo=UTC)
    events = [
        ev.HistoryEvent(
            sequence_number=1, timestamp=moment, event=ev.RunCreated(workflow_name="w", input=(), queue="main")
        ),
        ev.HistoryEvent(sequence_number=2, timestamp=moment, event=ev.WorkflowTaskStarted()),
        ev.HistoryEvent(
            sequence_number=3,
            timestamp=moment,
            event=ev.ActivityTaskCompleted(created_seq=1, result=Payload(encoding="json", data=b"1" * 300)),
        ),
        ev.HistoryEvent(
            sequence_number=4,
            timestamp=moment,
            event=ev.ActivityTaskCompleted(created_seq=1, result=Payload(encoding="json", data=b"2" * 20_000)),
        ),
    ]
    with psycopg.connect(pg_dsn) as conn:
        with conn.transaction():  # a schema as version 4 left it: one history row per event
            q = schema_at_version(conn, pg_schema, 4)
            conn.execute(
                q(
                    "INSERT INTO {s}.runs (run_id, workflow_name, queue, status, priority, labels, created_at, last_seq)"
                    " VALUES ('old', 'w', 'main', 'RUNNING', 0, '{{}}', %s, 4)"
                ),
                [moment],
            )
            for event in events:
                conn.execute(
                    q("INSERT INTO {s}.history (run_id, seq, event) VALUES ('old', %s, %s)"),
                    [event.sequence_number, encode_event(event)],
                )
        assert migrate(conn, pg_schema) == LATEST_VERSION
        rows = conn.execute(q("SELECT first_seq, last_seq FROM {s}.history ORDER BY first_seq")).fetchall()
        assert rows == [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert make_adapter().load_history("old") == events


def test_each_queue_gets_a_partition_with_a_quoted_name(make_adapter: MakeAdapter, pg_dsn: str, pg_schema: str) -> None:
    store = make_adapter()
    store.ensure_queue("a-b_1", "workflow")
    store.ensure_queue("a-b_1", "activity")
    store.ensure_queue("a-b_1", "activity")  # idempotent
    store.create_queue("other", "activity", 5)
    assert table_names(pg_dsn, pg_schema, "workflow_tasks") == {"workflow_tasks__a-b_1"}
    assert table_names(pg_dsn, pg_schema, "activity_tasks") == {"activity_tasks__a-b_1", "activity_tasks__other"}
    # a task of that queue lands in that partition
    clock = store.clock
    assert isinstance(clock, VirtualClock)
    new_run(store, clock, queue="a-b_1")
    assert store.schedule_workflow_tasks(clock.now(), 10) == 1
    with psycopg.connect(pg_dsn) as conn:
        table = conn.execute(
            sql.SQL("SELECT tableoid::regclass::text FROM {}.workflow_tasks").format(sql.Identifier(pg_schema))
        ).fetchone()
    assert table is not None and table[0].endswith('."workflow_tasks__a-b_1"')


def test_queue_admin(make_adapter: MakeAdapter) -> None:
    store = make_adapter()
    store.create_queue("q1", "workflow", 3)
    store.set_queue_paused("q1", "workflow", True)
    store.set_queue_capacity("q1", "workflow", 7)
    assert [(q.name, q.kind, q.status, q.capacity) for q in store.list_queues()] == [("q1", "workflow", "PAUSED", 7)]
    with pytest.raises(ValueError, match="no activity queue"):
        store.set_queue_paused("q1", "activity", True)
    with pytest.raises(ValueError):
        store.ensure_queue("Bad Name", "workflow")


# -- claims and leases ----------------------------------------------------------------------


def test_two_adapters_never_claim_the_same_task(make_adapter: MakeAdapter, clock: VirtualClock) -> None:
    first, second = make_adapter(), make_adapter()
    first.create_queue("main", "workflow", 1000)
    run_ids = {new_run(first, clock) for _ in range(200)}
    assert first.schedule_workflow_tasks(clock.now(), 1000) == 200
    claimed: dict[str, list[int]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def claim(name: str, store: PostgresAdapter) -> None:
        start.wait()
        while tasks := store.claim_workflow_tasks({"wf"}, name, clock.now(), LEASE, 7):
            claimed[name].extend(task.task_id for task in tasks)

    threads = [threading.Thread(target=claim, args=item) for item in (("a", first), ("b", second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not set(claimed["a"]) & set(claimed["b"])
    assert len(claimed["a"]) + len(claimed["b"]) == len(run_ids)


def test_a_claim_skips_rows_locked_by_another_transaction(
    make_adapter: MakeAdapter, clock: VirtualClock, pg_dsn: str, pg_schema: str
) -> None:
    store = make_adapter()
    locked_run, free_run = new_run(store, clock), new_run(store, clock)
    store.schedule_workflow_tasks(clock.now(), 10)
    claimed: list[WorkflowTask] = []
    with psycopg.connect(pg_dsn) as conn:  # holds a row lock until the block ends
        conn.execute(
            sql.SQL("SELECT 1 FROM {}.workflow_tasks WHERE run_id = %s FOR UPDATE").format(sql.Identifier(pg_schema)),
            [locked_run],
        )
        claimer = threading.Thread(
            target=lambda: claimed.extend(store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10))
        )
        claimer.start()
        claimer.join(timeout=2)
        waited = claimer.is_alive()
    claimer.join()
    assert not waited, "the claim waited for a locked row instead of skipping it"
    assert [task.run_id for task in claimed] == [free_run]


def test_a_completion_after_the_lease_was_lost_is_discarded(make_adapter: MakeAdapter, clock: VirtualClock) -> None:
    first, second = make_adapter(), make_adapter()
    run_id = new_run(first, clock)
    first.schedule_workflow_tasks(clock.now(), 10)
    [stale] = first.claim_workflow_tasks({"wf"}, "a", clock.now(), timedelta(seconds=10), 10)
    stale_result = first_task_result(first, stale, clock)
    assert second.claim_workflow_tasks({"wf"}, "b", clock.now(), LEASE, 10) == []  # the lease holds
    clock.advance(timedelta(seconds=11))
    [fresh] = second.claim_workflow_tasks({"wf"}, "b", clock.now(), LEASE, 10)
    assert fresh.task_id == stale.task_id and fresh.lease.version == stale.lease.version + 1
    assert first.complete_workflow_tasks([(stale, stale_result)], clock.now()) == [False]
    assert second.complete_workflow_tasks([(fresh, first_task_result(second, fresh, clock))], clock.now()) == [True]
    record = second.get_run(run_id)
    assert record is not None and record.status is dex.RunStatus.RUNNING
    assert [e.kind for e in second.load_history(run_id)] == [
        "RunCreated", "WorkflowTaskStarted", "RunStarted", "WorkflowTaskCompleted",
    ]  # fmt: skip


def test_a_stale_result_is_dropped_without_breaking_its_batch(make_adapter: MakeAdapter, clock: VirtualClock) -> None:
    store = make_adapter()
    good_run, raced_run = new_run(store, clock), new_run(store, clock)
    store.schedule_workflow_tasks(clock.now(), 10)
    tasks = {t.run_id: t for t in store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)}
    good = first_task_result(store, tasks[good_run], clock)
    raced = first_task_result(store, tasks[raced_run], clock)
    raced = attrs.evolve(raced, expected_last_seq=0)  # as if a racing duplicate wrote first
    applied = store.complete_workflow_tasks([(tasks[raced_run], raced), (tasks[good_run], good)], clock.now())
    assert applied == [False, True]
    assert len(store.load_history(good_run)) == 4
    assert len(store.load_history(raced_run)) == 1


def test_each_write_is_one_history_row_and_a_tail_load_starts_inside_it(
    make_adapter: MakeAdapter, clock: VirtualClock, pg_dsn: str, pg_schema: str
) -> None:
    store = make_adapter()
    run_id = new_run(store, clock)
    store.schedule_workflow_tasks(clock.now(), 10)
    [task] = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    assert store.complete_workflow_tasks([(task, first_task_result(store, task, clock))], clock.now()) == [True]
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT first_seq, last_seq FROM {}.history WHERE run_id = %s ORDER BY first_seq").format(
                sql.Identifier(pg_schema)
            ),
            [run_id],
        ).fetchall()
    assert rows == [(1, 1), (2, 4)]  # RunCreated at the start, then the task's three events
    store.send_message(
        run_id, ev.ExternalEventReceived(event_id="go", payload=Payload(encoding="json", data=b"1")), clock.now()
    )
    store.schedule_workflow_tasks(clock.now(), 10)
    [second] = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    for after, kinds in (
        (3, ["RunStarted", "WorkflowTaskCompleted"]),  # from inside the task's block
        (4, ["WorkflowTaskCompleted"]),
        (0, ["RunCreated", "WorkflowTaskStarted", "RunStarted", "WorkflowTaskCompleted"]),
    ):
        [loaded] = store.load_workflow_tasks([(second, after)], clock.now())
        assert isinstance(loaded, WorkflowInput)
        history, inbox = loaded.events, loaded.inbox
        assert [e.kind for e in history] == kinds
        assert [type(m.event).__name__ for m in inbox] == ["ExternalEventReceived"]
        single, _inbox = store.load_workflow_task(second, clock.now(), after_seq=after)
        assert single == history


def test_activity_leases_heartbeats_and_takeover(make_adapter: MakeAdapter, clock: VirtualClock) -> None:
    store = make_adapter()
    run_id = new_run(store, clock)
    store.schedule_workflow_tasks(clock.now(), 10)
    [task] = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    spec = NewActivityTask(
        run_id=run_id, created_seq=3, name="act", input=(Payload(encoding="json/plain", data=b"1"),),
        queue="acts", priority=0, retry_policy=RetryPolicy(), lock_timeout=timedelta(seconds=10),
        visible_from=clock.now(),
    )  # fmt: skip
    assert store.complete_workflow_tasks(
        [(task, first_task_result(store, task, clock, activity_tasks=(spec,)))], clock.now()
    ) == [True]
    # the completion dispatched the due task in its own transaction: nothing left to schedule
    assert store.schedule_activity_tasks(clock.now(), 10) == 0
    [attempt1] = store.claim_activity_tasks({"act"}, "a", clock.now(), LEASE, 10)
    assert attempt1.attempt == 1 and attempt1.input == spec.input
    clock.advance(timedelta(seconds=8))
    assert store.extend_activity_leases([attempt1], clock.now(), LEASE) == [True]  # now until +18 s
    clock.advance(timedelta(seconds=8))
    assert store.claim_activity_tasks({"act"}, "b", clock.now(), LEASE, 10) == []
    clock.advance(timedelta(seconds=3))
    [attempt2] = store.claim_activity_tasks({"act"}, "b", clock.now(), LEASE, 10)
    assert attempt2.attempt == 2
    late = ActivityOutcome(task=attempt1, result=Payload(encoding="json/plain", data=b"2"))
    assert store.complete_activity_tasks([late], clock.now()) == [False]
    assert store.extend_activity_leases([attempt1], clock.now(), LEASE) == [False]
    done = ActivityOutcome(task=attempt2, result=Payload(encoding="json/plain", data=b"3"))
    assert store.complete_activity_tasks([done, done], clock.now()) == [True, False]
    assert store.schedule_workflow_tasks(clock.now(), 10) == 0  # dispatched by the completion
    [task2] = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    _, inbox = store.load_workflow_task(task2, clock.now())
    assert [m.event for m in inbox] == [ev.ActivityTaskCompleted(created_seq=3, result=done.result)]  # type: ignore[arg-type]


# -- runs ---------------------------------------------------------------------------------


def test_instance_ids_are_unique_among_live_runs(make_adapter: MakeAdapter, clock: VirtualClock) -> None:
    stores = [make_adapter(), make_adapter()]
    ids: list[str] = []
    start = threading.Barrier(8)

    def create(index: int) -> None:
        start.wait()
        ids.append(new_run(stores[index % 2], clock, instance_id="order-1"))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 1
    store = stores[0]
    store.request_transition(ids[0], dex.RunStatus.CANCELLED, ev.RunCancelled(), clock.now())
    store.schedule_workflow_tasks(clock.now(), 10)
    [task] = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    result = first_task_result(store, task, clock, completion=ev.RunCompleted(status=dex.RunStatus.CANCELLED))
    assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
    assert new_run(store, clock, instance_id="order-1") != ids[0]  # the id is free again


def test_concurrency_key_is_held_by_one_run_highest_priority_first(
    make_adapter: MakeAdapter, clock: VirtualClock
) -> None:
    store = make_adapter()
    low = new_run(store, clock, concurrency_key="K", priority=1)
    clock.advance(1)
    high = new_run(store, clock, concurrency_key="K", priority=9)
    other = new_run(store, clock, concurrency_key="L")
    assert store.schedule_workflow_tasks(clock.now(), 10) == 2
    tasks = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    assert sorted(t.run_id for t in tasks) == sorted([high, other])
    results = [(t, first_task_result(store, t, clock)) for t in tasks]
    assert store.complete_workflow_tasks(results, clock.now()) == [True, True]
    store.send_message(
        high, ev.ExternalEventReceived(event_id="e", payload=Payload(encoding="json/plain", data=b"1")), clock.now()
    )
    assert store.schedule_workflow_tasks(clock.now(), 10) == 1  # the holder goes on, `low` still waits
    [task] = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    done = first_task_result(
        store,
        task,
        clock,
        completion=ev.RunCompleted(status=dex.RunStatus.COMPLETED, result=Payload(encoding="json/plain", data=b"1")),
    )
    assert store.complete_workflow_tasks([(task, done)], clock.now()) == [True]
    assert store.schedule_workflow_tasks(clock.now(), 10) == 1
    [task] = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    assert task.run_id == low


def test_leader_election_between_two_nodes(make_adapter: MakeAdapter, clock: VirtualClock) -> None:
    first, second = make_adapter(), make_adapter()
    ttl = timedelta(seconds=15)
    assert first.try_lead("node-a", clock.now(), ttl)
    assert not second.try_lead("node-b", clock.now(), ttl)
    clock.advance(10)
    assert first.try_lead("node-a", clock.now(), ttl)  # renewed until +25 s
    clock.advance(10)
    assert not second.try_lead("node-b", clock.now(), ttl)
    clock.advance(6)
    assert second.try_lead("node-b", clock.now(), ttl)  # a's lease expired
    assert not first.try_lead("node-a", clock.now(), ttl)
    second.release_leadership("node-b")
    assert first.try_lead("node-a", clock.now(), ttl)


def test_finished_runs_are_deleted_with_their_rows(
    make_adapter: MakeAdapter, clock: VirtualClock, pg_dsn: str, pg_schema: str
) -> None:
    store = make_adapter()
    run_id, live = new_run(store, clock), new_run(store, clock)
    store.schedule_workflow_tasks(clock.now(), 10)
    task = next(t for t in store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10) if t.run_id == run_id)
    done = first_task_result(
        store,
        task,
        clock,
        completion=ev.RunCompleted(status=dex.RunStatus.FAILED, failure=dex.FailureInfo(type="X", message="m")),
    )
    store.complete_workflow_tasks([(task, done)], clock.now())
    tables = ("history", "inbox", "workflow_tasks", "activity_tasks")

    def rows_of(run: str) -> dict[str, int]:
        with psycopg.connect(pg_dsn) as conn:
            counts = {}
            for table in tables:
                row = conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE run_id = %s").format(sql.Identifier(pg_schema, table)), [run]
                ).fetchone()
                counts[table] = row[0] if row else -1
            return counts

    with psycopg.connect(pg_dsn) as conn:  # rows a crash or a race could leave behind an ended run
        schema = sql.Identifier(pg_schema)
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.inbox (run_id, kind, message, visible_from) VALUES (%s, 'RunStarted', '', now())"
            ).format(schema),
            [run_id],
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.workflow_tasks (queue, run_id, workflow_name, priority) VALUES ('main', %s, 'wf', 0)"
            ).format(schema),
            [run_id],
        )
    live_rows = rows_of(live)
    assert live_rows["history"] == 1 and live_rows["inbox"] == 1 and live_rows["workflow_tasks"] == 1
    assert store.delete_finished_runs(clock.now(), 10) == 0  # completed_at is not before the cut-off
    clock.advance(1)
    assert store.delete_finished_runs(clock.now(), 10) == 1
    assert store.get_run(run_id) is None and store.get_run(live) is not None
    assert rows_of(run_id) == dict.fromkeys(tables, 0)
    assert rows_of(live) == live_rows  # nothing of the live run went with it


# -- connecting -----------------------------------------------------------------------------


def test_an_unreachable_server_fails_fast_and_clearly() -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseConnectionError) as caught:
        PostgresAdapter("postgresql://dex:s3cret@127.0.0.1:1/dexdb", connect_timeout=2)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "127.0.0.1:1/dexdb" in message and "s3cret" not in message
    assert isinstance(caught.value, dex.DexError) and isinstance(caught.value, ConnectionError)


def test_a_malformed_dsn_fails_clearly() -> None:
    with pytest.raises(DatabaseConnectionError, match="invalid PostgreSQL DSN") as caught:
        PostgresAdapter("host=localhost password=s3cret nonsense")
    assert "s3cret" not in str(caught.value)


def test_dispatch_at_completion_keeps_pause_and_capacity(make_adapter: MakeAdapter, clock: VirtualClock) -> None:
    store = make_adapter()
    store.ensure_queue("acts", "activity")
    store.set_queue_paused("acts", "activity", True)
    run_id = new_run(store, clock)
    store.schedule_workflow_tasks(clock.now(), 10)
    [task] = store.claim_workflow_tasks({"wf"}, "w", clock.now(), LEASE, 10)
    specs = tuple(
        NewActivityTask(
            run_id=run_id,
            created_seq=3 + i,
            name="act",
            input=(Payload(encoding="json/plain", data=b"1"),),
            queue="acts",
            priority=0,
            retry_policy=RetryPolicy(),
            lock_timeout=timedelta(seconds=10),
            visible_from=clock.now(),
        )
        for i in range(3)
    )
    assert store.complete_workflow_tasks(
        [(task, first_task_result(store, task, clock, activity_tasks=specs))], clock.now()
    ) == [True]
    assert store.claim_activity_tasks({"act"}, "a", clock.now(), LEASE, 10) == []  # paused: not dispatched
    store.set_queue_paused("acts", "activity", False)
    store.set_queue_capacity("acts", "activity", 2)
    assert store.schedule_activity_tasks(clock.now(), 10) == 2  # capacity still rules
    assert len(store.claim_activity_tasks({"act"}, "a", clock.now(), LEASE, 10)) == 2
