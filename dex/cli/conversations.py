"""``dex runs update`` and ``dex runs query`` (docs/reference/contract.md §14).

``update`` needs none of the workflow's code: it puts the request in the run's inbox and waits
for the answer that the engines running the workflow write (``--timeout`` seconds; a timeout
names the update id, which ``--update-id`` sends again to get the answer, never running the
handler twice). ``query`` runs the workflow's query handler, so it needs the code: ``--app
MODULE:ENGINE`` names the application's engine (found as ``dex worker`` finds it), which
answers from its own store; without it the command says so.

Arguments are one JSON array (``@PATH`` reads a file, ``-`` standard input). The answer is
printed as JSON. A refusal (validator, unknown name), a failed handler, an ended run or a
timeout is one ``error:`` line and exit code 1; a command line that cannot be used, exit 2.
"""

from __future__ import annotations

from typing import Any

import click

from dex.cli.database import CommandError, UsageProblem, connection_options, json_option, open_engine, settings
from dex.cli.params import JSON_VALUE, RUN_ID, SECONDS, TEXT
from dex.cli.worker import load_engine
from dex.domain.errors import QueryError, UpdateFailedError, UpdateRejectedError
from dex.views import render

DEFAULT_TIMEOUT = 30.0


def _args(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise UsageProblem(f"ARGS must be a JSON array of the handler's arguments, got {type(value).__name__}")
    return value


@click.command("update")
@click.argument("run_id", type=RUN_ID)
@click.argument("name", type=TEXT)
@click.argument("args", type=JSON_VALUE, required=False)
@click.option("--update-id", metavar="ID", type=TEXT, help="Makes the update idempotent [default: a new UUID].")
@click.option(
    "--timeout",
    type=SECONDS,
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for the answer.",
)
@connection_options
@json_option
def update_run(run_id: str, name: str, args: Any, update_id: str | None, timeout: float) -> None:
    """Send update NAME to run RUN_ID with ARGS (a JSON array) and print the handler's answer."""
    values = _args(args)
    with open_engine() as engine:
        try:
            result = engine.update(run_id, name, *values, update_id=update_id, timeout=timeout)
        except (UpdateRejectedError, UpdateFailedError) as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}") from None
        except TimeoutError as exc:
            raise CommandError(str(exc)) from None
    if settings().json:
        click.echo(render.dumps({"run_id": run_id, "name": name, "result": render.jsonable(result)}))
    else:
        click.echo(render.dumps(render.jsonable(result)))


@click.command("query")
@click.argument("run_id", type=RUN_ID)
@click.argument("name", type=TEXT)
@click.argument("args", type=JSON_VALUE, required=False)
@click.option(
    "--app",
    "target",
    metavar="MODULE:ENGINE",
    type=TEXT,
    help="The application's engine, which has the workflow's code (as for 'dex worker').",
)
@click.option("--app-dir", default=".", show_default=True, type=TEXT, help="Where MODULE is imported from.")
@connection_options
@json_option
def query_run(run_id: str, name: str, args: Any, target: str | None, app_dir: str) -> None:
    """Ask query NAME of run RUN_ID with ARGS (a JSON array) and print the answer; read-only."""
    values = _args(args)
    if target is None:
        with open_engine() as engine:
            if engine.store.get_run(run_id) is not None:
                raise CommandError(
                    "a query runs the workflow's code, which this command does not have:"
                    " pass --app MODULE:ENGINE (the application's engine, as for 'dex worker')"
                )
            result = engine.query(run_id, name, *values)  # an unknown run: RunNotFoundError
    else:
        engine = load_engine(target, app_dir)
        try:
            result = engine.query(run_id, name, *values)
        except QueryError as exc:
            raise CommandError(f"QueryError: {exc}") from None
        finally:
            engine.store.close()
    if settings().json:
        click.echo(render.dumps({"run_id": run_id, "name": name, "result": render.jsonable(result)}))
    else:
        click.echo(render.dumps(render.jsonable(result)))
