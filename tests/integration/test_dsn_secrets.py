"""A DSN's password appears in no error, chained exception, traceback or log (issue 19, item 11).

psycopg's and libpq's messages may quote the connection string whole (an unparsable URI) or
echo what the server said; each case here fails a different way and checks every place the
password could leak: ``str``, ``repr``, the formatted traceback with its chain, the exception's
``__context__``/``__cause__`` objects themselves, the captured logs and the CLI's output.
A wrong password needs a server that asks for one (the test server trusts every local
connection), so a small fake server speaks just enough of the protocol to refuse it.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import traceback
from collections.abc import Callable, Iterator

import pytest

from dex.adapters.postgres import DatabaseConnectionError, PostgresAdapter, migrate
from tests.cli.conftest import invoke

pytestmark = pytest.mark.postgres

SECRET = "s3cr3t-XYZ"


def _refusing_server(message: Callable[[str], str]) -> Iterator[int]:
    """A server on 127.0.0.1 that asks for a cleartext password and refuses it with
    ``message(password)`` (SQLSTATE 28P01), as PostgreSQL refuses a wrong password."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def read_exactly(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError("client left")
            data += chunk
        return data

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            while True:  # SSL and GSS requests are declined with 'N'; then the startup message
                (length,) = struct.unpack("!i", read_exactly(conn, 4))
                body = read_exactly(conn, length - 4)
                if struct.unpack("!i", body[:4])[0] in (80877103, 80877104):
                    conn.sendall(b"N")
                    continue
                break
            conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
            kind = read_exactly(conn, 1)
            (length,) = struct.unpack("!i", read_exactly(conn, 4))
            password = read_exactly(conn, length - 4).rstrip(b"\0").decode()
            assert kind == b"p"
            fields = b"".join(
                code + value.encode() + b"\0"
                for code, value in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", "28P01"), (b"M", message(password)))
            )
            conn.sendall(b"E" + struct.pack("!i", 4 + len(fields) + 1) + fields + b"\0")

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_quietly, args=(serve, conn), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


def _quietly(serve: Callable[[socket.socket], None], conn: socket.socket) -> None:
    try:
        serve(conn)
    except (OSError, ConnectionError):
        pass


@pytest.fixture
def refusing_port() -> Iterator[int]:
    yield from _refusing_server(lambda _password: 'password authentication failed for user "app"')


@pytest.fixture
def echoing_port() -> Iterator[int]:
    """A hostile server whose refusal quotes the password it was sent."""
    yield from _refusing_server(lambda password: f"password {password} is wrong")


def _leaks(exc: BaseException) -> list[str]:
    """Where SECRET shows in ``exc``: its text, its repr, its traceback, its chain."""
    found = []
    if SECRET in str(exc):
        found.append("str")
    if SECRET in repr(exc):
        found.append("repr")
    if SECRET in "".join(traceback.format_exception(exc)):
        found.append("traceback")
    seen: BaseException | None = exc
    while seen is not None:
        chained = [c for c in (seen.__context__, seen.__cause__) if c is not None]
        if any(SECRET in str(c) or SECRET in repr(c) for c in chained):
            found.append(f"chained {[type(c).__name__ for c in chained]}")
        seen = chained[0] if chained else None
    return found


MALFORMED = {
    "bad port": f"postgresql://app:{SECRET}@127.0.0.1:notaport/db",
    "port out of range": f"postgresql://app:{SECRET}@127.0.0.1:99999/db",
    "bad option": f"postgresql://app:{SECRET}@127.0.0.1:5432/db?no_such_option=1",
    "bad pair": f"host=127.0.0.1 port=5432 user=app password={SECRET} dbname=db nonsense",
    "quoted pair": f"host=127.0.0.1 password='{SECRET}' port=x",
    "unclosed IPv6 host": f"postgresql://app:{SECRET}@[::1/db",
    "unknown host": f"postgresql://app:{SECRET}@no-such-host.invalid:5432/db",
    "nobody listening": f"postgresql://app:{SECRET}@127.0.0.1:1/db",
}


@pytest.mark.parametrize("dsn", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_bad_dsn_fails_without_showing_its_password(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DatabaseConnectionError) as caught:
        PostgresAdapter(dsn, connect_timeout=1)
    assert _leaks(caught.value) == []
    with pytest.raises(DatabaseConnectionError) as caught:
        migrate(dsn, "dex")  # the function that takes a DSN itself
    assert _leaks(caught.value) == []
    assert SECRET not in caplog.text


@pytest.mark.parametrize("port_fixture", ["refusing_port", "echoing_port"])
def test_a_wrong_password_fails_without_showing_it(
    port_fixture: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = request.getfixturevalue(port_fixture)
    dsn = f"postgresql://app:{SECRET}@127.0.0.1:{port}/db?sslmode=disable"
    with pytest.raises(DatabaseConnectionError, match=f"cannot connect to PostgreSQL at 127.0.0.1:{port}/db") as caught:
        PostgresAdapter(dsn, connect_timeout=2)
    assert "password" in str(caught.value)  # the server's reason is kept, scrubbed
    assert _leaks(caught.value) == []
    assert SECRET not in caplog.text


def test_the_cli_shows_no_password(refusing_port: int) -> None:
    for dsn in (*MALFORMED.values(), f"postgresql://app:{SECRET}@127.0.0.1:{refusing_port}/db?sslmode=disable"):
        result = invoke("--database-url", dsn, "migrate")
        assert (result.exit_code == 1 and "error: cannot connect" in result.output) or "error: invalid" in result.output
        assert SECRET not in result.output
