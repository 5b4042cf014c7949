"""A DSN's password or a token appears in no error, chained exception, traceback, repr or log.

psycopg's and libpq's messages may quote the connection string whole (an unparsable URI) or
echo what the server said; each case here fails a different way and checks every place the
password could leak: ``str``, ``repr``, the formatted traceback with its chain, the exception's
``__context__``/``__cause__`` objects themselves, the captured logs and the CLI's output.
DSNs that no driver can be handed (a byte that is not UTF-8, a NUL, a lone surrogate) are
refused before libpq sees them, as :class:`InvalidDsnError`, and by the command line as a usage
error (exit 2); each such test ends with a healthy connection or command.
A wrong password needs a server that asks for one (the test server trusts every local
connection), so a small fake server speaks just enough of the protocol to refuse it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

import dex
from dex.adapters.postgres import DatabaseConnectionError, PostgresAdapter, migrate
from dex.adapters.postgres.connection import InvalidDsnError
from dex.views.secrets import redact_dsn, scrub
from tests.cli.conftest import invoke, one_line_error
from tests.pg import fresh_schema, postgres_dsn

pytestmark = pytest.mark.postgres

SECRET = "s3cr3t-XYZ"
ROOT = Path(__file__).resolve().parents[2]


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
        assert SECRET not in result.output
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "Traceback" not in result.output, result.output
        line = errors[0]
        # a DSN libpq cannot read is the command line's fault (2); one it cannot connect with is 1
        assert (result.exit_code == 1 and "error: cannot connect" in line) or (
            result.exit_code == 2 and "is no PostgreSQL DSN" in line
        ), result.output


# DSNs that no driver can be handed: the secret next to a byte that is not UTF-8 (as Python
# reads it from argv or the environment: surrogateescape), a NUL, a lone surrogate
UNENCODABLE = {
    "non-utf8 byte in the password": os.fsdecode(f"postgresql://app:{SECRET}".encode() + b"\xff@127.0.0.1:1/db"),
    "non-utf8 byte in the host": os.fsdecode(f"postgresql://app:{SECRET}@127.0.0.".encode() + b"\xfe1/db"),
    "non-utf8 byte in a pair": os.fsdecode(f"host=127.0.0.1 password={SECRET}".encode() + b"\xff dbname=db"),
    "non-utf8 byte in a query password": os.fsdecode(f"postgresql://app@h/db?password={SECRET}".encode() + b"\xff"),
    "NUL in the password": f"postgresql://app:{SECRET}\x00@127.0.0.1:1/db",
    "NUL before the password": f"host=127.0.0.1\x00 password={SECRET}",
    "lone surrogate": f"postgresql://app:{SECRET}\ud800@127.0.0.1:1/db",
    "percent-encoded non-utf8": f"postgresql://app:{SECRET}%FF@127.0.0.1:1/db",
    "percent-encoded NUL": f"postgresql://app:{SECRET}%00@127.0.0.1:1/db",
    "unterminated quote": f"host=127.0.0.1 password='{SECRET}",
}


def _fits_the_environment(value: str) -> bool:
    """Whether an environment variable can hold ``value`` (no NUL; only surrogates that stand for bytes)."""
    try:
        return "\x00" not in value and bool(os.fsencode(value))
    except UnicodeError:
        return False


def _secure_dsn() -> str:
    """The test server's DSN with a password (the test server trusts local connections, so it
    is not checked, but every message and repr could still show it)."""
    return make_conninfo(postgres_dsn(), password=SECRET)


@pytest.mark.parametrize("dsn", UNENCODABLE.values(), ids=UNENCODABLE.keys())
def test_a_dsn_no_driver_can_take_is_a_connection_error_without_its_password(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(InvalidDsnError, match="invalid PostgreSQL DSN") as caught:
        PostgresAdapter(dsn, connect_timeout=1)
    assert isinstance(caught.value, DatabaseConnectionError)
    assert _leaks(caught.value) == []
    assert re.search(r"NUL|not UTF-8|expected postgresql://", str(caught.value)), str(caught.value)
    assert "***" in str(caught.value)  # the DSN is shown, redacted
    with pytest.raises(DatabaseConnectionError) as caught:
        migrate(dsn, "dex")
    assert _leaks(caught.value) == []
    assert SECRET not in caplog.text
    # the same process then connects with a good DSN, and its repr keeps the password out
    with fresh_schema(postgres_dsn(), prefix="dex_dsn") as schema:
        adapter = PostgresAdapter(_secure_dsn(), schema=schema, max_connections=2)
        try:
            assert SECRET not in repr(adapter) and "***" in repr(adapter)
            engine = dex.Engine(adapter, workflows=[_echo])
            run_id = engine.start_workflow(_echo, "ok")
            engine.drain()
            assert engine.wait(run_id, timeout=10) == "ok"
        finally:
            adapter.close()


@dex.workflow(name="dsn-secrets-echo")
async def _echo(ctx: dex.WorkflowContext, text: str) -> str:
    return text


def test_redaction_hides_every_spelling_of_the_password() -> None:
    for dsn in (*MALFORMED.values(), *UNENCODABLE.values(), _secure_dsn()):
        shown = redact_dsn(dsn)
        assert SECRET not in shown, shown
        assert shown.isprintable(), shown
    for dsn in (*MALFORMED.values(), _secure_dsn()):  # the password is SECRET itself
        assert scrub(f"driver said {SECRET} and {SECRET}", dsn) == "driver said *** and ***", dsn


@pytest.mark.parametrize("dsn", UNENCODABLE.values(), ids=UNENCODABLE.keys())
def test_the_cli_refuses_such_a_dsn_in_one_line_exit_2_without_the_password(dsn: str) -> None:
    ways: list[tuple[list[str], dict[str, str]]] = [
        (["--database-url", dsn, "runs", "list"], {}),
        (["runs", "list", f"--database-url={dsn}"], {}),
        (["demo", "--database-url", dsn], {}),
    ]
    if _fits_the_environment(dsn):
        ways.append((["runs", "list"], {"DEX_DATABASE_URL": dsn}))
    for args, env in ways:
        result = invoke(*args, env=env)
        assert result.exit_code == 2, result.output
        assert "is no PostgreSQL DSN" in one_line_error(result)
        assert SECRET not in result.output


def test_real_argv_and_environment_bytes_are_refused_without_the_password() -> None:
    """Through a real process: the byte reaches Python as the OS gives it, not as a test builds it."""
    bad = f"postgresql://app:{SECRET}".encode() + b"\xff@127.0.0.1:1/db"
    env = {**os.environb, b"PYTHONPATH": str(ROOT).encode()}
    env.pop(b"DEX_DATABASE_URL", None)
    by_argv = subprocess.run(
        [sys.executable.encode(), b"-m", b"dex", b"--database-url", bad, b"runs", b"list"], env=env, capture_output=True
    )
    by_env = subprocess.run(
        [sys.executable, "-m", "dex", "runs", "list"], env={**env, b"DEX_DATABASE_URL": bad}, capture_output=True
    )
    for done in (by_argv, by_env):
        assert done.returncode == 2, done
        assert SECRET.encode() not in done.stdout + done.stderr
        assert b"Traceback" not in done.stderr
        assert done.stderr.decode().count("\n") == 1 and b"not UTF-8 (in the password)" in done.stderr
    with fresh_schema(postgres_dsn(), prefix="dex_dsn") as schema:  # a healthy run of the command
        ok = subprocess.run(
            [sys.executable, "-m", "dex", "--schema", schema, "migrate", "--json"],
            env={**env, b"DEX_DATABASE_URL": _secure_dsn().encode()},
            capture_output=True,
        )
    assert ok.returncode == 0, ok.stderr
    assert SECRET.encode() not in ok.stdout + ok.stderr and b'"version"' in ok.stdout


@pytest.mark.parametrize(
    "token",
    [f"{SECRET}\udcff", f"{SECRET}\x00", f"{SECRET}\ud800", f" {SECRET}", f"{SECRET}\n"],
    ids=["non-utf8", "nul", "surrogate", "spaced", "newline"],
)
def test_dex_web_never_shows_a_refused_token(token: str) -> None:
    ways: list[tuple[list[str], dict[str, str]]] = [(["web", "--token", token], {})]
    if _fits_the_environment(token):
        ways.append((["web"], {"DEX_WEB_TOKEN": token}))
    for args, env in ways:
        result = invoke(*args, env={"DEX_DATABASE_URL": "postgresql://nowhere/x", **env})
        assert result.exit_code == 2, result.output
        one_line_error(result)
        assert SECRET not in result.output


def test_no_error_line_shows_a_secret_whatever_path_it_took() -> None:
    """A secret given on the command line is scrubbed from every error line, also ones no
    parameter type wrote (here click's own, quoting a stray argument)."""
    result = invoke("--database-url", _secure_dsn(), "runs", "list", SECRET, env={"DEX_WEB_TOKEN": "tok-" + SECRET})
    assert result.exit_code == 2
    assert SECRET not in one_line_error(result)


@pytest.mark.parametrize("token", [f"{SECRET}\udcff", f"{SECRET}\x00", f" {SECRET}", f"{SECRET}\n", ""])
def test_the_grpc_server_refuses_a_bad_token_without_showing_it(token: str) -> None:
    pytest.importorskip("grpc")
    from dex.adapters.memory import InMemoryAdapter
    from dex.remote import ActivityTaskService
    from dex.remote.grpc_server import serve_grpc

    service = ActivityTaskService(dex.Engine(InMemoryAdapter()))
    with pytest.raises(ValueError, match="non-empty printable string") as caught:
        serve_grpc(service, "127.0.0.1", 0, token=token)
    assert _leaks(caught.value) == [] and (not token or token not in repr(caught.value))
    server = serve_grpc(service, "127.0.0.1", 0, token="tok-" + SECRET)  # a good token serves
    try:
        assert server.port > 0
    finally:
        server.stop(grace=None)
