"""``dex schedules``: list and show schedules, pause, resume, trigger, backfill and delete them.

The commands work on the stored schedules alone (:class:`dex.app.schedules.calls.ScheduleAdmin`):
a schedule keeps its workflow's arguments encoded, so a trigger or a backfill starts its runs
without the workflow's code; a worker that registers the workflow runs them. Schedules are
created by the engines that declare them (``Engine(schedules=...)``) or ``create_schedule``;
a deleted declared schedule comes back when such an engine starts again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import click

from dex.app.schedules.calls import ScheduleAdmin
from dex.app.schedules.spec import ScheduleInfo
from dex.app.schedules.times import UncomputableFireError
from dex.cli.database import CommandError, connection_options, json_option, open_engine, settings
from dex.cli.params import MOMENT, SCHEDULE_NAME, TEXT
from dex.views import render


@contextmanager
def _admin() -> Iterator[ScheduleAdmin]:
    with open_engine() as engine:
        yield ScheduleAdmin(engine.store)


@contextmanager
def _computable() -> Iterator[None]:
    """A stored schedule whose fire times cannot be computed (written by an older dex) is the
    database's state, not the command line's fault: exit code 1, saying what to do."""
    try:
        yield
    except UncomputableFireError as exc:
        raise CommandError(f"{exc}: give it a new definition (update_schedule) first") from None


@click.group()
def schedules() -> None:
    """List and control schedules (workflows started on a cron or an interval)."""


@schedules.command("list")
@connection_options
@json_option
def list_schedules() -> None:
    """List schedules with their timing, state and next fire."""
    with _admin() as admin:
        infos = admin.list()
    if settings().json:
        click.echo(render.dumps(infos))
    elif infos:
        rows = [
            (
                i.name,
                i.workflow_name,
                render.show_schedule_timing(i),
                render.show_schedule_status(i),
                _when(i.next_fire_at),
                _when(i.last_fire_at),
            )
            for i in infos
        ]
        click.echo(render.table(("NAME", "WORKFLOW", "WHEN", "STATUS", "NEXT FIRE", "LAST FIRE"), rows))
    else:
        click.echo("no schedules yet: engines create the schedules they declare when they start", err=True)


@schedules.command("show")
@click.argument("name", type=SCHEDULE_NAME)
@connection_options
@json_option
def show_schedule(name: str) -> None:
    """Show one schedule in full."""
    with _admin() as admin:
        info = admin.get(name)
    if settings().json:
        click.echo(render.dumps(info))
        return
    for key, value in (
        ("name", info.name),
        ("workflow", info.workflow_name),
        ("when", render.show_schedule_timing(info)),
        ("overlap", info.overlap),
        ("id reuse", info.id_reuse),
        ("jitter", render.show_duration(info.jitter)),
        ("catch-up window", render.show_duration(info.catchup_window)),
        ("status", render.show_schedule_status(info)),
        ("note", info.note or "-"),
        ("next fire", _when(info.next_fire_at)),
        ("last fire", _when(info.last_fire_at)),
        ("last run", info.last_run_id or "-"),
    ):
        click.echo(f"{key + ':':<17}{value}")


@schedules.command("pause")
@click.argument("name", type=SCHEDULE_NAME)
@click.option("--note", type=TEXT, default="", help="Why (shown by list and show).")
@connection_options
@json_option
def pause_schedule(name: str, note: str) -> None:
    """Stop firing a schedule; fires due while paused are skipped. Survives redeploys."""
    with _admin() as admin:
        admin.pause(name, note)
        info = admin.get(name)
    _done(info, f"paused schedule {name!r}")


@schedules.command("resume")
@click.argument("name", type=SCHEDULE_NAME)
@connection_options
@json_option
def resume_schedule(name: str) -> None:
    """Fire a paused schedule again, from its next fire time after now."""
    with _admin() as admin, _computable():
        admin.resume(name)
        info = admin.get(name)
    _done(info, f"resumed schedule {name!r} (next fire {_when(info.next_fire_at)})")


@schedules.command("trigger")
@click.argument("name", type=SCHEDULE_NAME)
@connection_options
@json_option
def trigger_schedule(name: str) -> None:
    """Start one run of a schedule now, whatever its timing, pause or overlap."""
    with _admin() as admin:
        run_id = admin.trigger(name)
    if settings().json:
        click.echo(render.dumps({"schedule": name, "run_id": run_id}))
    else:
        click.echo(run_id)


@schedules.command("backfill")
@click.argument("name", type=SCHEDULE_NAME)
@click.option("--start", type=MOMENT, required=True, help="First fire time to fill (ISO 8601, inclusive).")
@click.option("--end", type=MOMENT, required=True, help="End of the range (ISO 8601, exclusive; not in the future).")
@connection_options
@json_option
def backfill_schedule(name: str, start: datetime, end: datetime) -> None:
    """Start a run for every fire time in [START, END) that has none yet (after an outage)."""
    with _admin() as admin, _computable():
        run_ids = admin.backfill(name, start, end)
    if settings().json:
        click.echo(render.dumps({"schedule": name, "run_ids": run_ids}))
    else:
        for run_id in run_ids:
            click.echo(run_id)
        click.echo(f"started {len(run_ids)} run(s) of schedule {name!r}", err=True)


@schedules.command("delete")
@click.argument("name", type=SCHEDULE_NAME)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@connection_options
@json_option
def delete_schedule(name: str, yes: bool) -> None:
    """Delete a schedule (its runs stay). An engine that declares it creates it again."""
    with _admin() as admin:
        admin.get(name)  # a schedule that does not exist: say so before asking
        if not yes and not click.confirm(f"delete schedule {name!r}?", err=True):
            raise CommandError(f"schedule {name!r} not deleted")
        admin.delete(name)
    if settings().json:
        click.echo(render.dumps({"deleted": name}))
    else:
        click.echo(f"deleted schedule {name!r}")


def _when(moment: datetime | None) -> str:
    return render.iso(moment) if moment is not None else "-"


def _done(info: ScheduleInfo, message: str) -> None:
    if settings().json:
        click.echo(render.dumps(info))
    else:
        click.echo(message)
