"""``dex queues``: list task queues, pause and resume them, set their capacity, key
concurrency and rate limit.

A queue is named per kind: a workflow queue and an activity queue may share a name (both are
called ``default`` unless code says otherwise). Without ``--kind`` a command acts on every
queue of that name, which is what "pause the payments queue" usually means.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import click

from dex.app.facade.engine import Engine
from dex.app.ports.store import QUEUE_KINDS, QueueInfo
from dex.cli.database import CommandError, connection_options, json_option, open_engine, settings
from dex.cli.params import CAPACITY, QUEUE_NAME, NumbersMayBeNegative, shorten
from dex.domain import queue_limits as limits
from dex.domain.queue_limits import RateLimit
from dex.views import render
from dex.views.render import PERIOD_UNITS, rate_text

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


@queues.command("key-concurrency", cls=NumbersMayBeNegative)
@click.argument("name", type=QUEUE_NAME)
@click.argument("n", type=CAPACITY)
@_kind_option
@connection_options
@json_option
def set_key_concurrency(name: str, n: int, kind: str | None) -> None:
    """Set how many runs sharing a concurrency key may run at once (granted by this queue)."""
    _update(name, kind, lambda engine, k: engine.set_queue_key_concurrency(name, k, n), f"set key concurrency {n} of")


class Rate(click.ParamType[Any, Any]):
    """A rate limit as ``N/PERIOD`` (``10/s``, ``600/5m``, ``1/250ms``), or ``none``."""

    name = "RATE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, RateLimit) or value is None:
            return value
        text = str(value).strip()
        if text.lower() in ("none", "off"):
            return None
        match = _RATE.match(text)
        if match is None:
            self.fail(f"{shorten(text)!r} is not a rate such as 10/s, 600/5m or 1/250ms (or none)", param, ctx)
        starts, amount, unit = match.groups()
        try:
            return limits.rate_limit((int(starts), float(amount or 1) * _PERIOD_UNITS[unit]))
        except (ValueError, OverflowError) as exc:
            self.fail(str(exc), param, ctx)


_RATE = re.compile(r"^(\d{1,12})\s*/\s*(\d{1,9}(?:\.\d{1,6})?)?\s*(ms|s|m|h|d)$")
_PERIOD_UNITS = dict(PERIOD_UNITS)


@queues.command("rate-limit")
@click.argument("name", type=QUEUE_NAME)
@click.argument("rate", type=Rate())
@_kind_option
@connection_options
@json_option
def set_rate_limit(name: str, rate: RateLimit | None, kind: str | None) -> None:
    """Let at most N of a queue's tasks start in any window of PERIOD (RATE: N/PERIOD, or none)."""
    done = f"set rate limit {rate_text(rate)} of" if rate is not None else "removed the rate limit of"
    _update(name, kind, lambda engine, k: engine.set_queue_rate_limit(name, k, rate), done)


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
            click.echo(
                f"{done} {info.kind} queue {info.name!r} (status {info.status}, capacity {info.capacity}"
                + _limits_text(info)
                + ")"
            )


def _limits_text(info: QueueInfo) -> str:
    """The limits a queue has besides its capacity, for the one-line answers ("" if none)."""
    parts = [f"key concurrency {info.key_concurrency}"] if info.key_concurrency != 1 else []
    parts += [f"rate limit {rate_text(info.rate_limit)}"] if info.rate_limit is not None else []
    return "".join(f", {part}" for part in parts)


def _show(infos: list[QueueInfo]) -> None:
    if settings().json:
        click.echo(render.dumps(infos))
    elif infos:
        rows = [
            (
                info.name,
                info.kind,
                info.status,
                str(info.capacity),
                str(info.depth),
                str(info.key_concurrency),
                rate_text(info.rate_limit),
            )
            for info in infos
        ]
        click.echo(render.table(("NAME", "KIND", "STATUS", "CAPACITY", "DEPTH", "KEYS", "RATE"), rows))
    else:
        click.echo("no queues yet: they are created when code that uses them starts", err=True)
