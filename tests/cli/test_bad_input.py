"""Bad values on the command line: one ``error:`` line and exit code 2, never a traceback.

Each case is a value that used to end in a traceback (OverflowError, RecursionError,
UnicodeEncodeError) or in a database error (exit code 1): an age past year 1, a limit or
capacity beyond the column's range, a NUL or a lone surrogate in any string (as bytes that are
not UTF-8 arrive from a shell), a payload nested too deeply or holding NaN. After each, a
healthy command still works and nothing was sent. Then: ``--json`` output is strict JSON even
for NaN and infinite results, and the top level's last resort for errors that get past the
parameter types.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

import dex
from dex.adapters.postgres import PostgresAdapter
from dex.cli import runs as runs_command
from tests.cli.conftest import Runs, World, one_line_error

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
NOT_UTF8 = b"\xff".decode("utf-8", "surrogateescape")  # what Python makes of the byte 0xff in argv
NOT_UTF8_TEXT = "is not valid UTF-8 text"
RUN = "{run}"  # replaced by a real run's id (bob's, which waits for an event)

CASES: list[tuple[str, list[str], str]] = [
    ("age-past-year-1", ["runs", "list", "--created-after", "99999999999d"], "further back than a date can go"),
    ("age-in-weeks-past-year-1", ["runs", "list", "--created-before", "9999999999w"], "further back"),
    (
        "limit-beyond-bigint",
        ["runs", "list", "--limit", "99999999999999999999"],
        "'--limit': 99999999999999999999 is not in the range 1<=x<=9223372036854775807",
    ),
    (
        "capacity-beyond-integer",
        ["queues", "capacity", "default", "3000000000"],
        "'CAPACITY': 3000000000 is not in the range 1<=x<=2147483647",
    ),
    ("label-value-not-utf8", ["runs", "list", "--label", f"team={NOT_UTF8}"], NOT_UTF8_TEXT),
    ("label-key-lone-surrogate", ["runs", "list", "--label", "\ud800=a"], NOT_UTF8_TEXT),
    ("label-nul", ["runs", "list", "--label", "team=a\x00b"], "contains a NUL character"),
    ("workflow-name-nul", ["runs", "list", "--workflow", "cli-order\x00"], "'--workflow': 'cli-order\\x00' contains"),
    ("instance-id-not-utf8", ["runs", "list", "--instance-id", f"order{NOT_UTF8}"], NOT_UTF8_TEXT),
    ("run-id-nul", ["runs", "show", "abc\x00"], "'RUN_ID': 'abc\\x00' contains a NUL character"),
    ("start-workflow-nul", ["runs", "start", "cli-order\x00", "--force"], "'WORKFLOW': 'cli-order\\x00' contains"),
    ("start-workflow-not-utf8", ["runs", "start", f"cli{NOT_UTF8}", "--force"], NOT_UTF8_TEXT),
    ("start-instance-id-nul", ["runs", "start", "cli-order", "--instance-id", "a\x00", "--force"], "'--instance-id'"),
    ("start-label-lone-surrogate", ["runs", "start", "cli-order", "--label", "k=\ud800", "--force"], NOT_UTF8_TEXT),
    ("run-id-not-utf8", ["runs", "cancel", f"abc{NOT_UTF8}"], NOT_UTF8_TEXT),
    ("reason-nul", ["runs", "cancel", RUN, "--reason", "because\x00"], "'--reason'"),
    ("event-run-id-lone-surrogate", ["events", "send", "\udc80", "packed"], NOT_UTF8_TEXT),
    ("event-id-nul", ["events", "send", RUN, "packed\x00"], "'EVENT_ID': 'packed\\x00' contains a NUL character"),
    ("event-id-not-utf8", ["events", "send", RUN, f"packed{NOT_UTF8}"], NOT_UTF8_TEXT),
    ("queue-name-nul", ["queues", "pause", "default\x00"], "'NAME': 'default\\x00' contains a NUL character"),
    ("queue-name-not-utf8", ["queues", "resume", f"default{NOT_UTF8}"], NOT_UTF8_TEXT),
    ("schema-not-utf8", ["runs", "list", "--schema", f"dex{NOT_UTF8}"], NOT_UTF8_TEXT),
    ("database-url-nul", ["runs", "list", "--database-url", "postgresql://h/db\x00"], "'--database-url'"),
    ("worker-target-nul", ["worker", "app\x00:engine"], "'MODULE:ENGINE'"),
    ("worker-stop-timeout-nan", ["worker", "--stop-timeout", "nan", "app:engine"], "is not a number of seconds"),
    ("worker-stop-timeout-huge", ["worker", "--stop-timeout", "1e308", "app:engine"], "1e+308 is not in the range"),
    ("worker-app-dir-nul", ["worker", "--app-dir", "dir\x00", "app:engine"], "'--app-dir': 'dir\\x00' contains a NUL"),
    ("payload-nested-100000-deep", ["events", "send", RUN, "packed", "--json", "[" * 100_000], "nested more than 100"),
    (
        "payload-nested-101-deep",
        ["events", "send", RUN, "packed", "--json", "[" * 101 + "]" * 101],
        "the payload is nested more than 100 levels deep",
    ),
    ("payload-nan", ["events", "send", RUN, "packed", "--json", '{"x": NaN}'], "NaN is not JSON"),
    ("payload-infinity", ["events", "send", RUN, "packed", "--json", "-Infinity"], "-Infinity is not JSON"),
    ("payload-number-out-of-range", ["events", "send", RUN, "packed", "--json", "1e999"], "1e999 is out of range"),
    ("payload-lone-surrogate", ["events", "send", RUN, "packed", "--json", '{"a": "\\ud800"}'], NOT_UTF8_TEXT),
    ("payload-key-lone-surrogate", ["events", "send", RUN, "packed", "--json", '{"\\udfff": 1}'], NOT_UTF8_TEXT),
]


def assert_usage_error(result: Result, expected: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    line = one_line_error(result)  # exactly one line, "error: ...", nothing on stdout
    assert result.exit_code == 2, result.stderr
    assert expected in line, line


def assert_healthy(runs: Runs) -> None:
    result = runs.world.invoke("runs", "list", "--workflow", "cli-order")
    assert result.exit_code == 0, result.stderr
    assert runs.ann in result.stdout and runs.bob in result.stdout


@pytest.mark.parametrize(("args", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_bad_value_is_one_line_and_exit_code_2(runs: Runs, args: list[str], expected: str) -> None:
    before = len(runs.world.engine.history(runs.bob))
    result = runs.world.invoke(*[arg.replace(RUN, runs.bob) for arg in args])
    assert_usage_error(result, expected)
    assert len(runs.world.engine.history(runs.bob)) == before  # nothing was sent
    assert runs.world.engine.get_run(runs.bob).status is dex.RunStatus.RUNNING
    assert_healthy(runs)


def test_bytes_that_are_not_utf8_on_a_real_command_line_are_a_usage_error(runs: Runs) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DEX_DATABASE_URL": runs.world.dsn}
    command = [sys.executable, "-m", "dex", "--schema", runs.world.schema, "runs", "list"]
    result = subprocess.run([*command, "--label", b"team=\xff\xfe"], env=env, capture_output=True, timeout=60)
    stderr = result.stderr.decode("utf-8", "backslashreplace")
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert stderr.count("\n") == 1 and stderr.startswith("error: Invalid value for '--label': 'team=\\udcff\\udcfe'")
    healthy = subprocess.run([*command, "--label", "team=a"], env=env, capture_output=True, timeout=60)
    assert healthy.returncode == 0, healthy.stderr
    assert runs.ann in healthy.stdout.decode()


def test_a_payload_100_levels_deep_with_nul_characters_is_sent(world: World) -> None:
    run_id = world.engine.start_workflow("cli-order", "dee")
    world.engine.drain()
    payload = "[" * 99 + '"a\\u0000b"' + "]" * 99  # the deepest allowed, a NUL is fine in a payload
    result = world.invoke("--json", "events", "send", run_id, "packed", "--json", payload)
    assert result.exit_code == 0, result.stderr
    sent = json.loads(result.stdout)["payload"]
    for _ in range(99):
        (sent,) = sent
    assert sent == "a\x00b"


@dex.workflow(name="cli-not-finite")
async def not_finite(ctx: dex.WorkflowContext) -> dict[str, Any]:
    ctx.set_status("counting")
    return {"nan": float("nan"), "up": float("inf"), "down": float("-inf"), "list": [1.5, float("nan")]}


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json_with_nan_and_infinities_as_strings(world: World) -> None:
    adapter = PostgresAdapter(world.dsn, schema=world.schema, clock=world.clock)
    try:
        engine = dex.Engine(adapter, workflows=[not_finite])
        run_id = engine.start_workflow(not_finite)
        engine.drain()
        assert engine.get_run(run_id).status is dex.RunStatus.COMPLETED
    finally:
        adapter.close()
    expected = {"nan": "NaN", "up": "Infinity", "down": "-Infinity", "list": [1.5, "NaN"]}

    shown = world.invoke("--json", "runs", "show", run_id)
    assert shown.exit_code == 0, shown.stderr
    assert strict_json(shown.stdout)["result"] == expected
    listed = world.invoke("--json", "runs", "list", "--workflow", "cli-not-finite")
    assert listed.exit_code == 0, listed.stderr
    assert [run["result"] for run in strict_json(listed.stdout)] == [expected]
    table = world.invoke("runs", "show", run_id)  # the text view shows the same
    assert table.exit_code == 0, table.stderr
    assert '"nan": "NaN"' in table.stdout


def _raising(exc: BaseException) -> Any:
    def open_engine() -> Any:
        raise exc

    return open_engine


@pytest.mark.parametrize(
    "exc",
    [ValueError("label value 'a\\x00' contains a NUL"), TypeError("labels must be str"), OverflowError("too big")],
    ids=["ValueError", "TypeError", "OverflowError"],
)
def test_a_value_dex_refuses_past_the_parameter_types_is_exit_code_2(
    runs: Runs, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    with monkeypatch.context() as patched:
        patched.setattr(runs_command, "open_engine", _raising(exc))
        result = runs.world.invoke("runs", "list")
    assert "Traceback" not in result.stderr
    assert one_line_error(result) == f"error: {exc}"
    assert result.exit_code == 2
    assert_healthy(runs)


def test_an_unexpected_error_is_one_line_and_exit_code_1_with_its_traceback_under_debug(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patched:
        patched.setattr(runs_command, "open_engine", _raising(RuntimeError("kaput\nsecond line")))
        result = runs.world.invoke("runs", "list")
        assert "Traceback" not in result.stderr
        assert one_line_error(result) == "error: internal error: RuntimeError: kaput (--debug shows the traceback)"
        assert result.exit_code == 1
        with pytest.raises(RuntimeError, match="kaput"):  # --debug: the exception (and traceback) goes on
            runs.world.invoke("--debug", "runs", "list")
        with pytest.raises(RuntimeError, match="kaput"):
            runs.world.invoke("runs", "list", env={"DEX_DEBUG": "1"})
    assert_healthy(runs)
