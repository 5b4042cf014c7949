"""Connecting to PostgreSQL: DSN handling, one clear error, and the connection pool.

A wrong DSN or an unreachable server must fail at once with a message naming the server
(never the password), not as a pool retrying in the background until a timeout. So the
adapter first opens one plain connection with a ``connect_timeout``; only when that works
does it open the pool. The password appears nowhere in what these errors carry: psycopg's
and libpq's messages may quote the DSN, so each :class:`DatabaseConnectionError` is raised
outside the ``except`` block that caught the driver's error (its ``__context__`` stays empty,
where ``from None`` would merely hide it from tracebacks), and any driver text it keeps goes
through :func:`~dex.views.secrets.scrub` first. A DSN libpq cannot read (unparsable, or
holding a NUL or a byte that is not UTF-8) is refused before libpq or the network sees it, as
:class:`InvalidDsnError`, showing the DSN redacted (:func:`~dex.views.secrets.redact_dsn`).

Once running, the server may go away and come back (a restart, a failover). A pooled
connection the server closed is noticed when the pool hands it out (:class:`LivenessCheck`)
and replaced, so a restart costs the callers a short wait, not one error per pooled connection;
a statement that was running when the server went away fails, and the engine's pollers back
off and try again. Each pooled session also carries server-side time limits
(:mod:`.sessions`) so that a stuck statement or
a client that stalls inside a transaction cannot hold row locks indefinitely.
"""

from __future__ import annotations

import ctypes
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg import pq
from psycopg_pool import ConnectionPool, PoolTimeout

from dex.adapters.postgres.sessions import session_settings
from dex.domain.errors import DexError
from dex.views.secrets import printable, redact_dsn, scrub, without_secrets

DEFAULT_CONNECT_TIMEOUT = 5  # seconds; libpq's own default is to wait forever


class DatabaseConnectionError(DexError, ConnectionError):
    """PostgreSQL cannot be reached with the given DSN (bad DSN, server down, auth failure)."""


class InvalidDsnError(DatabaseConnectionError, ValueError):
    """The DSN itself cannot be used (not text libpq can read); nothing was sent anywhere."""


def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a DSN (for error messages), never its password."""
    params = _parse(dsn)
    if params is None:
        return "<unparsable DSN>"
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = params.get("port")
    where = f"{host}:{port}" if port else host
    dbname = params.get("dbname")
    return printable(scrub(f"{where}/{dbname}" if dbname else where, dsn))


def _parse(dsn: str) -> dict[str, Any] | None:
    """The DSN's parameters, or None if libpq cannot parse it (its error may quote the DSN)."""
    if not isinstance(dsn, str) or not _clean(dsn):  # libpq would cut it at a NUL, or cannot take it
        return None
    try:
        return pg_conninfo.conninfo_to_dict(dsn)
    except (psycopg.ProgrammingError, UnicodeError):
        return None


def dsn_problem(dsn: object) -> str | None:
    """Why ``dsn`` is no DSN libpq can use, in words that never quote it; None if it is one.

    A NUL would end the string where libpq reads it (``user:pw\\0@host`` becomes a host
    named after the password), and a lone surrogate (a byte that is not UTF-8, as Python
    gives it from a command line or the environment) cannot be encoded for libpq at all:
    both are refused before libpq sees the string."""
    if not isinstance(dsn, str):
        return f"a DSN is a string, not {type(dsn).__name__}"
    if not dsn.strip():
        return "no PostgreSQL DSN given (e.g. postgresql://user:password@host:5432/dbname)"
    # redaction hides the password: if what is left is clean, the bad character is in it
    where = " (in the password)" if not _clean(dsn) and _clean(without_secrets(dsn)) else ""
    if "\x00" in dsn:
        return f"it contains a NUL character{where}"
    try:
        dsn.encode("utf-8")
    except UnicodeEncodeError:
        return f"it holds a byte that is not UTF-8{where}"
    try:
        params = pg_conninfo.conninfo_to_dict(dsn)
    except UnicodeError:
        return "a percent-encoded value in it is not UTF-8"
    except psycopg.ProgrammingError:
        # libpq's message quotes the DSN, which may hold a password: leave it out
        return "expected postgresql://user:password@host:port/dbname or key=value pairs"
    # libpq checks ports only when it connects; they are part of the DSN's syntax all the same
    for port in str(params.get("port") or "").split(","):
        port = port.strip()
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            return "its port is not a number from 1 to 65535"
    return None


def _clean(text: str) -> bool:
    """Whether ``text`` holds neither a NUL nor a lone surrogate."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def prepare_conninfo(dsn: str, connect_timeout: float | None) -> str:
    """The DSN with a ``connect_timeout`` (unless it sets one) and an application name;
    :class:`InvalidDsnError` (naming the problem, the DSN shown redacted) if it cannot be used."""
    problem = dsn_problem(dsn)
    if problem is not None:
        shown = f" {redact_dsn(dsn)}" if isinstance(dsn, str) and dsn.strip() else ""
        raise InvalidDsnError(f"invalid PostgreSQL DSN{shown}: {problem}")
    params = pg_conninfo.conninfo_to_dict(dsn)
    extra: dict[str, str] = {}
    if "connect_timeout" not in params:
        timeout = DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        extra["connect_timeout"] = str(max(1, round(timeout)))  # libpq takes whole seconds
    if "application_name" not in params:
        extra["application_name"] = "dex"
    return pg_conninfo.make_conninfo(dsn, **extra)


def connect(conninfo: str) -> psycopg.Connection:
    """One connection, or :class:`DatabaseConnectionError` naming the server (the driver's
    reason scrubbed of the password, and not chained: see the module's docstring)."""
    return connect_as(conninfo, psycopg.Connection)


C = TypeVar("C", bound="psycopg.Connection[Any]")


def connect_as(conninfo: str, cls: type[C], **kwargs: Any) -> C:
    """:func:`connect` with psycopg's ``connect`` of ``cls`` (a subclass of
    ``psycopg.Connection``), given ``kwargs``."""
    try:
        return cls.connect(conninfo, **kwargs)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        text = str(exc).strip()
        reason = text.splitlines()[0] if text else type(exc).__name__
    raise DatabaseConnectionError(
        f"cannot connect to PostgreSQL at {describe_dsn(conninfo)}: {scrub(reason, conninfo)}"
    )


class LivenessCheck:
    """The pool's check of a connection it is about to hand out; raises if it is unusable.

    An idle connection has nothing to read unless the server closed it (a restart, an idle
    timeout, an administrator) or sent a notice; only then is it pinged, so the common case
    costs one ``poll()`` on the socket, not a round trip. A dead connection rarely comes alone:
    after a restart every idle one is dead, and the pool, which tries the next one only after
    a growing pause (1 s, 2 s, 4 s, ...), would make a caller wait for each in turn. So the
    first dead one found makes the pool check all its idle connections at once and replace
    the dead ones.
    """

    def __init__(self) -> None:
        self.pool: ConnectionPool | None = None

    def __call__(self, conn: psycopg.Connection) -> None:
        if not (conn.closed or conn.broken or _readable(conn.pgconn.socket)):
            return
        try:
            ConnectionPool.check_connection(conn)
        except Exception:
            if self.pool is not None:
                self.pool.check()
            raise


def _readable(fd: int) -> bool:
    """Whether ``fd`` has something to read (or an error, or a hang-up), without waiting.

    Asked before every start on the kept connection, so it must not let go of the GIL:
    ``select.poll`` does, and under load the thread then waits to take the GIL back behind
    every other thread that wants it (a py-spy profile of the I/O batch: ~3 % of each start).
    libc's ``poll`` called through ``ctypes.PyDLL`` keeps the GIL; a timeout of 0 never blocks.
    """
    ready = poll_keeping_the_gil(fd, 0)
    if ready is not None:
        return ready
    if hasattr(select, "poll"):  # pragma: no cover - a libc without poll
        poller = select.poll()
        poller.register(fd, _POLL_EVENTS)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # pragma: no cover - platforms without poll()
    return bool(readable)


class _PollFd(ctypes.Structure):
    _fields_ = (("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short))


_POLL_EVENTS = getattr(select, "POLLIN", 1) | getattr(select, "POLLERR", 8) | getattr(select, "POLLHUP", 16)


def _gil_holding_poll() -> Callable[..., int] | None:
    """libc's ``poll`` as a function that keeps the GIL (``PyDLL``), or None where there is none."""
    if os.name != "posix":  # pragma: no cover - Windows has no poll()
        return None
    try:
        poll = ctypes.PyDLL(None).poll
    except (OSError, AttributeError):  # pragma: no cover - a libc without poll
        return None
    poll.argtypes = (ctypes.POINTER(_PollFd), ctypes.c_ulong, ctypes.c_int)
    poll.restype = ctypes.c_int
    return cast("Callable[..., int]", poll)


_POLL = _gil_holding_poll()


def poll_keeping_the_gil(fd: int, timeout_ms: int) -> bool | None:
    """Whether ``fd`` has something to read (or an error, or a hang-up) within ``timeout_ms``,
    asked of libc's ``poll`` without letting go of the GIL (so no other thread runs meanwhile:
    keep the timeout 0 outside probes); None where libc has no ``poll``. An error of ``poll``
    itself counts as readable: the caller's own read then says what it is."""
    if _POLL is None:  # pragma: no cover - a libc without poll
        return None
    ready = _PollFd(fd, _POLL_EVENTS, 0)
    return _POLL(ctypes.byref(ready), 1, timeout_ms) != 0


def open_pool(
    conninfo: str,
    *,
    min_size: int,
    max_size: int,
    timeout: float,
    name: str,
    wait_timeout: float = 30.0,
    configure: Callable[[psycopg.Connection], None] | None = None,
) -> ConnectionPool:
    """A pool of connections in autocommit mode: a single statement is a transaction of its
    own (no BEGIN and COMMIT round trips around it), and a ``conn.transaction()`` block is one
    transaction (psycopg sends BEGIN and COMMIT). Connections never change mode, so a checkout
    costs no mode switch either way.

    ``timeout`` bounds the wait for the first ``min_size`` connections when the pool opens,
    ``wait_timeout`` how long a caller later waits for a connection (``PoolTimeout`` after).
    """
    liveness = LivenessCheck()
    pool = ConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        configure=configure or session_settings(),
        check=liveness,
        open=False,
        name=name,
        timeout=wait_timeout,  # how long a caller waits for a free connection (e.g. while the server restarts)
        reconnect_timeout=60.0,
    )
    liveness.pool = pool
    try:
        pool.open(wait=True, timeout=timeout)
        return pool
    except PoolTimeout as exc:
        reason = scrub(str(exc), conninfo)
    pool.close()
    raise DatabaseConnectionError(f"cannot open a connection pool to PostgreSQL at {describe_dsn(conninfo)}: {reason}")


class KeptConnection:
    """One pooled connection kept out of the pool for the application's starts.

    A loop of ``start_workflow`` calls is what the throughput batch waits for. Through the pool
    each start paid a checkout and a return (~5 µs), and, as the pool hands out its idle
    connections in turn, a different session each time: a colder socket and backend (a start
    alone: 44 → 33 µs of client CPU, ~15 µs of wall time less, on one kept connection). So the
    adapter keeps one connection for starts. A caller that finds it busy (another thread is
    starting a run) takes one from the pool as before; one that finds it closed, broken or
    with something to read (the server closed it, or sent a notice) gives it back to the pool,
    which checks and replaces it, and takes another. The kept connection also goes back to the
    pool after ``keep_for`` seconds, so that the pool's own upkeep (``max_lifetime``) reaches it.
    """

    def __init__(
        self, pool: ConnectionPool, keep_for: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._pool = pool
        self._keep_for, self._clock = keep_for, clock
        self._conn: psycopg.Connection | None = None
        self._kept_at = 0.0
        self._lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        if not self._lock.acquire(blocking=False):
            with self._pool.connection() as pooled:  # another thread is starting a run
                yield pooled
            return
        try:
            conn = self._conn
            if conn is None or not usable(conn) or self._clock() - self._kept_at > self._keep_for:
                self._conn = None
                if conn is not None:
                    self._pool.putconn(conn)  # the pool discards a bad one, and recycles an old one
                conn = self._conn = self._pool.getconn()
                self._kept_at = self._clock()
            yield conn
        finally:
            self._lock.release()

    def release(self) -> None:
        """Give the kept connection back to the pool (before the pool closes)."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                self._pool.putconn(conn)


def usable(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """Open, healthy and idle with nothing to read (statements may bypass psycopg, so libpq's
    own status is asked, not ``conn.broken``)."""
    pgconn = conn.pgconn
    return (
        not conn.closed
        and pgconn.status == pq.ConnStatus.OK
        and pgconn.transaction_status == pq.TransactionStatus.IDLE
        and not _readable(pgconn.socket)
    )
