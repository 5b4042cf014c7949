"""A PostgreSQL server for tests, and a fresh schema per test.

:func:`postgres_dsn` finds a server once per test session, in this order:

1. ``DEX_TEST_DATABASE_URL``, if set (CI with a service container, a developer's database);
2. a testcontainers ``PostgresContainer``, if a Docker daemon answers within about a second;
3. an embedded server from ``pgserver`` in a temporary directory (stopped and deleted when
   the test process exits; pytest-xdist's workers of one run share one, stopped and deleted
   when the last of them exits).

:func:`fresh_schema` gives each test its own schema, so tests never see each other's rows
and one server serves the whole session. A test that restarts its server takes one of its own
from :func:`dedicated_server` instead.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

ENV_VAR = "DEX_TEST_DATABASE_URL"

_lock = threading.Lock()
_dsn: str | None = None


def postgres_dsn() -> str:
    """The DSN of the session's test server (started on first use)."""
    global _dsn
    with _lock:
        if _dsn is None:
            _dsn = os.environ.get(ENV_VAR) or (_container_dsn() if docker_available() else None) or _embedded_dsn()
        return _dsn


def docker_available(timeout: float = 1.0) -> bool:
    """Whether a Docker daemon answers on its socket (or DOCKER_HOST) within ``timeout`` seconds."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(host[len("unix://") :])
                sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                return sock.recv(16).startswith(b"HTTP/")
        if host.startswith("tcp://"):
            address, _, port = host[len("tcp://") :].rpartition(":")
            with socket.create_connection((address, int(port)), timeout=timeout):
                return True
    except (OSError, ValueError):
        return False
    return False


def _container_dsn() -> str | None:
    try:
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16-alpine", driver=None)
        container.start()
    except Exception:  # noqa: BLE001 - a daemon that cannot run the image: fall back to pgserver
        return None
    atexit.register(container.stop)
    return str(container.get_connection_url())


def _embedded_dsn() -> str:
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, root)
        warnings.simplefilter("ignore")
        import pgserver

    # Run as root, pgserver starts the server as the system user "pgserver", which must be
    # able to enter the directory that holds the data directory and the socket.
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # a single test process: a server of its own
        base = Path(tempfile.mkdtemp(prefix="dex-test-pg-", dir="/tmp"))
        # atexit runs last-in first-out: pgserver's own cleanup (stop, delete data) runs first
        atexit.register(shutil.rmtree, base, ignore_errors=True)
    else:
        # pytest-xdist's workers of one run share one server in a directory named after the
        # run: pgserver starts it for the first of them (under its inter-process lock) and
        # stops and deletes it when the last one exits, so that one also removes the emptied
        # base; the others find it in use and leave it
        base = Path("/tmp", f"dex-test-pg-{run}")
        base.mkdir(exist_ok=True)
        atexit.register(_remove_if_empty, base)
    base.chmod(0o777)
    # made here, not by get_server, whose check-then-mkdir would race between the workers
    (base / "data").mkdir(exist_ok=True)
    server = pgserver.get_server(base / "data", cleanup_mode="delete")
    dsn = str(server.get_uri())
    # A server thrown away after the run need not wait for the disk: without fsync a DROP
    # DATABASE's checkpoint (or any commit) is not stuck behind other processes' I/O. Nothing
    # is lost unless the machine itself crashes; tests that crash a server use their own.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("SELECT pg_reload_conf()")
    return dsn


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass


def new_schema_name(prefix: str = "dex_test") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def fresh_schema(dsn: str | None = None, prefix: str = "dex_test") -> Iterator[str]:
    """A schema name no other test uses; the schema is dropped afterwards (if it was created)."""
    dsn = dsn or postgres_dsn()
    schema = new_schema_name(prefix)
    try:
        yield schema
    finally:
        drop_schema(dsn, schema)


class EmbeddedServer:
    """A PostgreSQL server of a test's own (pgserver), which the test may restart at will.

    The session's server is shared by every test; a test that restarts its server must not
    pull it from under the others, so it takes one of these instead.
    """

    def __init__(self, base: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver
            from pgserver._commands import POSTGRES_BIN_PATH

        self._base = base
        self.pgdata = base / "data"
        self.log = base / "server.log"
        # cleanup_mode=None: pgserver tracks the first postmaster only, so after a restart it
        # could not stop the server; close() stops it (whatever its pid) and deletes the files
        server = pgserver.get_server(self.pgdata, cleanup_mode=None)
        self.dsn = str(server.get_uri())
        self._pg_ctl = str(POSTGRES_BIN_PATH / "pg_ctl")
        self._as_owner = ["runuser", "-u", "pgserver", "--"] if os.geteuid() == 0 else []

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        """Run ``pg_ctl -D <data> args`` as the server's owner.

        The output goes to the log file, never to a pipe: the server ``pg_ctl`` starts inherits
        its stdout, and a pipe would keep the caller waiting for as long as the server lives.
        """
        with open(self.log, "ab") as log:
            subprocess.run(
                [*self._as_owner, self._pg_ctl, "-D", str(self.pgdata), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                check=True,
                timeout=timeout,
            )

    def restart(self, mode: str = "immediate") -> None:
        """Restart the server (``immediate``: a crash, then recovery) and wait until it is up."""
        self.pg_ctl("restart", "-w", "-m", mode, "-l", str(self.pgdata / "log"))

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("stop", "-w", "-m", mode)

    def start(self) -> None:
        """Start the stopped server as pgserver does: no TCP, the socket in its directory."""
        socket_dir = psycopg.conninfo.conninfo_to_dict(self.dsn)["host"]
        self.pg_ctl("start", "-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(self.pgdata / "log"))

    def close(self) -> None:
        if self.postmaster_pid() is not None:
            try:
                self.pg_ctl("stop", "-w", "-m", "fast")
            except (subprocess.SubprocessError, OSError):
                pid = self.postmaster_pid()
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self._base, ignore_errors=True)


@contextmanager
def dedicated_server() -> Iterator[EmbeddedServer]:
    """A fresh embedded server in its own temporary directory, stopped and deleted afterwards."""
    base = Path(tempfile.mkdtemp(prefix="dex-test-pg-own-", dir="/tmp"))
    base.chmod(0o777)
    server = EmbeddedServer(base)
    try:
        yield server
    finally:
        server.close()
