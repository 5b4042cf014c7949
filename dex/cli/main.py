"""The ``dex`` command: its root group, ``demo`` and ``migrate``, and how errors are reported.

Every error ends the command with one line on stderr, ``error: ...``, and an exit code: 1 when
dex or the database refused (no such run, an illegal transition, a server that cannot be
reached), 2 when the command line itself is wrong (a missing argument, a bad option value, a DSN that
is no DSN).
Those are caught in :meth:`DexGroup.main`, so the console script, ``python -m dex`` and
click's test runner all see the same behaviour. No error line shows a secret: a DSN that
cannot be used is shown with its password redacted (:mod:`dex.views.secrets`), a token not at
all, and every line is scrubbed of the secrets the command line and its environment hold
whatever path the error took. The parameter types (:mod:`dex.cli.params`)
catch bad values before anything is sent; a bad value that gets past them anyway is refused
by dex with a ``ValueError`` or ``TypeError``, also exit code 2. Anything else is a bug in dex:
one line naming the exception, exit code 1, and its traceback only with ``--debug`` (or
``DEX_DEBUG=1``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from importlib import metadata
from typing import Any

import click
import psycopg
from psycopg_pool import PoolTimeout

from dex.adapters.postgres import LATEST_VERSION, schema_version
from dex.adapters.postgres import migrate as run_migrations
from dex.adapters.postgres.connection import InvalidDsnError, connect, describe_dsn, prepare_conninfo
from dex.cli import database
from dex.cli.conversations import query_run, update_run
from dex.cli.database import DEFAULT_SCHEMA, Settings, connection_options, json_option, progress, settings
from dex.cli.dev import dev
from dex.cli.engines import engines
from dex.cli.params import DSN, SCHEMA
from dex.cli.queues import queues
from dex.cli.replay import replay
from dex.cli.runs import events, runs
from dex.cli.schedules import schedules
from dex.cli.web import web
from dex.cli.worker import worker
from dex.domain.errors import DexError, SerializationError
from dex.views.render import dumps, show_duration
from dex.views.secrets import REDACTED, secrets_of

DEMO_SCHEMA = "dex_demo"
DATABASE_URL_ENV = "DEX_DATABASE_URL"
WEB_TOKEN_ENV = "DEX_WEB_TOKEN"


class DexGroup(click.Group):
    """The root group; its ``main`` turns every expected error into one line and an exit code."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> int:
        code = self._run(args, prog_name, complete_var, **extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def _run(self, args: Sequence[str] | None, prog_name: str | None, complete_var: str | None, **extra: Any) -> int:
        given = list(sys.argv[1:] if args is None else args)
        # read before click parses anything: an error in parsing must know it too
        debug = "--debug" in given or _debug_from_env()
        hide = _secrets_given(given)

        def error(message: str, code: int) -> int:
            return _error(message, code, hide)

        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()  # the help text of the group that was given no command
            return exc.exit_code
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            return error(exc.format_message() + hint, exc.exit_code)
        except click.ClickException as exc:
            return error(exc.format_message(), exc.exit_code)
        except SerializationError as exc:  # a value given on the command line that dex cannot store
            return error(str(exc), 2)
        except InvalidDsnError as exc:  # the command line's DSN is wrong on its face: nothing was sent
            return error(str(exc), 2)
        except (DexError, PoolTimeout) as exc:
            return error(str(exc), 1)
        except psycopg.Error as exc:
            return error(f"database error: {_first_line(exc)}", 1)
        except (click.Abort, KeyboardInterrupt):
            return error("interrupted", 130)
        except BrokenPipeError:  # e.g. `dex runs list | head`: the reader left, nothing to report
            sys.stdout = None  # no flush of the dead pipe at exit
            return 1
        except (ValueError, TypeError, OverflowError) as exc:  # dex refused a value the types let by
            if debug:
                raise
            return error(_first_line(exc), 2)
        except Exception as exc:  # a bug in dex: say what, and how to see where
            if debug:
                raise
            return error(f"internal error: {type(exc).__name__}: {_first_line(exc)} (--debug shows the traceback)", 1)
        return result if isinstance(result, int) else 0


_SECRET_OPTIONS = {"--database-url": DATABASE_URL_ENV, "--token": WEB_TOKEN_ENV}


def _secrets_given(args: Sequence[str]) -> list[str]:
    """Every secret this command line or its environment holds (the DSNs' passwords, the web
    token), so that no error line shows one, whatever path the error took."""
    values: dict[str, list[str]] = {option: [] for option in _SECRET_OPTIONS}
    for option, env in _SECRET_OPTIONS.items():
        if os.environ.get(env):
            values[option].append(os.environ[env])
    for i, arg in enumerate(args):
        option, equals, value = arg.partition("=")
        if option in values:
            if equals:
                values[option].append(value)
            elif i + 1 < len(args):
                values[option].append(args[i + 1])
    found = [secret for dsn in values["--database-url"] for secret in secrets_of(dsn)]
    found.extend(token for token in values["--token"] if token)
    return sorted(set(found), key=len, reverse=True)


def _debug_from_env() -> bool:
    return os.environ.get("DEX_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _version() -> str:
    try:
        return metadata.version("dex-engine")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _error(message: str, code: int, hide: Sequence[str] = ()) -> int:
    for secret in hide:
        message = message.replace(secret, REDACTED)
    # one line; a lone surrogate from the command line shown as an escape, not a crash in echo
    line = " ".join(message.split()).encode("utf-8", "backslashreplace").decode("utf-8")
    click.echo(f"error: {line}", err=True)
    return code


@click.group("dex", cls=DexGroup, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), prog_name="dex")
@click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    metavar="URL",
    type=DSN,
    help="PostgreSQL URL [default: $DEX_DATABASE_URL; demo and migrate: an embedded server in ./.dex-data].",
)
@click.option("--schema", type=SCHEMA, help=f"Schema that holds dex's tables [default: {DEFAULT_SCHEMA}].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option(
    "--debug", is_flag=True, help="Show the traceback of an unexpected error [default: $DEX_DEBUG]."
)  # read by DexGroup.main before parsing
@click.pass_context
def cli(ctx: click.Context, database_url: str | None, schema: str | None, as_json: bool, debug: bool) -> None:
    """dex, a durable execution engine on PostgreSQL: run workers, inspect and control runs."""
    ctx.obj = Settings(database_url=database_url or None, schema=schema, json=as_json)


@cli.command(short_help="Run (or resume) a durable order workflow, printing its history.")
@click.option("--schema", type=SCHEMA, default=None, help=f"Schema the demo uses [default: {DEMO_SCHEMA}].")
@click.option("--database-url", metavar="URL", type=DSN, default=None, help="PostgreSQL URL [default: as for dex].")
def demo(schema: str | None, database_url: str | None) -> int:
    """Run (or resume) a durable order workflow and print its history as it grows.

    Press Ctrl-C while it runs, then run it again: it resumes the same run where it stopped.
    """
    from dex.demo import run_demo

    options = settings()
    options.database_url = database_url or options.database_url
    schema = schema or options.schema_or(DEMO_SCHEMA)
    url = database.resolve_url("start")
    progress(f"connecting to PostgreSQL, schema {schema!r} ...")
    return run_demo(url, schema=schema)


@cli.command()
@connection_options
@json_option
def migrate() -> None:
    """Create the dex schema, or upgrade it to this version of dex."""
    url = database.resolve_url("start")
    schema = settings().schema_or(DEFAULT_SCHEMA)
    conninfo = prepare_conninfo(url, None)
    progress(f"connecting to PostgreSQL at {describe_dsn(conninfo)} ...")
    began = time.monotonic()
    with connect(conninfo) as conn:
        before = schema_version(conn, schema)
        conn.commit()
        if before < LATEST_VERSION:
            progress(f"upgrading schema {schema!r} from version {before} to {LATEST_VERSION} ...")
        after = run_migrations(conn, schema)
    took = show_duration(timedelta(seconds=time.monotonic() - began))
    if settings().json:
        click.echo(dumps({"schema": schema, "previous_version": before, "version": after}))
    elif after == before:
        click.echo(f"schema {schema!r} is at version {after}: nothing to do")
    else:
        click.echo(f"schema {schema!r} is at version {after} (was {before}; took {took})")


cli.add_command(dev)
cli.add_command(worker)
runs.add_command(update_run)
runs.add_command(query_run)
cli.add_command(runs)
cli.add_command(events)
cli.add_command(queues)
cli.add_command(engines)
cli.add_command(schedules)
cli.add_command(replay)
cli.add_command(web)


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``dex``: run the command line and return its exit code."""
    return cli.main(args=list(argv) if argv is not None else None, prog_name="dex", standalone_mode=False)
