"""The filters of ``dex runs list``, and the bulk commands that take them instead of a run id.

``dex runs cancel`` and ``dex runs fork`` (docs/reference/contract.md §11) act on one run (a RUN_ID) or on every run
the filters select: :func:`run_bulk` lists those runs on stderr, asks for confirmation (``--yes``
skips it), acts on each, and reports what it did and what was refused (a run that ended or
went meanwhile, an instance id in use); any refusal makes the exit code 1. A :class:`Bulk`
says what the command does to one run and how its outcome is shown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import attrs
import click

from dex.app.facade.engine import Engine
from dex.app.ports.store import RunFilter
from dex.cli.database import CommandError, open_engine, settings
from dex.cli.params import LABEL, LIMIT, MOMENT, TEXT
from dex.domain.errors import InvalidStateError, RunNotFoundError
from dex.domain.status import RunStatus
from dex.views import render

STATUSES = [status.value.lower() for status in RunStatus]
LIVE_STATUSES = frozenset(status for status in RunStatus if not status.is_terminal)
ALL_STATUSES = frozenset(RunStatus)


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filters of ``dex runs list``, shared by the bulk commands (docs/reference/contract.md §11)."""
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


def bulk_filter(run_id: str | None, filters: Mapping[str, Any], verb: str) -> RunFilter | None:
    """The filter a bulk command was given, or None when it was given a RUN_ID; a usage error
    when it was given both, or neither (``--limit`` alone selects nothing)."""
    given = {k: v for k, v in filters.items() if v not in (None, ()) and k != "limit"}
    if run_id is not None:
        if given:
            raise click.UsageError("give a RUN_ID or filters, not both")
        return None
    if not given:
        raise click.UsageError(f"give a RUN_ID, or filters (--workflow, --status, ...) to {verb} the runs they select")
    return run_filter_of(**filters)


def refusal(action: str, target: str, run_id: str, exc: Exception) -> str:
    # the store's messages often name the run already; say it once
    return f"cannot {action}: {exc}" if run_id in str(exc) else f"cannot {action} {target}: {exc}"


@attrs.frozen(kw_only=True)
class Bulk:
    """What a bulk command does to each selected run, and how it says so."""

    verb: str  # "cancel": in the question and the refusals
    past: str  # "cancelled": "nothing cancelled", "not cancelled: ..."
    statuses: frozenset[RunStatus]  # the runs it can act on at all (cancel: the live ones)
    act: Callable[[Engine, str], Any]  # does it to one run; returns what the JSON lists for it
    done_key: str  # the JSON key of the runs it was done to
    summary: str  # "cancellation requested for": "... 2 of 3 run(s)"
    line: Callable[[str, Any], str] | None = None  # a line of text per run done, if any


def run_bulk(run_filter: RunFilter, yes: bool, bulk: Bulk) -> None:
    """Do ``bulk`` to the runs ``run_filter`` selects among those it can act on, after showing
    them and a confirmation."""
    statuses = bulk.statuses if run_filter.statuses is None else run_filter.statuses & bulk.statuses
    which = "live run" if bulk.statuses == LIVE_STATUSES else "run"
    with open_engine() as engine:
        records = engine.store.list_runs(attrs.evolve(run_filter, statuses=frozenset(statuses))) if statuses else []
        if not records:
            raise CommandError(f"no {which} matches: nothing to {bulk.verb}")
        click.echo(render.runs_table(records), err=True)
        if not yes and not click.confirm(f"{bulk.verb} these {len(records)} run(s)?", err=True):
            raise CommandError(f"nothing {bulk.past}")
        done: list[tuple[str, Any]] = []
        refused: list[tuple[str, str]] = []
        for record in records:
            try:
                done.append((record.run_id, bulk.act(engine, record.run_id)))
            except (InvalidStateError, RunNotFoundError) as exc:  # it ended (or went) meanwhile, ...
                refused.append((record.run_id, str(exc)))
    if settings().json:
        listed = [outcome for _run_id, outcome in done]
        click.echo(render.dumps({bulk.done_key: listed, "refused": [dict(run_id=r, error=e) for r, e in refused]}))
    else:
        for run_id, outcome in done:
            if bulk.line is not None:
                click.echo(bulk.line(run_id, outcome))
        click.echo(f"{bulk.summary} {len(done)} of {len(records)} run(s)")
        for run_id, error in refused:
            click.echo(f"  not {bulk.past}: {refusal(bulk.verb, f'run {run_id}', run_id, Exception(error))}", err=True)
    if refused:
        raise click.exceptions.Exit(1)
