"""Which database a command talks to, the options that say so, and opening it.

``--database-url`` and ``--schema`` are accepted before the command (``dex --schema s runs
list``) and after it (``dex runs list --schema s``); the later one wins, and the URL falls back
to ``DEX_DATABASE_URL``. Without any URL, ``demo`` and ``migrate`` start the embedded server
whose data lives in ``./.dex-data`` (as they always have); the other commands use that server
only if ``./.dex-data`` already exists, so that inspecting runs never creates a database.

Commands that read or change runs and queues open the schema without migrating it: a schema
that is missing or older than this dex is an error that says to run ``dex migrate``, not a
side effect of ``dex runs list``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import attrs
import click

import dex
from dex.adapters.postgres import LATEST_VERSION, PostgresAdapter, schema_version
from dex.adapters.postgres.connection import connect, describe_dsn, prepare_conninfo
from dex.adapters.postgres.embedded import DEFAULT_DATA_DIR, embedded_dsn
from dex.cli.params import DSN, SCHEMA

DEFAULT_SCHEMA = "dex"
F = TypeVar("F", bound=Callable[..., Any])


class CommandError(click.ClickException):
    """A failure the user can act on (exit code 1); printed as one ``error:`` line."""

    exit_code = 1


class UsageProblem(click.ClickException):
    """A command line (or configuration) that cannot be used as given: one line, exit code 2."""

    exit_code = 2


@attrs.define
class Settings:
    """The options every command shares; kept on the click context as its ``obj``."""

    database_url: str | None = None
    schema: str | None = None
    json: bool = False

    def schema_or(self, default: str) -> str:
        return self.schema or default


def settings() -> Settings:
    return click.get_current_context().ensure_object(Settings)


def _store(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value not in (None, False):
            setattr(ctx.ensure_object(Settings), name, value)

    return callback


def connection_options(command: F) -> F:
    """``--database-url`` and ``--schema`` on a command (the group has them too)."""
    command = click.option(
        "--schema",
        type=SCHEMA,
        expose_value=False,
        callback=_store("schema"),
        help=f"Schema that holds dex's tables [default: {DEFAULT_SCHEMA}].",
    )(command)
    return click.option(
        "--database-url",
        metavar="URL",
        type=DSN,
        expose_value=False,
        callback=_store("database_url"),
        help="PostgreSQL URL [default: $DEX_DATABASE_URL].",
    )(command)


def json_option(command: F) -> F:
    """``--json``: print a JSON document instead of a table."""
    return click.option(
        "--json", "as_json", is_flag=True, expose_value=False, callback=_store("json"), help="Print JSON."
    )(command)


def progress(message: str) -> None:
    """A progress line; on stderr, so that stdout holds only the command's output."""
    click.echo(message, err=True)


def resolve_url(embedded: Literal["start", "existing"]) -> str:
    """The database URL of this command; see the module docstring for the embedded server."""
    url = settings().database_url
    if url:
        return url
    if embedded == "existing" and not DEFAULT_DATA_DIR.is_dir():
        raise CommandError("no database configured: set DEX_DATABASE_URL or pass --database-url")
    progress(f"starting the embedded PostgreSQL server (data in {DEFAULT_DATA_DIR}/) ...")
    try:
        return embedded_dsn()
    except RuntimeError as exc:  # the embedded extra is not installed
        raise CommandError(str(exc)) from None


@contextmanager
def open_engine() -> Iterator[dex.Engine]:
    """An engine with no registered code over the configured schema, which must be migrated."""
    url = resolve_url("existing")
    schema = settings().schema_or(DEFAULT_SCHEMA)
    conninfo = prepare_conninfo(url, None)
    with connect(conninfo) as conn:
        version = schema_version(conn, schema)
    where = describe_dsn(conninfo)
    if version == 0:
        raise CommandError(f"there is no dex schema {schema!r} at {where}: run 'dex migrate' first, or pass --schema")
    if version < LATEST_VERSION:
        raise CommandError(
            f"schema {schema!r} at {where} is at version {version}, this dex needs {LATEST_VERSION}: run 'dex migrate'"
        )
    if version > LATEST_VERSION:
        raise CommandError(
            f"schema {schema!r} at {where} is at version {version}, newer than this dex knows ({LATEST_VERSION}): "
            "upgrade dex"
        )
    adapter = PostgresAdapter(url, schema=schema, migrate=False, min_connections=1, max_connections=2)
    try:
        yield dex.Engine(adapter)
    finally:
        adapter.close()
