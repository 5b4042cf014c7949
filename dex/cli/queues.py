"""``dex queues``: list task queues, pause and resume them, set their capacity.

A queue is named per kind: a workflow queue and an activity queue may share a name (both are
called ``default`` unless code says otherwise). Without ``--kind`` a command acts on every
queue of that name, which is what "pause the payments queue" usually means.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from dex.app.facade.engine import Engine
from dex.app.ports.store import QUEUE_KINDS, QueueInfo
from dex.cli.database import CommandError, connection_options, json_option, open_engine, settings
from dex.cli.params import CAPACITY, QUEUE_NAME, NumbersMayBeNegative
from dex.views import render

_kind_option = click.option(
    "--kind",
    type=click.Choice(QUEUE_KINDS),
    default=None,
    help="Only the workflow or only the activity queue of that name [default: both].",
)


@click.group()
def queues() -> None:
    """List and control task queues."""


@queues.command("list")
@connection_options
@json_option
def list_queues() -> None:
    """List queues with their status, capacity and depth (tasks waiting or running)."""
    with open_engine() as engine:
        infos = engine.list_queues()
    _show(infos)


@queues.command("pause")
@click.argument("name", type=QUEUE_NAME)
@_kind_option
@connection_options
@json_option
def pause_queue(name: str, kind: str | None) -> None:
    """Stop handing out new tasks from a queue (tasks under way finish)."""
    _update(name, kind, lambda engine, k: engine.pause_queue(name, k), "paused")


@queues.command("resume")
@click.argument("name", type=QUEUE_NAME)
@_kind_option
@connection_options
@json_option
def resume_queue(name: str, kind: str | None) -> None:
    """Hand out tasks from a paused queue again."""
    _update(name, kind, lambda engine, k: engine.resume_queue(name, k), "resumed")


@queues.command("capacity", cls=NumbersMayBeNegative)
@click.argument("name", type=QUEUE_NAME)
@click.argument("capacity", type=CAPACITY)
@_kind_option
@connection_options
@json_option
def set_capacity(name: str, capacity: int, kind: str | None) -> None:
    """Set how many tasks of a queue may be claimable or running at once."""
    _update(name, kind, lambda engine, k: engine.set_queue_capacity(name, k, capacity), f"set capacity {capacity} of")


def _update(name: str, kind: str | None, act: Callable[[Engine, str], None], done: str) -> None:
    with open_engine() as engine:
        matching = [info for info in engine.list_queues() if info.name == name and kind in (None, info.kind)]
        if not matching:
            what = f"{kind} queue" if kind else "queue"
            raise CommandError(f"there is no {what} named {name!r}")
        for info in matching:
            act(engine, info.kind)
        updated = [
            info for info in engine.list_queues() if (info.name, info.kind) in {(m.name, m.kind) for m in matching}
        ]
    if settings().json:
        _show(updated)
    else:
        for info in updated:
            click.echo(f"{done} {info.kind} queue {info.name!r} (status {info.status}, capacity {info.capacity})")


def _show(infos: list[QueueInfo]) -> None:
    if settings().json:
        click.echo(render.dumps(infos))
    elif infos:
        rows = [(info.name, info.kind, info.status, str(info.capacity), str(info.depth)) for info in infos]
        click.echo(render.table(("NAME", "KIND", "STATUS", "CAPACITY", "DEPTH"), rows))
    else:
        click.echo("no queues yet: they are created when code that uses them starts", err=True)
