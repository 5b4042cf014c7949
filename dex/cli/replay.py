"""``dex replay MODULE:ENGINE``: replay stored histories against new workflow code, for CI.

Before a deploy, the new code is imported (the application's engine, found as ``dex worker``
finds it) and every selected run's stored history is replayed against the workflow of the
same name that engine registers: the code runs up to where the history ends, each step it asks
for is matched against the step recorded there, and nothing is executed or written (no
activity runs, no task is claimed). Per workflow it prints how many runs replayed and each
mismatch — the run, the step the history recorded and the step the new code asked for — and
a history the new code cannot read is a mismatch too (docs/reference/contract.md §11). Exit code 1 if any mismatch:
deploying this code would hold those runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime

import attrs
import click

from dex.app.facade.engine import Engine
from dex.app.ports.store import RunFilter, UnreadableHistoryError
from dex.cli.bulk import STATUSES
from dex.cli.params import LIMIT, MOMENT, TEXT, TextPath
from dex.cli.worker import load_engine
from dex.domain.status import RunStatus
from dex.domain.task import replay_history

# replayed unless --status says otherwise: the runs that new code will pick up
LIVE = frozenset({RunStatus.CREATED, RunStatus.RUNNING, RunStatus.SUSPENDED})


@attrs.frozen(kw_only=True)
class Mismatch:
    run_id: str
    reason: str  # names the recorded step and the step the code asked for


@attrs.frozen(kw_only=True)
class Replayed:
    """One workflow's outcome: how many of its runs replayed, and those that did not match."""

    workflow_name: str
    count: int
    mismatches: tuple[Mismatch, ...]


def replay_stored(
    engine: Engine,
    workflow_names: Iterable[str],
    statuses: frozenset[RunStatus],
    created_after: datetime | None,
    limit: int,
) -> Iterator[Replayed]:
    """Replay the stored runs of each workflow (at most ``limit`` each, newest first) against
    the code ``engine`` registers for it; nothing runs and nothing is written."""
    for name in workflow_names:
        records = engine.store.list_runs(
            RunFilter(workflow_name=name, statuses=statuses, created_after=created_after, limit=limit)
        )
        mismatches = []
        for record in records:
            reason = _check(engine, name, record.run_id)
            if reason is not None:
                mismatches.append(Mismatch(run_id=record.run_id, reason=reason))
        yield Replayed(workflow_name=name, count=len(records), mismatches=tuple(mismatches))


def _check(engine: Engine, workflow_name: str, run_id: str) -> str | None:
    """Why the run's stored history does not fit the code, or None when it does."""
    try:
        history = engine.store.load_history(run_id)
        executor = replay_history(
            engine.registry.workflows[workflow_name],
            run_id,
            history,
            engine.converter,
            activities=engine.registry.find_activity,
            workflows=engine.registry.find_workflow,
        )
    except (UnreadableHistoryError, ValueError) as exc:  # bytes or events this code cannot read
        return f"its history cannot be read by this code: {exc}"
    try:
        return executor.nondeterminism
    finally:
        executor.close()


@click.command("replay")
@click.argument("target", metavar="MODULE:ENGINE", type=TEXT)
@click.option("--workflow", "workflow_name", metavar="NAME", type=TEXT, help="Only runs of this workflow.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(STATUSES, case_sensitive=False),
    help="Only runs in this status (repeatable; default: created, running and suspended).",
)
@click.option("--since", type=MOMENT, help="Only runs created after TIME (ISO 8601, or an age: 30m, 2h, 7d).")
@click.option("--limit", type=LIMIT, default=1000, show_default=True, help="At most this many runs per workflow.")
@click.option(
    "--app-dir", type=TextPath(file_okay=False), default=".", show_default=True, help="Where to import MODULE from."
)
def replay(
    target: str,
    workflow_name: str | None,
    statuses: tuple[str, ...],
    since: datetime | None,
    limit: int,
    app_dir: str,
) -> None:
    """Replay stored histories against the workflows MODULE:ENGINE registers; run nothing.

    Exit code 1 if any run's history does not match the code (deploying it would hold them)."""
    engine = load_engine(target, app_dir)
    if workflow_name is not None and workflow_name not in engine.registry.workflows:
        raise click.BadParameter(f"{target} registers no workflow {workflow_name!r}", param_hint="'--workflow'")
    names = [workflow_name] if workflow_name is not None else sorted(engine.registry.workflows)
    chosen = frozenset(RunStatus(status.upper()) for status in statuses) or LIVE
    failed = 0
    for outcome in replay_stored(engine, names, chosen, since, limit):
        matched = outcome.count - len(outcome.mismatches)
        click.echo(
            f"{outcome.workflow_name}: {outcome.count} replayed, {matched} match, {len(outcome.mismatches)} do not"
        )
        for mismatch in outcome.mismatches:
            click.echo(f"  run {mismatch.run_id}: {mismatch.reason}")
        failed += len(outcome.mismatches)
    if failed:
        click.echo(f"{failed} run(s) do not match this code: deploying it would hold them", err=True)
        raise click.exceptions.Exit(1)
