"""A hypothesis state machine over starts by instance id (docs/reference/contract.md §15) on the
in-memory adapter with a virtual clock: starts under the three ``id_reuse`` modes, with and
without ``debounce``/``debounce_max``, cancels of waiting runs, retention and the passing of
time, each checked against a model a few lines long."""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.testing import VirtualClock


@dex.workflow(name="echo")
async def echo(ctx: dex.WorkflowContext, value: str) -> str:
    if value == "fail":
        raise RuntimeError("asked to fail")
    return value


KEYS = ("a", "b", "c")
MODES = ("allow", "failed_only", "never")
SECOND = timedelta(seconds=1)


@attrs.define
class ModelRun:
    run_id: str
    created_at: datetime
    start_at: datetime
    value: str
    status: str = "waiting"  # then COMPLETED, FAILED or CANCELLED
    started_at: datetime | None = None


class InstanceKeys(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = VirtualClock()
        self.adapter = InMemoryAdapter(clock=self.clock)
        self.engine = dex.Engine(self.adapter, workflows=[echo])
        self.runs: dict[str, list[ModelRun]] = {key: [] for key in KEYS}  # creation order

    # -- the model ---------------------------------------------------------------------------
    def _expected(self, key: str, mode: str) -> ModelRun | None:
        """The run a start answers with (None: a new one)."""
        runs = self.runs[key]
        waiting = [r for r in runs if r.status == "waiting"]
        if waiting:
            return waiting[0]
        if runs and (mode == "never" or (mode == "failed_only" and runs[-1].status == "COMPLETED")):
            return runs[-1]
        return None

    @staticmethod
    def _start_at(now: datetime, first: datetime, debounce: timedelta | None, cap: timedelta | None) -> datetime:
        if debounce is None:
            return now
        due = now + debounce
        return min(due, max(first + cap, now)) if cap is not None else due

    def _settle(self) -> None:
        """Run what is due now; in the model, runs whose start is due end at once."""
        self.engine.drain(advance_time=False)
        now = self.clock.now()
        for runs in self.runs.values():
            for run in runs:
                if run.status == "waiting" and run.start_at <= now:
                    run.status = "FAILED" if run.value == "fail" else "COMPLETED"
                    run.started_at = now  # the first drain at or after its start time

    # -- rules ----------------------------------------------------------------------------------
    @rule(
        key=st.sampled_from(KEYS),
        mode=st.sampled_from(MODES),
        value=st.sampled_from(["x", "y", "fail"]),
        debounce=st.none() | st.integers(0, 5).map(lambda n: n * SECOND),
        cap=st.none() | st.integers(0, 12).map(lambda n: n * SECOND),
    )
    def start(self, key: str, mode: str, value: str, debounce: timedelta | None, cap: timedelta | None) -> None:
        if debounce is None:
            cap = None
        now = self.clock.now()
        expected = self._expected(key, mode)
        got = self.engine.start_workflow(
            echo, value, instance_id=key, id_reuse=mode, debounce=debounce, debounce_max=cap
        )
        if expected is None:
            assert all(got != r.run_id for r in self.runs[key])
            self.runs[key].append(ModelRun(got, now, self._start_at(now, now, debounce, cap), value))
        else:
            assert got == expected.run_id
            if expected.status == "waiting" and debounce is not None:
                expected.value = value
                expected.start_at = self._start_at(now, expected.created_at, debounce, cap)
        self._settle()

    @rule(seconds=st.integers(1, 6))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds * SECOND)
        self._settle()

    @precondition(lambda self: any(r.status == "waiting" for runs in self.runs.values() for r in runs))
    @rule(data=st.data())
    def cancel_a_waiting_run(self, data: st.DataObject) -> None:
        waiting = [r for runs in self.runs.values() for r in runs if r.status == "waiting"]
        run = data.draw(st.sampled_from(waiting))
        self.engine.cancel(run.run_id)
        run.status = "CANCELLED"
        self._settle()

    @rule()
    def retention(self) -> None:
        """Retention deletes every ended run: their ids are free again, whatever the mode."""
        self.adapter.delete_finished_runs(self.clock.now() + SECOND, 10_000)
        for key, runs in self.runs.items():
            self.runs[key] = [r for r in runs if r.status == "waiting"]

    # -- what must hold -------------------------------------------------------------------------
    @invariant()
    def the_store_holds_the_models_runs(self) -> None:
        for key, runs in self.runs.items():
            stored = self.engine.list_runs(instance_id=key, limit=1000)
            assert {r.run_id for r in stored} == {r.run_id for r in runs}
            for run in runs:
                info = self.engine.get_run(run.run_id)
                if run.status == "waiting":
                    assert info.status is dex.RunStatus.CREATED and info.started_at is None
                    continue
                assert info.status.value == run.status
                if run.status == "COMPLETED":
                    assert info.result == run.value
                    assert info.started_at == run.started_at


TestInstanceKeys = InstanceKeys.TestCase
TestInstanceKeys.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
