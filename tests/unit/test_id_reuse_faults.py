"""A keyed start (docs/reference/contract.md §15) when the store fails in the middle of it: the caller gets
the store's error, nothing half-made is left, and a start repeated under ``id_reuse="never"``
answers with the run the failed call made if its write did happen (an answer lost on the way
back), or makes it now if it did not."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.domain import events as ev
from dex.domain.instance_keys import StartRule
from dex.testing import VirtualClock


@dex.workflow(name="echo")
async def echo(ctx: dex.WorkflowContext, value: str) -> str:
    return value


class StoreDown(ConnectionError):
    pass


class FailingStarts(InMemoryAdapter):
    """Fails the next keyed start, before its write (``before``) or after it (the answer lost)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock=clock)
        self.fail: str | None = None

    def start_keyed_run(
        self, run_id: str, created: ev.RunCreated, now: datetime, rule: StartRule, connection: object = None
    ) -> str:
        when, self.fail = self.fail, None
        if when == "before":
            raise StoreDown("the store went away before the write")
        got = super().start_keyed_run(run_id, created, now, rule, connection)
        if when == "after":
            raise StoreDown("the answer was lost after the write")
        return got


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_start_repeated_after_a_store_failure_makes_one_run(when: str) -> None:
    clock = VirtualClock()
    store = FailingStarts(clock)
    engine = dex.Engine(store, workflows=[echo])
    store.fail = when
    with pytest.raises(StoreDown):
        engine.start_workflow(echo, "a", instance_id="pay-1", id_reuse="never")
    made = engine.list_runs(instance_id="pay-1")
    assert len(made) == (1 if when == "after" else 0)
    again = engine.start_workflow(echo, "a", instance_id="pay-1", id_reuse="never")
    assert [r.run_id for r in engine.list_runs(instance_id="pay-1")] == [again]
    engine.drain()
    assert engine.wait(again) == "a"
    # a healthy start of another id afterwards
    other = engine.start_workflow(echo, "b", instance_id="pay-2", id_reuse="never")
    engine.drain()
    assert engine.wait(other) == "b"


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_a_base_exception_from_the_store_reaches_the_caller_and_the_engine_goes_on(exc: Any) -> None:
    clock = VirtualClock()

    class Interrupting(FailingStarts):
        def start_keyed_run(self, *args: Any, **kwargs: Any) -> str:
            if self.fail:
                self.fail = None
                raise exc()
            return super().start_keyed_run(*args, **kwargs)

    store = Interrupting(clock)
    engine = dex.Engine(store, workflows=[echo])
    store.fail = "yes"
    with pytest.raises(exc):
        engine.start_workflow(echo, "a", instance_id="k", id_reuse="failed_only")
    assert engine.list_runs() == []
    run_id = engine.start_workflow(echo, "a", instance_id="k", id_reuse="failed_only")
    engine.drain()
    assert engine.wait(run_id) == "a"


def test_a_transactional_keyed_start_on_the_memory_adapter_is_a_type_error() -> None:
    engine = dex.Engine(InMemoryAdapter(clock=VirtualClock()), workflows=[echo])
    with pytest.raises(TypeError, match="connection= needs the PostgreSQL adapter"):
        engine.start_workflow(echo, "a", instance_id="k", id_reuse="never", connection=object())
    assert engine.list_runs() == []
