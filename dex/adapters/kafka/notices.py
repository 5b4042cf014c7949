"""Task notices over Kafka: the relay's producer and the engines' consumer (:mod:`dex.app.ports.notices`).

A notice is a small JSON object (kind, queue, task id, run id, name, the time it was written),
published to the topic of its queue with the run id as key, so the notices of one run keep
their order in one partition. The producer is idempotent (``enable.idempotence``): a retry
inside librdkafka never writes a message twice, and the relay deletes an outbox row only after
its delivery report came back without error. A relay that dies between the publish and the
delete publishes those rows again: a duplicate, which the claim by task id skips.

The consumer commits its offsets after the notices it received were handled (claimed or
skipped), so a consumer that dies before claiming leaves them to another member of its group
(or, failing that, to the slow poll of the task tables). A message that is not a notice of one
of this engine's queues and names is skipped and counted, never raised: the topics are open to
other writers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from dex.adapters.kafka.settings import KafkaSettings
from dex.adapters.postgres.outbox import PostgresOutbox
from dex.app.ports.notices import NoticeClaims, Received, RelayReport, TaskNotice
from dex.app.ports.store import ActivityTask, Claim, WorkflowTask
from dex.domain.definitions import validate_text

log = logging.getLogger("dex.kafka")

_KINDS = ("workflow", "activity")
_DELIVERY_SECONDS = 0.5  # the longest a relay round waits for the broker's reports


def encode_notice(notice: TaskNotice) -> bytes:
    return json.dumps(
        {
            "v": 1,
            "kind": notice.kind,
            "queue": notice.queue,
            "task_id": notice.task_id,
            "run_id": notice.run_id,
            "name": notice.name,
            "created_at": notice.created_at.isoformat(),
        },
        separators=(",", ":"),
    ).encode()


def decode_notice(value: bytes | None) -> TaskNotice | None:
    """The notice in a message's value, or None if it is not one (anything else on the topic)."""
    if value is None or len(value) > 65_536:
        return None
    try:
        data = json.loads(value)
        if not isinstance(data, dict) or data.get("v") != 1 or data.get("kind") not in _KINDS:
            return None
        task_id = data["task_id"]
        if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 < task_id < 2**63:
            return None
        created_at = datetime.fromisoformat(data["created_at"])
        if created_at.tzinfo is None:
            return None
        return TaskNotice(
            kind=data["kind"],
            queue=validate_text(data["queue"], "queue"),
            task_id=task_id,
            run_id=validate_text(data["run_id"], "run_id"),
            name=validate_text(data["name"], "name"),
            created_at=created_at,
        )
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


class KafkaNotices:
    """The outbox of one PostgreSQL schema relayed through Kafka, and one engine's consumer."""

    def __init__(self, outbox: PostgresOutbox, settings: KafkaSettings) -> None:
        import confluent_kafka  # the kafka extra: only when the mode is used
        import confluent_kafka.admin

        self._kafka = confluent_kafka
        self._admin_api: Any = confluent_kafka.admin  # its names are not re-exported for the type checker
        self._outbox, self.settings = outbox, settings
        self.safety_poll, self.relay_interval = settings.safety_poll, settings.relay_interval
        self._producer: Any = None
        self._consumer: Any = None
        self._admin: Any = None
        self._known: set[str] = set()  # topics known to exist
        self._subscribed: dict[str, tuple[str, str]] = {}  # topic -> (kind, queue)
        self._names: frozenset[str] = frozenset()
        self._uncommitted = False
        self._batch_start: dict[tuple[str, int], int] = {}  # the last receive's first offsets
        # the relay's notices published and not yet reported on, and the reports come in
        # (delivery callbacks run in the relay's thread, inside its flush)
        self._in_flight: set[int] = set()
        self._acked: list[int] = []
        self._refused: list[tuple[int, Any]] = []

    # -- the engine's start and stop ----------------------------------------------------------
    def open(
        self, workflow_queues: Collection[str], activity_queues: Collection[str], names: Collection[str] = ()
    ) -> None:
        kafka, client = self._kafka, dict(self.settings.client)
        self._acked, self._refused = [], []  # reports of a previous start are not this one's
        common = {k: v for k, v in client.items() if k != "group.id"}
        self._admin = self._admin_api.AdminClient(common)
        self._producer = kafka.Producer({**common, "enable.idempotence": True, "acks": "all", "linger.ms": 2})
        self._names = frozenset(names)
        self._subscribed = {self.settings.topic("workflow", q): ("workflow", q) for q in workflow_queues} | {
            self.settings.topic("activity", q): ("activity", q) for q in activity_queues
        }
        if self._subscribed:
            self.ensure_topics(self._subscribed)
            self._consumer = kafka.Consumer(
                {
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",  # a new group misses no notice published before it
                    # a notice is small and wanted at once; a broker that lost its topics (a
                    # restart without storage) is noticed within a second; a consumer that died
                    # gives its partitions up within seconds (and a join waits about half that)
                    "fetch.wait.max.ms": 10,
                    "topic.metadata.refresh.interval.ms": 1000,
                    "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 500,
                    **client,
                }
            )
            self._consumer.subscribe(sorted(self._subscribed))

    def close(self) -> None:
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = self._admin = None
        self._known.clear()
        self._in_flight.clear()
        if consumer is not None:
            try:
                consumer.close()  # leaves the group: its partitions go to the others at once
            except Exception:
                log.warning("closing the Kafka consumer failed", exc_info=True)
        if producer is not None:
            producer.flush(1.0)

    # -- topics ---------------------------------------------------------------------------------
    def ensure_topics(self, topics: Collection[str]) -> None:
        """Create the topics not known to exist (an existing one is fine)."""
        missing = sorted(set(topics) - self._known)
        if not missing or self._admin is None:
            return
        new = [
            self._admin_api.NewTopic(
                t, num_partitions=self.settings.partitions, replication_factor=self.settings.replication
            )
            for t in missing
        ]
        # bounded waits: a broker that does not answer fails this round, not the engine's stop
        for topic, future in self._admin.create_topics(new, operation_timeout=2, request_timeout=3).items():
            try:
                future.result(timeout=4)
            except self._kafka.KafkaException as exc:
                if exc.args[0].code() != self._kafka.KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            self._known.add(topic)

    # -- the relay (the leader's) ------------------------------------------------------------------
    def relay(self, now: datetime) -> RelayReport:
        """One round: publish the waiting notices not already on their way, wait a little for
        the broker's reports, delete what it acknowledged. A notice whose report has not come
        back stays in flight into the next rounds (it is not published again meanwhile), so a
        broker that does not answer holds a round for at most ``_DELIVERY_SECONDS``."""
        producer = self._producer
        if producer is None:
            raise RuntimeError("the Kafka notices are not open (the engine is not started)")
        batch = self._outbox.batch(now, self.settings.relay_batch)
        dropped = [row_id for _notice, row_id, waiting in batch if not waiting]
        sending = [(notice, row_id) for notice, row_id, waiting in batch if waiting and row_id not in self._in_flight]
        self.ensure_topics({self.settings.topic(n.kind, n.queue) for n, _ in sending})
        for notice, row_id in sending:
            topic = self.settings.topic(notice.kind, notice.queue)
            try:
                producer.produce(topic, encode_notice(notice), notice.run_id.encode(), on_delivery=self._report(row_id))
            except BufferError:
                break  # the local queue is full: what is not sent waits for the next round
            except self._kafka.KafkaException as exc:  # refused before sending (too large, ...): kept
                self._refused.append((row_id, exc.args[0]))
                continue
            self._in_flight.add(row_id)
        producer.flush(_DELIVERY_SECONDS)  # the reports come in here, in this thread
        acked, refused = self._acked, self._refused
        self._acked, self._refused = [], []
        self._in_flight.difference_update(acked)
        self._in_flight.difference_update(row_id for row_id, _err in refused)
        if refused:
            log.warning("the broker refused %d notice(s), kept for a later round: %s", len(refused), refused[0][1])
        if any(err.code() == self._kafka.KafkaError.UNKNOWN_TOPIC_OR_PART for _r, err in refused):
            self._known.clear()  # the broker lost its topics (a restart of a broker without storage)
        self._outbox.delete(dropped + acked)
        # an idle leader relays every few milliseconds: the depth costs a statement only when
        # something may be left (a full batch, or notices kept)
        left = len(batch) >= self.settings.relay_batch or bool(refused) or bool(self._in_flight)
        depth, lag = self._outbox.depth(now) if left else (0, 0.0)
        return RelayReport(published=len(acked), dropped=len(dropped), refused=len(refused), depth=depth, lag=lag)

    def _report(self, row_id: int) -> Any:
        def report(err: Any, _msg: Any) -> None:
            if err is None:
                self._acked.append(row_id)
            else:
                self._refused.append((row_id, err))

        return report

    # -- the consumer (every engine's) ----------------------------------------------------------------
    def receive(self, timeout: float) -> Received:
        consumer = self._consumer
        if consumer is None:
            return Received()
        # the first message is waited for, the rest of the batch only taken if already here:
        # consume(n, timeout) would wait the whole timeout for n messages
        first = consumer.poll(timeout)
        messages = [first, *consumer.consume(num_messages=499, timeout=0)] if first is not None else []
        notices: list[TaskNotice] = []
        skipped: dict[str, int] = {}
        self._batch_start = {}
        for message in messages:
            err = message.error()
            if err is not None:
                if err.code() == self._kafka.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    self._known.clear()
                    self.ensure_topics(self._subscribed)  # lost by the broker: made again
                elif err.code() != self._kafka.KafkaError._PARTITION_EOF:
                    log.warning("Kafka consumer: %s", err)
                continue
            self._uncommitted = True
            self._batch_start.setdefault((message.topic(), message.partition()), message.offset())
            notice = decode_notice(message.value())
            if notice is None:
                skipped["malformed"] = skipped.get("malformed", 0) + 1
            elif self._subscribed.get(message.topic()) != (notice.kind, notice.queue):
                skipped["other-queue"] = skipped.get("other-queue", 0) + 1
            elif self._names and notice.name not in self._names:
                skipped["other-name"] = skipped.get("other-name", 0) + 1
            else:
                notices.append(notice)
        return Received(notices=tuple(notices), skipped=skipped)

    def received(self) -> None:
        consumer = self._consumer
        if consumer is None or not self._uncommitted:
            return
        try:
            consumer.commit(asynchronous=False)
            self._uncommitted = False
        except self._kafka.KafkaException as exc:
            if exc.args[0].code() != self._kafka.KafkaError._NO_OFFSET:
                raise
            self._uncommitted = False

    def rewind(self) -> None:
        consumer, start, self._batch_start = self._consumer, self._batch_start, {}
        if consumer is None:
            return
        for (topic, partition), offset in start.items():
            try:
                consumer.seek(self._kafka.TopicPartition(topic, partition, offset))
            except self._kafka.KafkaException:  # no longer assigned: its new owner reads from the commit
                log.info("could not rewind %s[%d]", topic, partition, exc_info=True)

    # -- claims by notice ------------------------------------------------------------------------------
    def claim_workflow_tasks(
        self, notices: Sequence[TaskNotice], claim: Claim, now: datetime
    ) -> NoticeClaims[WorkflowTask]:
        return self._outbox.claim_workflow_tasks(notices, claim.names, claim.owner, now, claim.lease, claim.limit)

    def claim_activity_tasks(
        self, notices: Sequence[TaskNotice], claim: Claim, now: datetime
    ) -> NoticeClaims[ActivityTask]:
        return self._outbox.claim_activity_tasks(notices, claim.names, claim.owner, now, claim.lease, claim.limit)
