"""The engine registry (docs/reference/contract.md §15), on every adapter.

A started engine is listed by ``list_engines()`` with its host, pid, code version, names and
queues; its row is refreshed with the leader-election heartbeat (once per heartbeat period, not
per round or task), deleted by ``stop()``, and no longer listed once a crashed engine's row
expires. A store that fails a heartbeat does not stop the engine: the next heartbeat writes it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.app.ports.store import Store
from dex.testing import VirtualClock

LEASE = timedelta(seconds=15)  # the default leader lease: a heartbeat each 5 s, expiry after 15 s


@dex.workflow(name="registry-wf", queue="registry-wq")
async def registry_wf(ctx: dex.WorkflowContext) -> int:
    return 1


@dex.activity(name="registry-act", queue="registry-aq")
def registry_act() -> int:
    return 1


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


class FlakyRegistry:
    """A store whose registry heartbeat fails while ``failing`` is set; counts the heartbeats."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.failing = threading.Event()
        self.heartbeats = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def heartbeat_engine(self, *args: Any) -> None:
        self.heartbeats += 1
        if self.failing.is_set():
            raise ConnectionError("the database is unreachable")
        self.store.heartbeat_engine(*args)


@pytest.fixture
def flaky(adapter_factory: Callable[[], Any]) -> Iterator[Callable[..., tuple[dex.Engine, FlakyRegistry]]]:
    engines: list[dex.Engine] = []

    def make(**kwargs: Any) -> tuple[dex.Engine, FlakyRegistry]:
        store = FlakyRegistry(adapter_factory())
        engine = dex.Engine(store, [registry_wf], [registry_act], **kwargs)  # type: ignore[arg-type]
        engines.append(engine)
        return engine, store

    yield make
    for engine in engines:
        engine.stop(timeout=5)


def test_two_started_engines_are_listed_with_what_they_run(make_engine: Callable[..., dex.Engine]) -> None:
    first = make_engine([registry_wf], node_id="registry-a", code_version="v1")
    second = make_engine(activities=[registry_act], node_id="registry-b")
    assert first.list_engines() == []  # built, not started: not an engine that runs anything
    first.start()
    second.start()
    listed = {info.node_id: info for info in second.list_engines()}
    assert sorted(listed) == ["registry-a", "registry-b"]
    a, b = listed["registry-a"], listed["registry-b"]
    assert (a.host, a.pid, a.code_version) == (socket.gethostname(), os.getpid(), "v1")
    assert (a.workflows, a.activities, a.queues) == (("registry-wf",), (), ("registry-wq",))
    assert (b.code_version, b.workflows, b.activities, b.queues) == (None, (), ("registry-act",), ("registry-aq",))
    assert a.started_at <= a.last_seen
    assert isinstance(a, dex.EngineInfo)


def test_a_stopped_engine_is_gone_at_once(make_engine: Callable[..., dex.Engine]) -> None:
    staying = make_engine([registry_wf], node_id="registry-stays")
    leaving = make_engine([registry_wf], node_id="registry-leaves")
    staying.start()
    leaving.start()
    leaving.stop(timeout=5)
    assert [info.node_id for info in staying.list_engines()] == ["registry-stays"]
    staying.stop(timeout=5)
    assert staying.list_engines() == []


def test_a_crashed_engine_is_gone_once_its_row_expires_and_a_live_one_stays(
    make_engine: Callable[..., dex.Engine], clock: VirtualClock
) -> None:
    live = make_engine([registry_wf], node_id="registry-live")
    live.start()
    # what a process killed at this moment leaves: its last heartbeat, never its stop
    now = clock.now()
    crashed = dex.EngineInfo(
        node_id="registry-crashed",
        host="elsewhere",
        pid=4242,
        code_version=None,
        workflows=("registry-wf",),
        activities=(),
        queues=("registry-wq",),
        started_at=now,
        last_seen=now,
    )
    live.store.heartbeat_engine(crashed, now, now + LEASE)
    assert [info.node_id for info in live.list_engines()] == ["registry-crashed", "registry-live"]
    clock.advance(LEASE / 2)
    assert [info.node_id for info in live.list_engines()] == ["registry-crashed", "registry-live"]
    clock.advance(LEASE / 2 + timedelta(seconds=1))  # past the crashed row's expiry
    assert "registry-crashed" not in [info.node_id for info in live.list_engines()]
    # the live engine's heartbeat renews its own row (and deletes the expired one)
    assert eventually(lambda: [info.node_id for info in live.list_engines()] == ["registry-live"])
    (info,) = live.list_engines()
    assert info.last_seen > now and info.started_at == now
    assert live.store.list_engines(now) == [info]  # even read as of then, the crashed row is gone


def test_the_row_is_refreshed_once_per_heartbeat_period_not_per_round(
    flaky: Callable[..., tuple[dex.Engine, FlakyRegistry]], clock: VirtualClock
) -> None:
    engine, store = flaky(node_id="registry-rounds", poll_interval=0.01)
    engine.start()
    time.sleep(0.3)  # dozens of scheduler rounds, and the clock has not moved
    assert store.heartbeats == 1
    clock.advance(LEASE / 3)
    assert eventually(lambda: store.heartbeats == 2)
    (info,) = engine.list_engines()
    assert info.last_seen == clock.now()


def test_a_failing_store_does_not_stop_the_engine_and_the_next_heartbeat_writes_the_row(
    flaky: Callable[..., tuple[dex.Engine, FlakyRegistry]], clock: VirtualClock
) -> None:
    engine, store = flaky(node_id="registry-flaky")
    store.failing.set()
    engine.start()  # its first write fails: logged, and the engine runs anyway
    assert engine.list_engines() == []
    clock.advance(LEASE / 3)
    assert eventually(lambda: store.heartbeats >= 2)
    assert engine.list_engines() == []
    run_id = engine.start_workflow(registry_wf)
    assert engine.wait(run_id, timeout=10) == 1  # the engine works while its row cannot be written
    store.failing.clear()
    clock.advance(LEASE / 3)
    assert eventually(lambda: [info.node_id for info in engine.list_engines()] == ["registry-flaky"])
    assert all(engine.health().threads.values())


def test_names_reach_the_row_as_registered(make_engine: Callable[..., dex.Engine]) -> None:
    # workflow, activity and queue names are ASCII (dex.workflow refuses others); a node id and a
    # code version are any text PostgreSQL stores
    engine = make_engine([registry_wf], node_id="registry-ünïcode-節点", code_version="v-ß")
    engine.start()
    (info,) = engine.list_engines()
    assert (info.node_id, info.workflows, info.code_version) == ("registry-ünïcode-節点", ("registry-wf",), "v-ß")


@pytest.mark.parametrize("bad", ["nul\x00name", "lone\ud800surrogate"])
def test_poison_names_are_refused_before_any_row_is_written(
    make_engine: Callable[..., dex.Engine], clock: VirtualClock, bad: str
) -> None:
    async def named(ctx: dex.WorkflowContext) -> None:
        return None

    with pytest.raises(ValueError):
        dex.workflow(name=bad)(named)
    with pytest.raises(ValueError):
        dex.activity(name=bad)(named)
    with pytest.raises(ValueError):
        dex.workflow(queue=bad)(named)
    with pytest.raises(ValueError):
        make_engine(node_id=bad)
    with pytest.raises(ValueError):
        make_engine(code_version=bad)
    # the store refuses such a row itself, naming the field, and keeps nothing of it
    engine = make_engine([registry_wf], node_id="registry-poison")
    now = clock.now()
    fields = {"node_id": "registry-poison-row", "host": "h", "pid": 1, "code_version": None}
    lists = {"workflows": ("ok",), "activities": (), "queues": ()}
    for field in ("node_id", "host", "code_version", "workflows", "activities", "queues"):
        values: dict[str, Any] = {**fields, **lists}
        values[field] = (bad,) if field in lists else bad
        row = dex.EngineInfo(started_at=now, last_seen=now, **values)
        with pytest.raises(ValueError, match=field):
            engine.store.heartbeat_engine(row, now, now + LEASE)
    assert engine.list_engines() == []
