"""``dex runs`` (list, show, start, cancel, suspend, resume, fork) and ``dex events send``; ``dex runs
cancel`` and ``dex runs fork`` also take the filters of ``dex runs list`` instead of a run id
(docs/reference/contract.md §11; the bulk path is :mod:`dex.cli.bulk`).

Reading goes to the store directly (``engine.store``), not through ``Engine.get_run``: the
command line has none of the workflows' code, so it shows results as stored payloads decode
without a type hint, and a payload it cannot decode (a protobuf type it does not know) is
shown raw instead of failing the whole listing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import click

from dex.app.facade.engine import Engine
from dex.app.facade.steps import activity_steps
from dex.app.ports.store import RunRecord
from dex.cli.bulk import (
    ALL_STATUSES,
    LIVE_STATUSES,
    Bulk,
    bulk_filter,
    filter_options,
    refusal,
    run_bulk,
    run_filter_of,
)
from dex.cli.database import CommandError, connection_options, json_option, open_engine, settings
from dex.cli.params import EVENT_ID, JSON_VALUE, LABEL, QUEUE_NAME, RUN_ID, SECONDS, SEQUENCE, TEXT
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.instance_keys import ID_REUSE
from dex.views import attempts, published, render, timeline


@click.group()
def runs() -> None:
    """List, inspect, control and fork workflow runs."""


@runs.command("list")
@filter_options
@connection_options
@json_option
def list_runs(**filters: Any) -> None:
    """List runs, newest first."""
    with open_engine() as engine:
        records = engine.store.list_runs(run_filter_of(**filters))
    if settings().json:
        click.echo(render.dumps([render.run_json(record) for record in records]))
    elif records:
        click.echo(render.runs_table(records))
    else:
        click.echo("no runs match", err=True)


@runs.command("start")
@click.argument("workflow", type=TEXT)
@click.option(
    "--args",
    "args",
    type=JSON_VALUE,
    default=None,
    help="The arguments as a JSON array; @PATH reads a file, - reads stdin [default: none].",
)
@click.option("--instance-id", metavar="ID", type=TEXT, help="The run's instance id.")
@click.option("--queue", type=QUEUE_NAME, default=None, help="The workflow queue [default: the newest run's].")
@click.option("--label", "labels", multiple=True, type=LABEL, help="A label KEY=VALUE (repeatable).")
@click.option("--force", is_flag=True, help="Start it even though no live engine registers the workflow.")
@click.option(
    "--id-reuse",
    type=click.Choice(ID_REUSE),
    default="allow",
    show_default=True,
    help="What an ended run's instance id means: allow a new run; failed_only a new one only if the last "
    "did not succeed; never: the last run's id, whatever its end.",
)
@click.option(
    "--debounce",
    type=SECONDS,
    default=None,
    help="With --instance-id: start in SECONDS; a start of the id before then replaces the arguments "
    "and moves the start again.",
)
@click.option(
    "--debounce-max",
    type=SECONDS,
    default=None,
    help="The latest a debounced run starts, SECONDS after its first start.",
)
@connection_options
@json_option
def start_run(
    workflow: str,
    args: Any,
    instance_id: str | None,
    queue: str | None,
    labels: tuple[tuple[str, str], ...],
    force: bool,
    id_reuse: str,
    debounce: float | None,
    debounce_max: float | None,
) -> None:
    """Start a run of the workflow named WORKFLOW, for the engines that have its code.

    A workflow that no live engine registers (``dex engines``) is refused, and nothing is made,
    unless --force: such a run waits until an engine with its code starts."""
    if args is None:
        args = []
    if not isinstance(args, list):
        raise click.BadParameter(f"must be a JSON array, got {type(args).__name__}", param_hint="'--args'")
    with open_engine() as engine:
        run_id = engine.start_by_name(
            workflow,
            args,
            instance_id=instance_id,
            queue=queue,
            labels=dict(labels),
            force=force,
            id_reuse=id_reuse,
            debounce=timedelta(seconds=debounce) if debounce is not None else None,
            debounce_max=timedelta(seconds=debounce_max) if debounce_max is not None else None,
        )
    if settings().json:
        click.echo(render.dumps({"run_id": run_id, "workflow": workflow}))
    else:
        click.echo(f"started run {run_id} of {workflow!r}")


@runs.command("show")
@click.argument("run_id", type=RUN_ID)
@click.option("--all", "show_all", is_flag=True, help="Also show the WorkflowTaskStarted/Completed events.")
@click.option("--stack", is_flag=True, help="Show the failure's stack trace.")
@connection_options
@json_option
def show_run(run_id: str, show_all: bool, stack: bool) -> None:
    """Show a run: metadata, result or failure, its activity steps with their attempts, and its
    history as a timeline."""
    with open_engine() as engine:
        record = _get(engine.store.get_run, run_id)
        # the whole history and every step's attempts, deliberately: the command shows one run
        # whole (its history too), as Engine.activity_steps does; the attempts before the history
        kept = engine.store.step_attempts(run_id)
        history = engine.store.load_history(run_id)
        streams = engine.store.run_streams(run_id)  # what it published and streamed (docs/reference/contract.md §14)
    steps = activity_steps(history, kept)
    if settings().json:
        document = render.run_json(record)
        document["history"] = [
            {
                "sequence_number": item.sequence_number,
                "timestamp": render.jsonable(item.timestamp),
                "kind": item.kind,
                "event": render.jsonable(item.event),
            }
            for item in history
        ]
        waiting = timeline.pending_activities(history) if not record.status.is_terminal else []
        document["pending_activities"] = [{"created_seq": seq, "name": name} for seq, name in waiting]
        document["activity_steps"] = [attempts.step_json(step) for step in steps]
        document.update(published.published_json(streams))
        click.echo(render.dumps(document))
        return
    click.echo(timeline.run_details(record, history))
    if stack and record.failure is not None:
        click.echo("\n" + timeline.stack_trace(record.failure))
    if steps:
        click.echo(f"\nactivity steps: {len(steps)}\n{attempts.steps_text(steps)}")
    if streams.published or streams.streams:
        click.echo("\n" + published.published_text(streams))
    shown = timeline.timeline(history, show_all=show_all)
    hidden = "" if show_all else " (workflow tasks hidden; --all shows them)"
    click.echo(f"\nhistory: {len(history)} events{hidden}\n{shown}")


def _get(get_run: Callable[[str], RunRecord | None], run_id: str) -> RunRecord:
    record = get_run(run_id)
    if record is None:
        raise RunNotFoundError(f"no run with id {run_id!r}")
    return record


def _control(run_id: str, verb: str, act: Callable[[Engine], None], done: str) -> None:
    with open_engine() as engine:
        try:
            act(engine)
        except InvalidStateError as exc:
            raise CommandError(refusal(verb, f"run {run_id}", run_id, exc)) from None
        record = _get(engine.store.get_run, run_id)
    if settings().json:
        click.echo(render.dumps(render.run_json(record)))
    else:
        click.echo(f"{done} (status now {record.status.value})")


@runs.command("cancel")
@click.argument("run_id", type=RUN_ID, required=False)
@click.option("--reason", default="", type=TEXT, help="Recorded in the history with the request.")
@filter_options
@click.option("--yes", is_flag=True, help="With filters: do not ask for confirmation.")
@connection_options
@json_option
def cancel_run(run_id: str | None, reason: str, yes: bool, **filters: Any) -> None:
    """Ask a run (RUN_ID), or every live run the filters of 'dex runs list' select, to stop at
    its next await.

    A run ends CANCELLED once a worker processes the request. With filters, the runs are listed
    first and the command asks for confirmation (--yes skips it).
    """
    run_filter = bulk_filter(run_id, filters, "cancel")
    if run_filter is None:
        assert run_id is not None
        _control(
            run_id, "cancel", lambda engine: engine.cancel(run_id, reason), f"cancellation of run {run_id} requested"
        )
        return

    def cancel(engine: Engine, run_id: str) -> str:
        engine.cancel(run_id, reason)
        return run_id

    bulk = Bulk(
        verb="cancel",
        past="cancelled",
        statuses=LIVE_STATUSES,
        act=cancel,
        done_key="requested",
        summary="cancellation requested for",
    )
    run_bulk(run_filter, yes, bulk)


@runs.command("terminate")
@click.argument("run_id", type=RUN_ID)
@click.option("--reason", default="", type=TEXT, help="Recorded in the history, and as the run's failure.")
@connection_options
@json_option
def terminate_run(run_id: str, reason: str) -> None:
    """Stop RUN_ID at once: none of its code runs again (no cleanup), its pending steps are
    dropped, its children are terminated, and it ends TERMINATED.

    Unlike cancel, it needs no worker: the run has ended when the command returns. Use cancel
    for a run whose code should clean up.
    """
    _control(run_id, "terminate", lambda engine: engine.terminate(run_id, reason), f"run {run_id} terminated")


@runs.command("fork")
@click.argument("run_id", type=RUN_ID, required=False)
@click.option(
    "--at",
    type=SEQUENCE,
    metavar="SEQ",
    help="Fork at this event (a WorkflowTaskCompleted, or 1: from the start) [default: the end of the last"
    " workflow task before the run ended]. Only with a RUN_ID.",
)
@click.option("--queue", type=QUEUE_NAME, help="Put the fork on this workflow queue [default: the original's].")
@filter_options
@click.option("--yes", is_flag=True, help="With filters: do not ask for confirmation.")
@connection_options
@json_option
def fork_run(run_id: str | None, at: int | None, queue: str | None, yes: bool, **filters: Any) -> None:
    """Start a new run of RUN_ID's workflow and input (or of each run the filters of 'dex runs
    list' select) that goes on from a point of its history.

    The steps recorded up to there are not repeated; the steps pending there run again, with
    the code your workers run now: for runs that failed on an outage or a bug, once it is
    fixed. With filters, the runs are listed first and the command asks for confirmation
    (--yes skips it); each is forked at its default point.
    """
    run_filter = bulk_filter(run_id, filters, "fork")
    if run_filter is None:
        assert run_id is not None
        with open_engine() as engine:
            try:
                fork_id = engine.fork(run_id, at=at, queue=queue)
            except InvalidStateError as exc:
                raise CommandError(refusal("fork", f"run {run_id}", run_id, exc)) from None
            record = _get(engine.store.get_run, fork_id)
        if settings().json:
            click.echo(render.dumps(render.run_json(record)))
        else:
            click.echo(f"forked run {run_id} as run {fork_id}")
        return
    if at is not None:
        raise click.UsageError("--at names a point of one run's history: give a RUN_ID with it, not filters")
    bulk = Bulk(
        verb="fork",
        past="forked",
        statuses=ALL_STATUSES,
        act=lambda engine, run_id: {"run_id": run_id, "fork": engine.fork(run_id, queue=queue)},
        done_key="forked",
        summary="forked",
        line=lambda run_id, outcome: f"forked run {run_id} as run {outcome['fork']}",
    )
    run_bulk(run_filter, yes, bulk)


@runs.command("suspend")
@click.argument("run_id", type=RUN_ID)
@connection_options
@json_option
def suspend_run(run_id: str) -> None:
    """Hold back a run's new events until it is resumed."""
    _control(run_id, "suspend", lambda engine: engine.suspend(run_id), f"suspended run {run_id}")


@runs.command("resume")
@click.argument("run_id", type=RUN_ID)
@connection_options
@json_option
def resume_run(run_id: str) -> None:
    """Release a suspended run's held events, in order."""
    _control(run_id, "resume", lambda engine: engine.resume(run_id), f"resumed run {run_id}")


@click.group()
def events() -> None:
    """Send external events to runs."""


@events.command("send")
@click.argument("run_id", type=RUN_ID)
@click.argument("event_id", type=EVENT_ID)
@click.option(
    "--json",
    "payload",
    type=JSON_VALUE,
    default=None,
    help="The payload as JSON text; @PATH reads a file, - reads stdin [default: null].",
)
@connection_options
def send_event(run_id: str, event_id: str, payload: Any) -> None:
    """Deliver event EVENT_ID to run RUN_ID (buffered until the run waits for it)."""
    with open_engine() as engine:
        try:
            engine.send_event(run_id, event_id, payload)
        except InvalidStateError as exc:
            raise CommandError(refusal(f"send event {event_id!r}", f"to run {run_id}", run_id, exc)) from None
    if settings().json:
        click.echo(render.dumps({"run_id": run_id, "event_id": event_id, "payload": payload}))
    else:
        click.echo(f"sent event {event_id!r} to run {run_id}")
