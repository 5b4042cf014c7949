"""Which database a command uses, `dex migrate`, and the errors that come before any command runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from dex.adapters.postgres import LATEST_VERSION
from tests.cli.conftest import invoke, one_line_error
from tests.pg import fresh_schema

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "postgresql://dex:s3cret@127.0.0.1:1/dex"


@pytest.mark.parametrize(
    "command", [["runs", "list"], ["runs", "show", "x"], ["queues", "list"], ["migrate"], ["events", "send", "x", "e"]]
)
def test_an_unreachable_database_is_a_fast_one_line_error(command: list[str]) -> None:
    began = time.monotonic()
    result = invoke("--database-url", UNREACHABLE, *command)
    assert time.monotonic() - began < 5
    assert result.exit_code == 1
    line = one_line_error(result) if command != ["migrate"] else result.stderr.splitlines()[-1]
    assert line.startswith("error: cannot connect to PostgreSQL at 127.0.0.1:1/dex: ")
    assert "s3cret" not in result.output


def test_a_malformed_url_is_a_one_line_error() -> None:
    result = invoke("runs", "list", env={"DEX_DATABASE_URL": "postgresql://dex:pw-s3cret@[not a host"})
    assert result.exit_code == 2  # the command line's fault: nothing was sent
    line = one_line_error(result)
    assert line.startswith(
        "error: Invalid value for '--database-url': postgresql://dex:***@[not a host is no PostgreSQL DSN"
    )
    assert "s3cret" not in line


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        (
            "postgresql://dex:pw-s3cret@127.0.0.1:1/dex?sslmode=bogus",
            "its sslmode is 'bogus', not one of disable, allow, prefer, require, verify-ca, verify-full",
        ),
        ("host=127.0.0.1 port=1 password=pw-s3cret connect_timeout=soon", "its connect_timeout is 'soon', not a whole"),
        ("postgresql://dex:pw-s3cret@127.0.0.1:1/dex?target_session_attrs=writable", "its target_session_attrs is"),
        ("postgresql://dex:pw-s3cret@127.0.0.1:1/dex?keepalives_idle=1m", "its keepalives_idle is '1m'"),
    ],
)
@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_url_with_a_setting_libpq_would_refuse_is_a_usage_error(dsn: str, says: str, given: str) -> None:
    """libpq checks these settings only when it connects (exit code 1, a "database error"); they
    are wrong on the URL's face, and refused before anything is sent, as any bad URL is."""
    if given == "option":
        result = invoke("runs", "list", "--database-url", dsn)
    else:
        result = invoke("runs", "list", env={"DEX_DATABASE_URL": dsn})
    assert result.exit_code == 2, result.stderr
    line = one_line_error(result)
    assert line.startswith("error: Invalid value for '--database-url': ") and says in line, line
    assert "s3cret" not in line


def test_a_url_with_settings_libpq_accepts_gets_past_the_check() -> None:
    dsn = "postgresql://dex:pw-s3cret@127.0.0.1:1/dex?sslmode=disable&connect_timeout=2&keepalives=1"
    result = invoke("runs", "list", "--database-url", dsn)
    assert result.exit_code == 1  # refused by the server that is not there, not by the check
    assert one_line_error(result).startswith("error: cannot connect to PostgreSQL at 127.0.0.1:1/dex: ")


def test_without_a_url_only_an_existing_embedded_server_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("runs", "list", env={"DEX_DATABASE_URL": None})
    assert result.exit_code == 1
    assert one_line_error(result) == "error: no database configured: set DEX_DATABASE_URL or pass --database-url"
    assert not (tmp_path / ".dex-data").exists()  # inspecting runs never creates a server


@pytest.mark.postgres
def test_options_after_the_command_win_over_the_group_and_the_environment(pg_dsn: str) -> None:
    with fresh_schema(pg_dsn, prefix="dex_cli") as schema:
        assert invoke("--database-url", pg_dsn, "migrate", "--schema", schema).exit_code == 0
        result = invoke(
            "runs", "list", "--database-url", pg_dsn, "--schema", schema, env={"DEX_DATABASE_URL": UNREACHABLE}
        )
        assert result.exit_code == 0, result.output
        assert result.stderr == "no runs match\n"
        refused = invoke("--database-url", pg_dsn, "--schema", schema, "runs", "list", "--database-url", UNREACHABLE)
        assert refused.exit_code == 1


@pytest.mark.postgres
def test_migrate_creates_the_schema_and_reports_progress(pg_dsn: str) -> None:
    with fresh_schema(pg_dsn, prefix="dex_cli") as schema:
        env = {"DEX_DATABASE_URL": pg_dsn}
        first = invoke("migrate", "--schema", schema, env=env)
        assert first.exit_code == 0, first.output
        assert first.stderr.splitlines()[0].startswith("connecting to PostgreSQL at ")
        assert first.stderr.splitlines()[1] == f"upgrading schema '{schema}' from version 0 to {LATEST_VERSION} ..."
        assert first.stdout.startswith(f"schema '{schema}' is at version {LATEST_VERSION} (was 0; took ")
        second = invoke("migrate", "--schema", schema, env=env)
        assert second.stdout == f"schema '{schema}' is at version {LATEST_VERSION}: nothing to do\n"
        as_json = invoke("--json", "migrate", "--schema", schema, env=env)
        assert json.loads(as_json.stdout) == {
            "schema": schema,
            "previous_version": LATEST_VERSION,
            "version": LATEST_VERSION,
        }
        listed = invoke("queues", "list", "--schema", schema, "--json", env=env)
        assert listed.exit_code == 0 and json.loads(listed.stdout) == []


@pytest.mark.postgres
def test_commands_do_not_migrate_a_missing_or_old_schema(pg_dsn: str) -> None:
    with fresh_schema(pg_dsn, prefix="dex_cli") as schema:
        env = {"DEX_DATABASE_URL": pg_dsn}
        missing = invoke("runs", "list", "--schema", schema, env=env)
        assert missing.exit_code == 1
        assert f"there is no dex schema '{schema}' at " in one_line_error(missing)
        assert "run 'dex migrate' first" in missing.stderr
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone() is None
        assert invoke("migrate", "--schema", schema, env=env).exit_code == 0
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{schema}".schema_version (version) VALUES (99)')
        newer = invoke("runs", "list", "--schema", schema, env=env)
        assert newer.exit_code == 1
        assert f"is at version 99, newer than this dex knows ({LATEST_VERSION}): upgrade dex" in one_line_error(newer)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runs", "show"], "error: Missing argument 'RUN_ID'. (see 'dex runs show --help')"),
        (["runs", "xyzzy", "x"], "error: No such command 'xyzzy'. (see 'dex runs --help')"),
        (["--schema", "", "runs", "list"], "error: Invalid value for '--schema': schema must be a non-empty str"),
        (["worker", "no-colon"], "error: Invalid value for 'TARGET': 'no-colon' is not MODULE:ENGINE"),
    ],
)
def test_usage_errors_exit_2_in_one_line(args: list[str], message: str) -> None:
    result = invoke(*args, env={"DEX_DATABASE_URL": UNREACHABLE})
    assert result.exit_code == 2
    assert one_line_error(result).startswith(message)


def test_without_a_command_dex_prints_its_help() -> None:
    result = invoke()
    assert result.exit_code == 2
    assert "Usage: dex [OPTIONS] COMMAND [ARGS]..." in result.stderr
    for command in ("demo", "events", "migrate", "queues", "runs", "worker"):
        assert f"  {command} " in result.stderr


def test_python_dash_m_dex_is_the_same_command() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DEX_DATABASE_URL": UNREACHABLE}
    done = subprocess.run(
        [sys.executable, "-m", "dex", "runs", "show", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("error: cannot connect to PostgreSQL at 127.0.0.1:1/dex")
    assert len(done.stderr.splitlines()) == 1
    version = subprocess.run(
        [sys.executable, "-m", "dex", "--version"], env=env, capture_output=True, text=True, check=False
    )
    assert version.returncode == 0 and version.stdout.startswith("dex, version ")


def test_an_empty_database_url_means_none_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--database-url ""`` (a script's unset variable) is no DSN to refuse: as before, it is
    as if none was given; one of spaces only is refused in one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    result = invoke("--database-url", "", "runs", "list", env={"DEX_DATABASE_URL": None})
    assert result.exit_code == 1
    assert one_line_error(result) == "error: no database configured: set DEX_DATABASE_URL or pass --database-url"
    blank = invoke("--database-url", "  ", "runs", "list")
    assert blank.exit_code == 2 and "is no PostgreSQL DSN: no PostgreSQL DSN given" in one_line_error(blank)
