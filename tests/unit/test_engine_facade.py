"""The engine facade: its public calls keep their names and parameters (programs outside the
repository call them), each ``*_async`` call takes what its blocking call takes, and the
services behind the calls work when built alone from what their constructors receive."""

from __future__ import annotations

import inspect
import random
from datetime import timedelta
from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.app.definitions.registry import Registry
from dex.app.facade.messages import RunMessages
from dex.app.facade.queues import Queues
from dex.app.facade.starts import Starts
from dex.app.machinery.threads import Foreground
from dex.app.ports.ids import new_run_id
from dex.app.ports.store import RunFilter
from dex.app.ports.tracing import NoTracing
from dex.app.workflows.inline import QueueView
from dex.domain import events as ev
from dex.serialization.payloads import PayloadConverter
from dex.testing import VirtualClock

# (parameter, kind, default) after self; "async" first for a coroutine function
_POS, _VAR, _KW = "positional", "*args", "keyword-only"
_NONE = inspect.Parameter.empty
_LIST_RUNS = (
    ("workflow_name", _KW, None),
    ("statuses", _KW, None),
    ("labels", _KW, None),
    ("instance_id", _KW, None),
    ("created_after", _KW, None),
    ("created_before", _KW, None),
    ("limit", _KW, 100),
    ("code_version", _KW, None),
)
_START = (
    ("fn_or_name", _POS, _NONE),
    ("args", _VAR, _NONE),
    ("instance_id", _KW, None),
    ("queue", _KW, None),
    ("priority", _KW, 0),
    ("concurrency_key", _KW, None),
    ("labels", _KW, None),
    ("connection", _KW, None),
    ("timeout", _KW, None),  # the run's deadline (docs/reference/contract.md §14)
    ("id_reuse", _KW, "allow"),
    ("debounce", _KW, None),
    ("debounce_max", _KW, None),
)
_SEND = (("run_id", _POS, _NONE), ("event_id", _POS, _NONE), ("payload", _POS, None), ("connection", _KW, None))
_RUN = (("run_id", _POS, _NONE),)
_NAME = (("name", _POS, _NONE),)
_QUEUE = (("name", _POS, _NONE), ("kind", _POS, _NONE))
_FORK = (("run_id", _POS, _NONE), ("at", _POS, None), ("queue", _POS, None))
_WAIT = (("run_id", _POS, _NONE), ("timeout", _POS, None))

PUBLIC_CALLS: dict[str, tuple[Any, ...]] = {
    "__init__": (
        ("adapter", _POS, _NONE),
        ("workflows", _POS, ()),
        ("activities", _POS, ()),
        ("schedules", _KW, ()),
        ("node_id", _KW, None),
        ("converter", _KW, None),
        ("max_payload_size", _KW, None),
        ("activity_concurrency", _KW, 64),
        ("poll_interval", _KW, 0.05),
        ("workflow_task_lease", _KW, timedelta(seconds=10)),
        ("activity_lease", _KW, timedelta(seconds=30)),
        ("leader_lease", _KW, timedelta(seconds=15)),
        ("retention", _KW, timedelta(days=7)),
        ("rng", _KW, None),
        ("executor_cache_size", _KW, 1000),
        ("tracing", _KW, None),
        ("inline_activity_seconds", _KW, 0.005),
        ("chained_activity_seconds", _KW, 0.1),
        ("batch_window", _KW, 0.05),
        ("workflow_task_deadline", _KW, 5.0),
        ("code_version", _KW, None),
        ("on_nondeterminism", _KW, "hold"),
        ("runtime_options", _KW, None),  # for simulations and tests (dex.app.runtime.options)
        ("dispatch", _KW, "polling"),  # docs/reference/contract.md §16
        ("kafka", _KW, None),
    ),
    "start_workflow": _START,
    "start_by_name": (
        ("name", _POS, _NONE),
        ("args", _POS, ()),
        ("instance_id", _KW, None),
        ("queue", _KW, None),
        ("priority", _KW, 0),
        ("concurrency_key", _KW, None),
        ("labels", _KW, None),
        ("force", _KW, False),
        ("id_reuse", _KW, "allow"),
        ("debounce", _KW, None),
        ("debounce_max", _KW, None),
    ),
    "send_event": _SEND,
    "cancel": (("run_id", _POS, _NONE), ("reason", _POS, "")),
    "terminate": (("run_id", _POS, _NONE), ("reason", _POS, "")),
    "suspend": _RUN,
    "resume": _RUN,
    "get_run": _RUN,
    "list_runs": _LIST_RUNS,
    "history": _RUN,
    "activity_steps": _RUN,
    "export_history": _RUN,
    "wait": _WAIT,
    "fork": _FORK,
    "drain": (("advance_time", _POS, True), ("until", _POS, None)),
    "start": (),
    "stop": (("timeout", _POS, 30),),
    "health": (),
    "on_activity_work": (("listener", _POS, _NONE),),
    "long_poll_gate": (("limit", _POS, _NONE),),
    "create_queue": (*_QUEUE, ("capacity", _POS, 100), ("key_concurrency", _POS, 1), ("rate_limit", _POS, None)),
    "pause_queue": _QUEUE,
    "resume_queue": _QUEUE,
    "set_queue_capacity": (*_QUEUE, ("capacity", _POS, _NONE)),
    "set_queue_key_concurrency": (*_QUEUE, ("key_concurrency", _POS, _NONE)),
    "set_queue_rate_limit": (*_QUEUE, ("rate_limit", _POS, _NONE)),
    "list_queues": (),
    "list_engines": (),
    "create_schedule": (("schedule", _POS, _NONE),),
    "update_schedule": (("schedule", _POS, _NONE),),
    "delete_schedule": _NAME,
    "pause_schedule": (*_NAME, ("note", _POS, "")),
    "resume_schedule": _NAME,
    "trigger_schedule": _NAME,
    "backfill_schedule": (*_NAME, ("start", _POS, _NONE), ("end", _POS, _NONE)),
    "get_schedule": _NAME,
    "list_schedules": (),
}
ASYNC_CALLS = (
    "start_workflow",
    "send_event",
    "cancel",
    "terminate",
    "suspend",
    "resume",
    "get_run",
    "list_runs",
    "history",
    "activity_steps",
    "fork",
    "wait",
)

_KINDS: dict[Any, str] = {
    inspect.Parameter.POSITIONAL_OR_KEYWORD: _POS,
    inspect.Parameter.VAR_POSITIONAL: _VAR,
    inspect.Parameter.KEYWORD_ONLY: _KW,
}


def _parameters(call: Any) -> tuple[tuple[str, str, Any], ...]:
    parameters = list(inspect.signature(call).parameters.values())[1:]  # self
    return tuple((p.name, _KINDS.get(p.kind, str(p.kind)), p.default) for p in parameters)


@pytest.mark.parametrize("name", sorted(PUBLIC_CALLS))
def test_each_public_call_keeps_its_parameters(name: str) -> None:
    call = getattr(dex.Engine, name)
    assert _parameters(call) == PUBLIC_CALLS[name]
    assert not inspect.iscoroutinefunction(call)


@pytest.mark.parametrize("name", ASYNC_CALLS)
def test_each_async_call_takes_what_its_blocking_call_takes(name: str) -> None:
    call = getattr(dex.Engine, f"{name}_async")
    assert inspect.iscoroutinefunction(call)
    assert _parameters(call) == PUBLIC_CALLS[name]


def test_the_engine_inherits_no_partial_classes() -> None:
    assert dex.Engine.__mro__ == (dex.Engine, object)


@dex.workflow(name="greet")
async def greet(ctx: dex.WorkflowContext, name: str) -> str:
    return f"hello {name}"


def test_starts_built_alone_refuse_a_bad_start_before_writing_and_make_the_next_run() -> None:
    """The start service over an in-memory store, its callbacks recorded: a NUL in an instance
    id is refused naming the field before anything is made or announced; the next start is
    written by ``create_run`` with this service's code version and announced to ``started``."""
    store = InMemoryAdapter(clock=VirtualClock())
    created: list[ev.RunCreated] = []
    started: list[str] = []

    def create_run(run: ev.RunCreated) -> str:
        created.append(run)
        return store.create_run(new_run_id(), run, store.clock.now())

    starts = Starts(
        store,
        Registry([greet]),
        PayloadConverter(),
        tracing=NoTracing(),
        foreground=Foreground(),
        rng=random.Random(7),
        code_version="v7",
        create_run=create_run,
        started=started.append,
    )
    with pytest.raises(ValueError, match="instance_id"):
        starts.start_workflow(greet, ("ann",), "a\x00b", None, 0, None, None, None)
    with pytest.raises(TypeError):
        starts.start_workflow(greet, (), None, None, 0, None, None, None)  # greet takes a name
    assert created == [] and started == [] and store.list_runs(RunFilter()) == []
    run_id = starts.start_workflow(greet, ("ann",), "greeting-1", None, 0, None, None, None)
    assert started == [run_id]
    assert [run.code_version for run in created] == ["v7"]
    assert store.get_run(run_id) is not None


def test_messages_built_alone_refuse_a_bad_event_id_without_sending_or_nudging() -> None:
    sent: list[tuple[str, ev.Message]] = []
    nudges: list[None] = []
    messages = RunMessages(
        InMemoryAdapter(clock=VirtualClock()),
        PayloadConverter(),
        foreground=Foreground(),
        send_message=lambda run_id, message: sent.append((run_id, message)),
        nudge_scheduler=lambda: nudges.append(None),
    )
    with pytest.raises(ValueError, match="event id"):
        messages.send_event("run-1", "paid\x00", 1)
    assert sent == [] and nudges == []
    messages.send_event("run-1", "paid", 4200)
    ((run_id, message),) = sent
    assert run_id == "run-1" and isinstance(message, ev.ExternalEventReceived) and message.event_id == "paid"
    assert len(nudges) == 1


def test_queues_built_alone_tell_the_runtime_only_of_changes_that_can_free_slots() -> None:
    store = InMemoryAdapter(clock=VirtualClock())
    changed: list[None] = []
    queues = Queues(store, QueueView(store.activity_slots), queues_changed=lambda: changed.append(None))
    queues.create_queue("mail", "activity", 2)
    queues.pause_queue("mail", "activity")
    assert changed == []
    with pytest.raises(ValueError):
        queues.set_queue_capacity("mail", "activity", -1)
    assert changed == []
    queues.resume_queue("mail", "activity")
    queues.set_queue_capacity("mail", "activity", 5)
    assert len(changed) == 2
    (mail,) = [q for q in queues.list_queues() if q.name == "mail"]
    assert (mail.capacity, mail.status) == (5, "ACTIVE")


def test_queue_limits_tell_the_runtime_when_set_and_refuse_bad_values_first() -> None:
    store = InMemoryAdapter(clock=VirtualClock())
    changed: list[None] = []
    queues = Queues(store, QueueView(store.activity_slots), queues_changed=lambda: changed.append(None))
    queues.create_queue("mail", "activity", 2, rate_limit=(3, timedelta(seconds=1)))
    assert changed == []
    with pytest.raises(ValueError):
        queues.set_queue_rate_limit("mail", "activity", (0, timedelta(seconds=1)))
    with pytest.raises(ValueError):
        queues.set_queue_key_concurrency("mail", "activity", 0)
    assert changed == []
    queues.set_queue_rate_limit("mail", "activity", None)
    queues.set_queue_key_concurrency("mail", "activity", 2)
    assert len(changed) == 2
    (mail,) = [q for q in queues.list_queues() if q.name == "mail"]
    assert (mail.key_concurrency, mail.rate_limit) == (2, None)
