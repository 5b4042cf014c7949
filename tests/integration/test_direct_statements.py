"""The start's statement through libpq directly (dex.adapters.postgres.direct): the values it
sends read back as psycopg would send them, errors are psycopg's; inside a transaction nothing
of it is prepared on the session, so psycopg's ``DEALLOCATE ALL`` after a rollback (or anyone's
``DISCARD ALL``) takes nothing from it: starts, schedule triggers and fires inside a
transaction go on working on a connection whose earlier transaction rolled back. Outside a
transaction it is prepared once per session, and prepared again when the session lost it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dex
from dex.adapters.postgres import direct
from dex.app.ports.store import Claim, Lease, RunFilter, WorkflowInput
from dex.domain import events as ev
from dex.testing import VirtualClock


@pytest.fixture(scope="module")
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as connection:
        connection.execute("SET TIME ZONE 'UTC'")
        yield connection


ECHO = direct.DirectStatement(
    "dex_test_echo",
    b"SELECT $1::text, $2::int4, $3::bool, $4::timestamptz, $5::jsonb, $6::text[], $7::bytea",
    [direct.TEXT, direct.INT4, direct.BOOL, direct.TIMESTAMPTZ, direct.JSONB, direct.TEXT_ARRAY, direct.BYTEA],
)


def echo(conn: psycopg.Connection, *params: bytes | None) -> tuple[object, ...]:
    """What the server read from ``params``, as psycopg loads it."""
    result = ECHO.execute(conn, list(params))
    assert result.ntuples == 1
    texts = [direct.value(result, column) for column in range(result.nfields)]
    # the same values, read back through psycopg's own loaders (bytea comes as hex text)
    row = conn.execute(
        "SELECT %s::text, %s::int4, %s::bool, %s::timestamptz, %s::jsonb, %s::text[]", texts[:6]
    ).fetchone()
    assert row is not None
    data = texts[6]
    return (*row, bytes.fromhex(data[2:]) if data is not None else None)


# what an array literal or JSON must escape, often, and any other character now and then
names = st.text(
    st.sampled_from("\"\\,{} 'NULLü") | st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=12,
)


@given(
    word=names,
    number=st.integers(-(2**31), 2**31 - 1),
    flag=st.booleans(),
    labels=st.dictionaries(names, names, max_size=3),
    array=st.lists(names, max_size=4),
    data=st.binary(max_size=40),
)
@settings(max_examples=60, deadline=None)
def test_values_read_back_as_sent(
    conn: psycopg.Connection,
    word: str,
    number: int,
    flag: bool,
    labels: dict[str, str],
    array: list[str],
    data: bytes,
) -> None:
    when = datetime(2026, 11, 24, 7, 30, 1, 123456, tzinfo=UTC)
    got = echo(
        conn,
        direct.text(word),
        direct.int4(number),
        direct.boolean(flag),
        direct.timestamptz(when),
        direct.jsonb_object(labels.items()),
        direct.text_array(array),
        data,
    )
    assert got == (word, number, flag, when, labels, array, data)


def test_nulls_and_other_time_zones(conn: psycopg.Connection) -> None:
    assert echo(conn, None, b"0", b"f", None, b"{}", None, None) == (None, 0, False, None, {}, None, None)
    east = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert echo(conn, None, b"1", b"t", direct.timestamptz(east), b"{}", b"{}", b"")[3] == east
    # a naive time is read in the session's time zone (UTC), as psycopg sends one
    naive = datetime(2026, 1, 2, 3, 4, 5)
    assert echo(conn, None, b"1", b"t", direct.timestamptz(naive), b"{}", b"{}", b"")[3] == naive.replace(tzinfo=UTC)


def test_an_error_is_psycopgs_and_the_session_goes_on(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        ECHO.execute(conn, [None, b"not a number", b"t", None, b"{}", None, None])
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        ECHO.execute(conn, [None, b"1", b"t", None, b"{", None, None])  # not JSON
    assert echo(conn, b"ok", b"1", b"t", None, b"{}", None, None)[0] == "ok"


def test_a_wrong_number_of_parameters_is_refused_before_sending(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError, match="7 parameters expected, got 2"):
        ECHO.execute(conn, [b"a", b"1"])


def _prepared(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%$7::bytea%"]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_inside_a_transaction_nothing_of_it_is_prepared_on_the_session(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as connection, connection.transaction():
        assert echo(connection, b"x", b"1", b"t", None, b"{}", None, None)[0] == "x"
        assert _prepared(connection) == 0


def test_outside_a_transaction_it_is_prepared_once_per_session(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as connection:
        for n in range(3):
            assert echo(connection, b"x", str(n).encode(), b"t", None, b"{}", None, None)[1] == n
        assert _prepared(connection) == 1


@pytest.mark.parametrize("reset", ["rollback", "DEALLOCATE ALL", "DISCARD ALL"])
def test_outside_a_transaction_a_session_that_lost_it_prepares_it_again(pg_dsn: str, reset: str) -> None:
    """The session forgets the prepared form (psycopg's ``DEALLOCATE ALL`` after a rollback,
    a pool's ``DISCARD ALL``): the next execution fails having done nothing, outside any
    transaction, and is made again after preparing; the session stays usable."""
    with psycopg.connect(pg_dsn, autocommit=True) as connection:
        for _ in range(3):
            connection.execute("SELECT %s::int", [1], prepare=True)  # psycopg has prepared a statement
        assert echo(connection, b"before", b"1", b"t", None, b"{}", None, None)[0] == "before"
        assert _prepared(connection) == 1
        for n in range(3):
            if reset == "rollback":
                with pytest.raises(psycopg.errors.DivisionByZero), connection.transaction():
                    connection.execute("SELECT 1 / 0")
            else:
                connection.execute(reset)
            assert _prepared(connection) == 0  # the session lost it
            assert echo(connection, b"after", str(n).encode(), b"f", None, b"{}", None, None)[:2] == ("after", n)
            assert _prepared(connection) == 1
            assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert connection.execute("SELECT %s::int", [2], prepare=True).fetchone() == (2,)


def test_an_error_of_the_prepared_form_is_psycopgs_and_names_no_other_statement(pg_dsn: str) -> None:
    """A statement the server refuses to prepare (an unknown function) raises psycopg's error,
    and is tried again (and refused again) at the next execution, not remembered as prepared."""
    broken = direct.DirectStatement("dex_test_broken", b"SELECT dex_no_such_function($1::text)", [direct.TEXT])
    with psycopg.connect(pg_dsn, autocommit=True) as connection:
        for _ in range(2):
            with pytest.raises(psycopg.errors.UndefinedFunction):
                broken.execute(connection, [b"x"])
        assert connection.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("reset", ["rollback", "DEALLOCATE ALL", "DISCARD ALL"])
def test_a_transaction_after_a_reset_of_the_session_runs_it(pg_dsn: str, reset: str) -> None:
    """psycopg answers a rollback with ``DEALLOCATE ALL`` once it has prepared statements of
    its own on the connection: a statement of dex's prepared beside them was dropped, and its
    second try ran inside the aborted transaction (``InFailedSqlTransaction`` from then on)."""
    with psycopg.connect(pg_dsn, autocommit=True) as connection:
        for _ in range(3):
            connection.execute("SELECT %s::int", [1], prepare=True)  # psycopg has prepared a statement
        with connection.transaction():
            assert echo(connection, b"before", b"1", b"t", None, b"{}", None, None)[0] == "before"
        for _ in range(3):
            if reset == "rollback":
                with pytest.raises(psycopg.errors.DivisionByZero), connection.transaction():
                    connection.execute("SELECT 1 / 0")
            else:
                connection.execute(reset)
            connection.execute("SELECT %s::int", [1], prepare=True)
            with connection.transaction():
                assert echo(connection, b"after", b"2", b"f", None, b"{}", None, None)[0] == "after"
                assert connection.execute("SELECT 1").fetchone() == (1,)  # the transaction is not aborted
            assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.fixture(params=["direct", "public"])
def start_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each start test runs on both paths: through libpq (the psycopg versions direct.py was
    checked against) and through psycopg's execute (any other version)."""
    if request.param == "public":
        monkeypatch.setattr(direct, "AVAILABLE", False)
    else:
        assert direct.AVAILABLE, f"psycopg {psycopg.__version__} is outside direct.CHECKED: check it, widen the range"
    return str(request.param)


def test_the_guard_takes_only_the_checked_psycopg_versions(caplog: pytest.LogCaptureFixture) -> None:
    low, high = direct.CHECKED
    inside = f"{low[0]}.{low[1]}.0"
    assert direct.supported(inside) and not caplog.records
    for outside in (f"{high[0]}.{high[1]}.0", f"{low[0]}.{low[1] - 1}.9", "4.0.0", "3.x"):
        caplog.clear()
        assert not direct.supported(outside)
        assert [r.levelname for r in caplog.records] == ["WARNING"] and outside in caplog.records[0].getMessage()


def test_a_start_on_the_public_path_never_touches_libpq_directly(make_adapter, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Outside the checked versions nothing of direct.py's internals runs: a start still works."""
    monkeypatch.setattr(direct, "AVAILABLE", False)

    def refuse(*_args: object) -> None:
        raise AssertionError("the direct statement ran outside the checked psycopg versions")

    monkeypatch.setattr(direct.DirectStatement, "execute", refuse)
    adapter = make_adapter()
    adapter.ensure_queue("q_1", "workflow")
    created = ev.RunCreated(workflow_name="wf", input=(), queue="q_1")
    assert adapter.create_run("run-public-1", created, VirtualClock().now()) == "run-public-1"
    assert adapter.get_run("run-public-1") is not None


def test_a_start_with_labels_and_keys_reads_back(make_adapter, start_path: str) -> None:  # type: ignore[no-untyped-def]
    """Every field of a start that travels as text: the run reads back as it was created."""
    adapter = make_adapter()
    adapter.ensure_queue("q_1", "workflow")
    now = VirtualClock().now()
    created = ev.RunCreated(
        workflow_name='wf "quoted" \\ ü',
        input=(),
        queue="q_1",
        instance_id="inst,{1}",
        priority=7,
        concurrency_key='key "k"',
        labels=(("tenant", "ä,{b}"), ("x", '"y"')),
    )
    run_id = adapter.create_run("run-direct-1", created, now)
    record = adapter.get_run(run_id)
    assert record is not None
    assert (record.workflow_name, record.queue, record.instance_id, record.priority) == (
        'wf "quoted" \\ ü',
        "q_1",
        "inst,{1}",
        7,
    )
    assert (record.concurrency_key, dict(record.labels), record.created_at) == (
        'key "k"',
        {"tenant": "ä,{b}", "x": '"y"'},
        now,
    )
    # the same instance id again: the live run's id, nothing created
    assert adapter.create_run("run-direct-2", created, now) == run_id
    assert adapter.get_run("run-direct-2") is None


def test_a_start_that_claims_names_its_workflow_among_quoted_names(make_adapter, start_path: str) -> None:  # type: ignore[no-untyped-def]
    """The claim's workflow names travel as an array literal: quotes, commas and braces in a
    name must not split or spoil it, or the start would claim nothing."""
    adapter = make_adapter()
    name = 'wf "a,b" {c} \\ d'
    adapter.ensure_queue("default", "workflow")
    now = VirtualClock().now()
    created = ev.RunCreated(workflow_name=name, input=(), queue="default")
    claim = Claim(names=frozenset({name, "other"}), owner="node-1", limit=1, lease=timedelta(seconds=30))
    run_id, tasks, loaded = adapter.create_run_then_claim("run-direct-3", created, now, claim)
    assert [(t.run_id, t.workflow_name, t.queue, t.lease) for t in tasks] == [
        (run_id, name, "default", Lease(owner="node-1", until=now + timedelta(seconds=30), version=1))
    ]
    # the task and the message the start returned are the rows the server holds
    assert adapter.claim_workflow_tasks(frozenset({name}), "node-2", now, timedelta(seconds=30), 10) == []
    (given,) = loaded
    assert isinstance(given, WorkflowInput)
    assert [event.event for event in given.events] == [created]
    assert [message.event for message in given.inbox] == [ev.RunStarted()]
    (stored,) = adapter.load_workflow_tasks([(tasks[0], 0)], now)
    assert isinstance(stored, WorkflowInput)
    assert [m.message_id for m in stored.inbox] == [m.message_id for m in given.inbox]
    assert [e.event for e in stored.events] == [created]


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("instance_id", {"instance_id": "a\x00b"}),
        ("concurrency_key", {"concurrency_key": "k\x00"}),
        ("workflow_name", {"workflow_name": "wf\x00x"}),
        ("labels", {"labels": (("tenant", "a\x00b"),)}),
        ("labels", {"labels": (("ten\x00ant", "a"),)}),
    ],
)
def test_a_nul_in_a_start_is_refused_not_truncated(make_adapter, field: str, change: dict, start_path: str) -> None:  # type: ignore[no-untyped-def]
    """libpq reads a text parameter as a C string: ``"a\\x00b"`` would be stored as ``"a"``
    (another run's instance id). The adapter refuses it, naming the field, and sends nothing;
    a healthy start afterwards is stored as it was created."""
    from dex.app.ports.store import StoreRejectedError

    adapter = make_adapter()
    adapter.ensure_queue("q_1", "workflow")
    now = VirtualClock().now()
    fields = {"workflow_name": "wf", "input": (), "queue": "q_1", "instance_id": None, **change}
    with pytest.raises(StoreRejectedError, match=field):
        adapter.create_run("run-nul-1", ev.RunCreated(**fields), now)
    assert adapter.get_run("run-nul-1") is None
    assert adapter.list_runs(RunFilter()) == []

    healthy = ev.RunCreated(workflow_name="wf", input=(), queue="q_1", instance_id="a", labels=(("t", "b"),))
    assert adapter.create_run("run-nul-2", healthy, now) == "run-nul-2"
    record = adapter.get_run("run-nul-2")
    assert record is not None and (record.instance_id, dict(record.labels)) == ("a", {"t": "b"})


@dex.workflow(name="direct-one")
async def one(ctx: dex.WorkflowContext, n: int) -> int:
    return n


def test_a_rolled_back_request_leaves_starts_triggers_and_fires_working(  # type: ignore[no-untyped-def]
    make_adapter, clock: VirtualClock, start_path: str
) -> None:
    """The reproduction: on an adapter whose pool has one connection besides the one kept for
    starts, a request that rolls back (cancelling an ended run: InvalidStateError) runs on the
    connection that schedule triggers and fires use next, after psycopg has prepared statements
    there. Each trigger and fire afterwards starts its run; a healthy run completes."""
    adapter = make_adapter(min_connections=2, max_connections=2)
    every = dex.Schedule("direct-every-minute", one, every=timedelta(minutes=1), args=(7,))
    engine = dex.Engine(adapter, [one], [], schedules=[every])
    ended = engine.start_workflow(one, 1)
    engine.drain(advance_time=False)
    assert engine.wait(ended, timeout=5) == 1
    for _ in range(8):  # psycopg prepares what runs five times on the connection
        assert engine.get_run(ended).status == dex.RunStatus.COMPLETED
    started = [engine.trigger_schedule("direct-every-minute")]
    for _ in range(3):
        with pytest.raises(dex.InvalidStateError):
            engine.cancel(ended)  # rolled back on the pooled connection
        started.append(engine.trigger_schedule("direct-every-minute"))
        with pytest.raises(dex.InvalidStateError):
            engine.cancel(ended)
        before = {run.run_id for run in engine.list_runs()}
        engine.drain(until=timedelta(minutes=1))  # the schedule fires, in the scheduler's transaction
        fired = {run.run_id for run in engine.list_runs()} - before
        assert fired, "the schedule did not fire"
        started.extend(fired)
    engine.drain(advance_time=False)
    assert [engine.wait(run_id, timeout=5) for run_id in started] == [7] * len(started)
    healthy = engine.start_workflow(one, 2)
    engine.drain(advance_time=False)
    assert engine.wait(healthy, timeout=5) == 2


def test_a_nul_in_any_text_parameter_is_refused_before_sending(conn: psycopg.Connection) -> None:
    from dex.app.ports.store import StoreRejectedError

    with pytest.raises(StoreRejectedError, match=r"\$1 contains a NUL"):
        ECHO.execute(conn, [b"a\x00b", b"1", b"t", None, b"{}", None, None])
    with pytest.raises(StoreRejectedError, match=r"\$6 contains a NUL"):
        ECHO.execute(conn, [b"a", b"1", b"t", None, b"{}", direct.text_array(["x\x00"]), None])
    # bytea goes as binary with its length: a NUL in it is data
    assert echo(conn, b"ok", b"1", b"t", None, b"{}", None, b"\x00\x01")[6] == b"\x00\x01"
