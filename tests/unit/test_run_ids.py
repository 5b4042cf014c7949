"""Run ids are version-7 UUIDs: time-ordered across milliseconds, unique within one."""

from __future__ import annotations

import uuid

from dex.app.ids import new_run_id


def test_a_run_id_is_a_version_7_uuid_string() -> None:
    run_id = new_run_id()
    parsed = uuid.UUID(run_id)
    assert str(parsed) == run_id
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122


def test_run_ids_sort_by_their_creation_millisecond() -> None:
    base = 1_795_000_000_000 * 1_000_000  # nanoseconds
    ids = [new_run_id(base + step * 1_000_000) for step in range(0, 2000, 7)]
    assert ids == sorted(ids)
    assert uuid.UUID(ids[0]).int >> 80 == 1_795_000_000_000  # the leading 48 bits are the milliseconds


def test_run_ids_made_in_one_millisecond_differ() -> None:
    ids = {new_run_id(1_795_000_000_000_000_000) for _ in range(10_000)}
    assert len(ids) == 10_000
