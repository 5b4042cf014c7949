"""The store-side rules of :mod:`dex.domain.writes`, checked on each backend against the domain.

Each adapter executes the domain's definitions (PostgreSQL in set-based SQL that takes them as
parameters); these tests go over every kind of message, so an adapter that re-states a rule
and diverges from the domain fails here: which messages survive continue-as-new, which wake a
suspended run, the order of a run's visible inbox, and the news a clashing child's parent gets.
"""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from dex.app.ports.store import Store
from dex.domain import events as ev
from dex.domain.status import RunStatus
from dex.domain.task import NewRun, OutgoingMessage
from dex.domain.writes import INBOX_ORDER, instance_clash, survives_continue_as_new, wakes_suspended
from dex.testing import VirtualClock
from tests.contract.ports.support import (
    MemoryBackend,
    PortContract,
    PostgresBackend,
    created,
    decide,
    event,
    failure,
    kinds,
    next_task,
    payload,
    start,
    step,
    task_of,
)


def one_of_each() -> list[ev.Message]:
    """A message of every kind a run's inbox can hold."""
    messages: list[ev.Message] = [
        ev.RunStarted(),
        ev.ActivityTaskCompleted(created_seq=2, result=payload(1)),
        ev.ActivityTaskFailed(created_seq=2, failure=failure()),
        ev.TimerElapsed(created_seq=3),
        event("e"),
        ev.ChildRunCompleted(child_run_id="c", result=payload(2)),
        ev.ChildRunFailed(child_run_id="c", failure=failure()),
        ev.RunSuspended(),
        ev.RunResumed(),
        ev.RunCancelled(reason="r"),
        ev.RunTerminated(reason="t"),
        ev.UpdateRequested(update_id="u", name="n", args=(payload(3),)),
    ]
    assert {type(m) for m in messages} == set(ev.MESSAGE_TYPES)  # a new kind is added here too
    return messages


def names(messages: list[ev.Message]) -> list[str]:
    return [type(m).__name__ for m in messages]


class DomainRulesContract(PortContract):
    def test_continue_as_new_keeps_exactly_the_domain_s_survivors(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "r1")
        step(store, clock, "r1")
        store.send_message("r1", event("seen"), clock.now())
        task = next_task(store, clock, "r1")
        seen = decide(store, task, clock.now())
        sent = one_of_each()
        for message in sent:  # unconsumed: not seen by this task
            store.send_message("r1", message, clock.now())
        generation = ev.HistoryEvent(
            sequence_number=seen.expected_last_seq + 1,
            timestamp=clock.now(),
            event=attrs.evolve(created(), generation=2),
        )
        result = attrs.evolve(seen, new_events=(), new_history=(generation,))
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        inbox = store.load_workflow_task(task_of("r1"), clock.now())[1]
        kept = [m for m in sent if survives_continue_as_new(m)]
        assert names([m.event for m in inbox]) == names(kept)
        assert 0 < len(kept) < len(sent)  # the rule keeps some and drops some

    @pytest.mark.parametrize("kind", range(len(ev.MESSAGE_TYPES)))
    def test_a_suspended_run_wakes_for_the_domain_s_messages_only(
        self, store: Store, clock: VirtualClock, kind: int
    ) -> None:
        message = one_of_each()[kind]
        start(store, clock, "r1")
        step(store, clock, "r1")
        store.request_transition("r1", RunStatus.SUSPENDED, ev.RunSuspended(), clock.now())
        store.send_message("r1", message, clock.now())
        assert store.schedule_workflow_tasks(clock.now(), 100) == (1 if wakes_suspended(message) else 0)

    def test_the_inbox_is_loaded_in_the_domain_s_order(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "sender")
        start(store, clock, "receiver")
        step(store, clock, "receiver")
        base = clock.now()
        # inserted in one order, due in another, with ties that arrival order must break
        due = [30, 10, 30, 0, 10, 20]
        sends = tuple(
            OutgoingMessage(run_id="receiver", event=event(f"m{i}"), visible_from=base + timedelta(seconds=s))
            for i, s in enumerate(due)
        )
        task = next_task(store, clock, "sender")
        result = attrs.evolve(decide(store, task, clock.now()), messages=sends)
        assert store.complete_workflow_tasks([(task, result)], clock.now()) == [True]
        clock.advance(60)
        inbox = store.load_workflow_task(task_of("receiver"), clock.now())[1]
        ids = kinds(inbox)
        due_at = {f"m{i}": base + timedelta(seconds=s) for i, s in enumerate(due)}
        rows = [{"visible_from": due_at[i], "message_id": m.message_id} for i, m in zip(ids, inbox, strict=True)]
        order = sorted(range(len(rows)), key=lambda n: tuple(rows[n][c] for c in INBOX_ORDER))
        assert order == list(range(len(rows)))  # loaded as the domain orders them
        assert ids == ["m3", "m1", "m4", "m5", "m0", "m2"]

    def test_a_clashing_child_s_parent_gets_the_domain_s_news(self, store: Store, clock: VirtualClock) -> None:
        start(store, clock, "holder", instance_id="inv-9")
        start(store, clock, "parent")
        child = NewRun(run_id="child", created=created(parent="parent", instance_id="inv-9"))
        step(store, clock, "parent", children=[child])
        (news,) = store.load_workflow_task(next_task(store, clock, "parent"), clock.now())[1]
        assert news.event == instance_clash(child)


class TestDomainRulesMemory(MemoryBackend, DomainRulesContract):
    pass


class TestDomainRulesPostgres(PostgresBackend, DomainRulesContract):
    pass
