"""The ``kafka=`` settings of ``Engine(dispatch="kafka")``, checked where they enter.

Keys are librdkafka's (``bootstrap.servers``, ``security.protocol``, ...), passed to the
producer and the consumer as given, except the few that begin with ``dex.``, which are dex's
own. Topic names are derived from the queue's kind and name: Kafka allows only ``[A-Za-z0-9._-]``
in a topic name, up to 249 characters, so a queue whose name has anything else (or is long) gets
a topic named by a digest of its name instead.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

import attrs

from dex.domain.definitions import validate_text

_TOPIC_SAFE = re.compile(r"[A-Za-z0-9_-]{1,180}")
_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,40}")

# dex's own keys, with their defaults; everything else goes to librdkafka
_OWN: dict[str, object] = {
    "dex.topic.prefix": "dex",
    "dex.topic.partitions": 3,
    "dex.topic.replication": 1,
    "dex.relay.batch": 500,
    "dex.relay.interval.seconds": 0.02,
    "dex.safety.poll.seconds": 2.0,
}


@attrs.frozen(kw_only=True)
class KafkaSettings:
    """The checked settings: librdkafka's (``client``) and dex's own."""

    client: Mapping[str, str | int | float | bool]
    prefix: str
    partitions: int
    replication: int
    relay_batch: int
    relay_interval: float
    safety_poll: float

    def topic(self, kind: str, queue: str) -> str:
        """The topic of queue ``queue`` of ``kind`` ("workflow" or "activity")."""
        if _TOPIC_SAFE.fullmatch(queue):
            return f"{self.prefix}.{kind}.{queue}"
        return f"{self.prefix}.{kind}.q-{hashlib.sha256(queue.encode()).hexdigest()[:40]}"


def schema_prefix(schema: str) -> str:
    """The default topic prefix of a schema's engines: ``dex`` for the default schema, else one
    of the schema's own, so two schemas on one broker never see each other's notices."""
    if schema == "dex":
        return "dex"
    if _TOPIC_SAFE.fullmatch(schema) and len(schema) <= 36:
        return f"dex-{schema}"
    return f"dex-{hashlib.sha256(schema.encode()).hexdigest()[:32]}"


def kafka_settings(config: object, schema: str) -> KafkaSettings:
    """``config`` checked: a mapping of str keys to str, int, float or bool values, with
    ``bootstrap.servers``. The consumer group is ``dex-<schema>`` unless ``group.id`` names one;
    the topic prefix is the schema's (:func:`schema_prefix`) unless ``dex.topic.prefix`` names
    one. ``TypeError``/``ValueError`` naming the key otherwise."""
    if config is None:
        raise ValueError('dispatch="kafka" needs kafka={"bootstrap.servers": "host:port", ...}')
    if not isinstance(config, Mapping):
        raise TypeError(f"kafka must be a mapping of librdkafka settings, got {type(config).__name__}")
    client: dict[str, str | int | float | bool] = {}
    own: dict[str, object] = {**_OWN, "dex.topic.prefix": schema_prefix(schema)}
    for key, value in config.items():
        validate_text(key, "a kafka setting's key")
        if isinstance(value, str):
            validate_text(value, f"kafka[{key!r}]")
        elif not isinstance(value, (int, float, bool)):
            raise TypeError(f"kafka[{key!r}] must be a str, int, float or bool, got {type(value).__name__}")
        if key.startswith("dex."):
            if key not in _OWN:
                raise ValueError(f"unknown dex setting kafka[{key!r}]; known: {', '.join(sorted(_OWN))}")
            own[key] = value
        else:
            client[key] = value
    servers = client.get("bootstrap.servers")
    if not isinstance(servers, str) or not servers.strip():
        raise ValueError('kafka needs "bootstrap.servers" (a str such as "127.0.0.1:9092")')
    client.setdefault("group.id", f"dex-{schema}")
    prefix = own["dex.topic.prefix"]
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(f'kafka["dex.topic.prefix"] must be 1-40 of [A-Za-z0-9._-], got {prefix!r}')
    return KafkaSettings(
        client=client,
        prefix=prefix,
        partitions=_count(own, "dex.topic.partitions"),
        replication=_count(own, "dex.topic.replication"),
        relay_batch=_count(own, "dex.relay.batch"),
        relay_interval=_seconds(own, "dex.relay.interval.seconds"),
        safety_poll=_seconds(own, "dex.safety.poll.seconds"),
    )


def _count(own: Mapping[str, object], key: str) -> int:
    value = own[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ValueError(f"kafka[{key!r}] must be an integer from 1 to 100000, got {value!r}")
    return value


def _seconds(own: Mapping[str, object], key: str) -> float:
    value = own[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
        raise ValueError(f"kafka[{key!r}] must be a number of seconds in (0, 3600], got {value!r}")
    return float(value)
