"""``dex runs`` (list, show, cancel, suspend, resume) and ``dex events send``; ``dex runs cancel``
also takes the filters of ``dex runs list`` instead of a run id (SPEC §11).

Reading goes to the store directly (``engine.store``), not through ``Engine.get_run``: the
command line has none of the workflows' code, so it shows results as stored payloads decode
without a type hint, and a payload it cannot decode (a protobuf type it does not know) is
shown raw instead of failing the whole listing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
import click

from dex.app.engine import Engine
from dex.app.ports import RunFilter, RunRecord
from dex.cli import render, timeline
from dex.cli.database import CommandError, connection_options, json_option, open_engine, settings
from dex.cli.params import EVENT_ID, JSON_VALUE, LABEL, LIMIT, MOMENT, RUN_ID, TEXT
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus

STATUSES = [status.value.lower() for status in RunStatus]
LIVE_STATUSES = frozenset(status for status in RunStatus if not status.is_terminal)


@click.group()
def runs() -> None:
    """List, inspect and control workflow runs."""


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filters of ``dex runs list``, shared by the bulk commands (SPEC §11)."""
    options = [
        click.option("--workflow", "workflow_name", metavar="NAME", type=TEXT, help="Only runs of this workflow."),
        click.option(
            "--status",
            "statuses",
            multiple=True,
            type=click.Choice(STATUSES, case_sensitive=False),
            help="Only runs in this status (repeatable).",
        ),
        click.option(
            "--label",
            "labels",
            multiple=True,
            type=LABEL,
            help="Only runs with this label (repeatable: all must match).",
        ),
        click.option("--instance-id", metavar="ID", type=TEXT, help="Only runs with this instance id."),
        click.option(
            "--code-version", metavar="VERSION", type=TEXT, help="Only runs started by engines of this code version."
        ),
        click.option(
            "--created-after", type=MOMENT, help="Only runs created after TIME (ISO 8601, or an age: 30m, 2h, 7d)."
        ),
        click.option("--created-before", type=MOMENT, help="Only runs created before TIME."),
        click.option("--limit", type=LIMIT, default=100, show_default=True, help="At most this many runs."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def run_filter_of(
    workflow_name: str | None = None,
    statuses: tuple[str, ...] = (),
    labels: tuple[tuple[str, str], ...] = (),
    instance_id: str | None = None,
    code_version: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: int = 100,
) -> RunFilter:
    return RunFilter(
        workflow_name=workflow_name,
        statuses=frozenset(RunStatus(status.upper()) for status in statuses) or None,
        labels=tuple(sorted(dict(labels).items())),
        instance_id=instance_id,
        created_after=created_after,
        created_before=created_before,
        limit=limit,
        code_version=code_version,
    )


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


@runs.command("show")
@click.argument("run_id", type=RUN_ID)
@click.option("--all", "show_all", is_flag=True, help="Also show the WorkflowTaskStarted/Completed events.")
@click.option("--stack", is_flag=True, help="Show the failure's stack trace.")
@connection_options
@json_option
def show_run(run_id: str, show_all: bool, stack: bool) -> None:
    """Show a run: metadata, result or failure, and its history as a timeline."""
    with open_engine() as engine:
        record = _get(engine.store.get_run, run_id)
        history = engine.store.load_history(run_id)
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
        click.echo(render.dumps(document))
        return
    click.echo(timeline.run_details(record, history))
    if stack and record.failure is not None:
        click.echo("\n" + timeline.stack_trace(record.failure))
    shown = timeline.timeline(history, show_all=show_all)
    hidden = "" if show_all else " (workflow tasks hidden; --all shows them)"
    click.echo(f"\nhistory: {len(history)} events{hidden}\n{shown}")


def _get(get_run: Callable[[str], RunRecord | None], run_id: str) -> RunRecord:
    record = get_run(run_id)
    if record is None:
        raise RunNotFoundError(f"no run with id {run_id!r}")
    return record


def _refusal(action: str, target: str, run_id: str, exc: Exception) -> str:
    # the store's messages often name the run already; say it once
    return f"cannot {action}: {exc}" if run_id in str(exc) else f"cannot {action} {target}: {exc}"


def _control(run_id: str, verb: str, act: Callable[[Engine], None], done: str) -> None:
    with open_engine() as engine:
        try:
            act(engine)
        except InvalidStateError as exc:
            raise CommandError(_refusal(verb, f"run {run_id}", run_id, exc)) from None
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
    filtered = {k: v for k, v in filters.items() if v not in (None, ()) and k != "limit"}
    if run_id is not None:
        if filtered:
            raise click.UsageError("give a RUN_ID or filters, not both")
        _control(
            run_id, "cancel", lambda engine: engine.cancel(run_id, reason), f"cancellation of run {run_id} requested"
        )
        return
    if not filtered:
        raise click.UsageError("give a RUN_ID, or filters (--workflow, --status, ...) to cancel the runs they select")
    bulk_cancel(run_filter_of(**filters), reason, yes)


def bulk_cancel(run_filter: RunFilter, reason: str, yes: bool) -> None:
    """Cancel what ``run_filter`` selects among the live runs, after showing it and a confirmation."""
    live = LIVE_STATUSES if run_filter.statuses is None else run_filter.statuses & LIVE_STATUSES
    with open_engine() as engine:
        records = engine.store.list_runs(attrs.evolve(run_filter, statuses=frozenset(live))) if live else []
        if not records:
            raise CommandError("no live run matches: nothing to cancel")
        click.echo(render.runs_table(records), err=True)
        if not yes and not click.confirm(f"cancel these {len(records)} run(s)?", err=True):
            raise CommandError("nothing cancelled")
        requested, refused = [], []
        for record in records:
            try:
                engine.cancel(record.run_id, reason)
            except (InvalidStateError, RunNotFoundError) as exc:  # it ended (or went) meanwhile
                refused.append((record.run_id, str(exc)))
            else:
                requested.append(record.run_id)
    if settings().json:
        click.echo(render.dumps({"requested": requested, "refused": [dict(run_id=r, error=e) for r, e in refused]}))
    else:
        click.echo(f"cancellation requested for {len(requested)} of {len(records)} run(s)")
        for run_id, error in refused:
            click.echo(f"  not cancelled: {_refusal('cancel', f'run {run_id}', run_id, Exception(error))}", err=True)
    if refused:
        raise click.exceptions.Exit(1)


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
            raise CommandError(_refusal(f"send event {event_id!r}", f"to run {run_id}", run_id, exc)) from None
    if settings().json:
        click.echo(render.dumps({"run_id": run_id, "event_id": event_id, "payload": payload}))
    else:
        click.echo(f"sent event {event_id!r} to run {run_id}")
