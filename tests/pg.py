"""A PostgreSQL server for tests, and a fresh schema per test.

:func:`postgres_dsn` finds a server once per test session, in this order:

1. ``DEX_TEST_DATABASE_URL``, if set (CI with a service container, a developer's database);
2. a testcontainers ``PostgresContainer``, if a Docker daemon answers within about a second
   (one per pytest-xdist worker);
3. an embedded server from ``pgserver`` in a temporary directory (stopped and deleted when
   the test process exits; pytest-xdist's workers of one run share one, which the process
   that started them stops and deletes after they exit).

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
# the directory of the embedded server that pytest-xdist's workers share (share_embedded_server)
SHARED_SERVER_ENV = "DEX_TEST_SHARED_PGSERVER"

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

    shared = os.environ.get(SHARED_SERVER_ENV)
    if shared is None:  # a test process of its own: a server of its own, gone when it exits
        base = Path(tempfile.mkdtemp(prefix="dex-test-pg-", dir="/tmp"))
        # atexit runs last-in first-out: pgserver's own cleanup (stop, delete data) runs first
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        cleanup_mode: str | None = "delete"
    else:
        # a pytest-xdist worker: the first of them starts the server (under pgserver's
        # inter-process lock), the others find it running; the process that started the
        # workers stops and deletes it once they have exited (remove_shared_server), as a
        # worker's own exit may be cut short (xdist kills a worker that is slow to end)
        base = Path(shared)
        cleanup_mode = None
    # Run as root, pgserver starts the server as the system user "pgserver", which must be
    # able to enter the directory that holds the data directory and the socket.
    base.chmod(0o777)
    # made here, not by get_server, whose check-then-mkdir would race between the workers
    (base / "data").mkdir(exist_ok=True)
    server = pgserver.get_server(base / "data", cleanup_mode=cleanup_mode)
    dsn = str(server.get_uri())
    # A server thrown away after the run need not wait for the disk: without fsync a DROP
    # DATABASE's checkpoint (or any commit) is not stuck behind other processes' I/O. Nothing
    # is lost unless the machine itself crashes; tests that crash a server use their own.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("SELECT pg_reload_conf()")
    return dsn


def share_embedded_server() -> Path:
    """For the process that starts pytest-xdist workers, before it starts them: they will share
    one embedded server (if they need one) in the directory returned, told to them through
    the environment they inherit. :func:`remove_shared_server` removes it after them."""
    base = Path(tempfile.mkdtemp(prefix="dex-test-pg-", dir="/tmp"))
    os.environ[SHARED_SERVER_ENV] = str(base)
    return base


def remove_shared_server(base: Path) -> None:
    """Stop the workers' server, if one of them started it, and delete its files."""
    _stop_and_delete(base, base / "data", mode="immediate")  # thrown away: no shutdown checkpoint


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _pg_ctl(pgdata: Path, log: Path | None, *args: str, timeout: float = 60) -> None:
    """Run ``pg_ctl -D <data> args`` as the server's owner (pgserver runs it as the system user
    "pgserver" when we are root).

    The output goes to the log file (or nowhere), never to a pipe: the server ``pg_ctl``
    starts inherits its stdout, and a pipe would keep the caller waiting for as long as the
    server lives.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH

    as_owner = ["runuser", "-u", "pgserver", "--"] if os.geteuid() == 0 else []
    with open(log or os.devnull, "ab") as out:
        subprocess.run(
            [*as_owner, str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            check=True,
            timeout=timeout,
        )


def _stop_and_delete(base: Path, pgdata: Path, mode: str = "fast") -> None:
    if _postmaster_pid(pgdata) is not None:
        try:
            _pg_ctl(pgdata, None, "stop", "-w", "-m", mode)
        except (subprocess.SubprocessError, OSError):
            pid = _postmaster_pid(pgdata)
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    shutil.rmtree(base, ignore_errors=True)


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

        self._base = base
        self.pgdata = base / "data"
        self.log = base / "server.log"
        # cleanup_mode=None: pgserver tracks the first postmaster only, so after a restart it
        # could not stop the server; close() stops it (whatever its pid) and deletes the files
        server = pgserver.get_server(self.pgdata, cleanup_mode=None)
        self.dsn = str(server.get_uri())

    def postmaster_pid(self) -> int | None:
        return _postmaster_pid(self.pgdata)

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        """Run ``pg_ctl -D <data> args`` as the server's owner, its output to the log file."""
        _pg_ctl(self.pgdata, self.log, *args, timeout=timeout)

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
        _stop_and_delete(self._base, self.pgdata)


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
