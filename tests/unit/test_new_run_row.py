"""The start's statement takes its eighteen arguments from one record, by name
(``runs.NewRunRow``): every field is one parameter of the schema's ``create_run`` function,
sent in the function's order on both paths (libpq and psycopg's ``execute``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import attrs

from dex.adapters.postgres import direct, runs
from dex.adapters.postgres.schema import Statements


def _row() -> runs.NewRunRow:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return runs.NewRunRow(
        run_id="r", workflow_name="w", queue="q", instance_id=None, priority=3, concurrency_key="k",
        labels="{}", parent_run_id=None, created_at=now, history=b"\x01", message_kind="RunStarted",
        message=b"\x02", claim=True, owner="node", lease_until=now, workflow_names=["a", "b"], lock=7,
        schema="dex", code_version="v7",
    )  # fmt: skip


def test_every_field_is_one_parameter_and_params_follow_the_function_order() -> None:
    row = _row()
    fields = [field for field, _oid, _name in runs.PARAMETERS]
    assert sorted(fields) == sorted(f.name for f in attrs.fields(runs.NewRunRow))
    assert len(set(fields)) == len(fields) == 19
    assert row.params() == [getattr(row, field) for field in fields]


def test_both_paths_send_as_many_values_as_the_function_takes() -> None:
    statement = runs.create_run_statement(Statements("dex"))
    assert statement.query.count(b"$") == len(statement.types) == len(runs.PARAMETERS)
    assert len(re.findall(r"%[sb]::", runs._CREATE_RUN)) == len(runs.PARAMETERS)


def test_the_direct_path_encodes_each_value_by_its_parameter_type() -> None:
    statement = runs.create_run_statement(Statements("dex"))
    encoded = statement.encode(_row().params())
    assert encoded == [
        b"r", b"w", b"q", None, b"3", b"k", b"{}", None, b"2026-01-02T03:04:05+00:00", b"\x01",
        b"RunStarted", b"\x02", b"t", b"node", b"2026-01-02T03:04:05+00:00", b'{"a","b"}', b"7", b"dex", b"v7",
    ]  # fmt: skip
    assert direct.encode(direct.TEXT_ARRAY, None) is None
