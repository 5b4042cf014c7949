"""``dex engines``: the live engines on a schema (docs/reference/contract.md §15).

Each started engine keeps a row, refreshed with its leader-election heartbeat and deleted when
it stops; a crashed engine's row is no longer listed once it expires (a leader lease after its
last heartbeat, 15 s by default). So this lists the processes that serve the queues now.
"""

from __future__ import annotations

import click

from dex.app.ports.engines import EngineInfo
from dex.cli.database import connection_options, json_option, open_engine, settings
from dex.views import render

HEADERS = ("NODE ID", "HOST", "PID", "CODE VERSION", "QUEUES", "WORKFLOWS", "ACTIVITIES", "LAST SEEN")


@click.command("engines")
@connection_options
@json_option
def engines() -> None:
    """List the live engines: host, pid, code version, queues, registered names, last seen."""
    with open_engine() as engine:
        infos = engine.list_engines()
    show(infos)


def row(info: EngineInfo) -> tuple[str, ...]:
    return (
        info.node_id,
        info.host,
        str(info.pid),
        info.code_version or "-",
        ",".join(info.queues) or "-",
        str(len(info.workflows)),
        str(len(info.activities)),
        render.show_time(info.last_seen),
    )


def show(infos: list[EngineInfo]) -> None:
    if settings().json:
        click.echo(render.dumps(infos))
    elif infos:
        click.echo(render.table(HEADERS, [row(info) for info in infos]))
    else:
        click.echo("no live engines: none is started on this schema, or the last one stopped", err=True)
