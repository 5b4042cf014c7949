"""``dex dev``: a local PostgreSQL and the dashboard, for development, until Ctrl-C.

It starts the embedded server (:mod:`dex.adapters.postgres.embedded`) whose data lives in
``--data-dir``, or reuses the one already running there, and holds it while it runs: the
server stops when its last holder exits, so without ``dex dev`` it would stop with whichever
script started it. It migrates the schema, prints the DSN as a line a shell can run
(``export DEX_DATABASE_URL=...``), so the user's own ``dex worker``, app and ``dex runs ...``
use the same server, and serves the dashboard as ``dex web`` does, on 127.0.0.1 only.

Ctrl-C (or SIGTERM) stops the dashboard and lets go of the server (which stops, unless another
holder still runs), and exits 0: stopping is how a development server is meant to end.
"""

from __future__ import annotations

import shlex
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.adapters.postgres import migrate as run_migrations
from dex.adapters.postgres.connection import connect, prepare_conninfo
from dex.adapters.postgres.embedded import DEFAULT_DATA_DIR, EmbeddedServer, hold_server, is_running
from dex.cli.database import DEFAULT_SCHEMA, CommandError, progress, settings
from dex.cli.params import SCHEMA, TextPath
from dex.cli.web import MISSING_EXTRA, listen, url_of

HOST = "127.0.0.1"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@click.command("dev", short_help="Run a local PostgreSQL and the dashboard for development, until Ctrl-C.")
@click.option(
    "--data-dir",
    default=str(DEFAULT_DATA_DIR),
    show_default=True,
    type=TextPath(file_okay=False),
    help="Directory of the server's data (created if missing; a server already running on it is reused).",
)
@click.option(
    "--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="Dashboard port (0: any free one)."
)
@click.option("--schema", type=SCHEMA, default=None, help=f"Schema to migrate and show [default: {DEFAULT_SCHEMA}].")
def dev(data_dir: str, port: int, schema: str | None) -> int:
    """Start (or reuse) an embedded PostgreSQL with its data in --data-dir, migrate it, print its
    DSN and serve the dashboard on 127.0.0.1 until Ctrl-C.

    Run the printed 'export DEX_DATABASE_URL=...' line in another shell: your 'dex worker', your
    application and the other dex commands then use this server. --database-url does not apply.
    """
    schema = schema or settings().schema_or(DEFAULT_SCHEMA)
    # before the server starts: a port in use is one line of error, and nothing was started
    sock = listen(HOST, port) if _dashboard_installed() else None
    try:
        with _until_signalled() as stop:
            server = _hold(Path(data_dir))
            _migrate(server.dsn, schema)
            click.echo(f"export DEX_DATABASE_URL={shlex.quote(server.dsn)}")
            if schema != DEFAULT_SCHEMA:
                progress(f"(schema {schema!r}: pass --schema {schema} to the other dex commands)")
            if sock is None:
                progress(f"not serving the dashboard: {MISSING_EXTRA}")
                progress("press Ctrl-C to stop")
                while not stop.wait(0.5):  # a timed wait, so the signal handler gets to run promptly
                    pass
            elif not stop.is_set():  # Ctrl-C while the server started: nothing left to serve
                _serve(sock, server.dsn, schema, stop)
    finally:
        if sock is not None:
            sock.close()
    progress("stopped")
    return 0


def _hold(data_dir: Path) -> EmbeddedServer:
    try:
        if is_running(data_dir):
            progress(f"reusing the embedded PostgreSQL server already running on {data_dir}/")
        else:
            progress(f"starting the embedded PostgreSQL server (data in {data_dir}/) ...")
        return hold_server(data_dir)
    except RuntimeError as exc:  # the embedded extra is not installed
        raise CommandError(str(exc)) from None


def _dashboard_installed() -> bool:
    try:
        import uvicorn  # noqa: F401

        import dex.web  # noqa: F401
    except ImportError:
        return False
    return True


def _migrate(dsn: str, schema: str) -> None:
    with connect(prepare_conninfo(dsn, None)) as conn:
        version = run_migrations(conn, schema)
    progress(f"schema {schema!r} is at version {version}")


def _serve(sock: socket.socket, dsn: str, schema: str, stop: threading.Event) -> None:
    import uvicorn

    from dex.remote.service import ActivityTaskService
    from dex.web import create_app

    adapter = PostgresAdapter(dsn, schema=schema, migrate=False, min_connections=1, max_connections=4)
    try:
        engine = dex.Engine(adapter)
        # as dex web serves it: the JSON API with the remote workers' routes (/v1/activity-tasks)
        app = create_app(engine, activity_task_service=ActivityTaskService(engine))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        # uvicorn takes SIGINT and SIGTERM only once it runs (then shuts down gracefully and
        # raises the signal again, which _until_signalled's handler takes: exit code 0); a signal
        # that comes before, while it starts, is _until_signalled's, and this thread passes it on
        threading.Thread(target=_stop_when_set, args=(stop, server), name="dex-dev-stop", daemon=True).start()
        click.echo(f"serving the dex dashboard at {url_of(sock)}")
        progress("press Ctrl-C to stop")
        server.run(sockets=[sock])
    finally:
        stop.set()
        adapter.close()


def _stop_when_set(stop: threading.Event, server: Any) -> None:
    stop.wait()
    server.should_exit = True  # uvicorn's own way to ask a running server to shut down


@contextmanager
def _until_signalled() -> Iterator[threading.Event]:
    """An event SIGINT and SIGTERM set while inside (instead of KeyboardInterrupt and exit 130)."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in SIGNALS}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
