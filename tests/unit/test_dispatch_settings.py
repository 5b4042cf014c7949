"""The Kafka dispatch mode's pure parts: the settings and topic names, the notice codec, and
the switch of a database's mode at an engine's start (no broker, no database)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from dex.adapters.kafka.notices import decode_notice, encode_notice
from dex.adapters.kafka.settings import kafka_settings, schema_prefix
from dex.app.ports.notices import KAFKA, POLLING, TaskNotice
from dex.app.runtime.notices import set_dispatch, task_notices

NOTICE = TaskNotice(
    kind="activity", queue="default", task_id=7, run_id="r-1", name="a", created_at=datetime(2026, 1, 2, tzinfo=UTC)
)


def test_a_notice_survives_its_codec_and_anything_else_is_none() -> None:
    assert decode_notice(encode_notice(NOTICE)) == NOTICE
    data = json.loads(encode_notice(NOTICE))
    for bad in ({**data, "v": 2}, {**data, "kind": "x"}, {**data, "task_id": "7"}, {**data, "name": "a\x00"}):
        assert decode_notice(json.dumps(bad).encode()) is None
    assert decode_notice(b"\x00\xff") is None
    assert decode_notice(None) is None


def test_topics_are_named_for_kafka_whatever_the_queue_and_schema() -> None:
    settings = kafka_settings({"bootstrap.servers": "127.0.0.1:9"}, "dex")
    assert settings.topic("workflow", "default") == "dex.workflow.default"
    assert settings.client["group.id"] == "dex-dex"
    assert schema_prefix("tenant_a") == "dex-tenant_a"
    long = schema_prefix("a" * 60)
    assert long.startswith("dex-") and len(long) <= 40
    other = kafka_settings({"bootstrap.servers": "h:1", "dex.topic.prefix": "p", "group.id": "g"}, "dex")
    assert other.topic("activity", "q") == "p.activity.q" and other.client["group.id"] == "g"


class _Store:
    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.modes: list[str] = []

    def set_dispatch(self, mode: str) -> None:
        self.modes.append(mode)
        if self.fails:
            raise ConnectionError("the store is down")

    def task_notices(self, config: object) -> object:
        raise AssertionError("not built here")


def test_a_polling_start_survives_a_store_that_is_down_and_a_kafka_start_does_not() -> None:
    down = _Store(fails=True)
    set_dispatch(down, POLLING)  # logged; the polling engine starts as it always did
    with pytest.raises(ConnectionError):
        set_dispatch(down, KAFKA)
    up = _Store(fails=False)
    set_dispatch(up, KAFKA)
    assert up.modes == [KAFKA]


def test_the_mode_is_checked_before_anything_is_built() -> None:
    with pytest.raises(ValueError, match="dispatch must be one of"):
        task_notices(_Store(fails=False), "Kafka", None)
    assert task_notices(object(), POLLING, None) == (POLLING, None)
