"""`dex schedules list|show|pause|resume|trigger|backfill|delete` (docs/reference/contract.md §10)."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta

import attrs
import pytest

import dex
from tests.cli.conftest import World, one_line_error, order

pytestmark = pytest.mark.postgres


def declare(world: World) -> None:
    world.engine.create_schedule(
        dex.Schedule("nightly", order, cron="0 3 * * *", timezone="Europe/Berlin", args=("nina",))
    )
    world.engine.create_schedule(dex.Schedule("often", order, every=timedelta(minutes=15), args=("olaf",)))


def test_list_and_show(world: World) -> None:
    declare(world)
    listed = world.invoke("schedules", "list")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "WORKFLOW", "WHEN", "STATUS", "NEXT", "FIRE", "LAST", "FIRE"]
    assert lines[1].startswith("nightly") and "cron '0 3 * * *' Europe/Berlin" in lines[1] and "ACTIVE" in lines[1]
    assert "2025-03-02T02:00:00" in lines[1]
    assert lines[2].startswith("often") and "every 15m" in lines[2]
    as_json = json.loads(world.invoke("schedules", "list", "--json").stdout)
    assert [s["name"] for s in as_json] == ["nightly", "often"] and as_json[1]["every"] == 900
    shown = world.invoke("schedules", "show", "nightly")
    assert shown.exit_code == 0 and "workflow:        cli-order" in shown.stdout
    assert json.loads(world.invoke("schedules", "show", "often", "--json").stdout)["overlap"] == "skip"


def test_pause_resume_trigger_backfill_delete(world: World) -> None:
    declare(world)
    paused = world.invoke("schedules", "pause", "often", "--note", "migration")
    assert paused.exit_code == 0 and paused.stdout == "paused schedule 'often'\n"
    info = world.engine.get_schedule("often")
    assert info.paused and info.note == "migration"
    assert world.invoke("schedules", "resume", "often").exit_code == 0
    assert not world.engine.get_schedule("often").paused
    triggered = world.invoke("schedules", "trigger", "nightly")
    assert triggered.exit_code == 0
    run = world.engine.get_run(triggered.stdout.strip())
    assert run.labels == {"dex.schedule": "nightly"} and run.instance_id.startswith("schedule:nightly:trigger:")
    filled = world.invoke(
        "schedules", "backfill", "nightly", "--start", "2025-02-01T00:00:00Z", "--end", "2025-02-04T00:00:00Z", "--json"
    )
    assert filled.exit_code == 0, filled.output
    run_ids = json.loads(filled.stdout)["run_ids"]
    assert [world.engine.get_run(r).instance_id for r in run_ids] == [
        f"schedule:nightly:2025-02-0{d}T02:00:00Z" for d in (1, 2, 3)
    ]
    refused = world.invoke("schedules", "delete", "often", input="n\n")
    assert refused.exit_code == 1 and refused.stderr.endswith("error: schedule 'often' not deleted\n")
    assert world.engine.get_schedule("often").name == "often"
    asked = world.invoke("schedules", "delete", "often", input="y\n")
    assert asked.exit_code == 0, asked.output
    deleted = world.invoke("schedules", "delete", "nightly", "--yes")
    assert deleted.exit_code == 0 and world.engine.list_schedules() == []


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("show", "ghost"), 1, "no schedule named 'ghost'"),
        (("pause", "ghost"), 1, "no schedule named"),
        (("delete", "ghost", "--yes"), 1, "no schedule named"),
        (("show", "bad name"), 2, "schedule name"),
        (("show", "n\udcff"), 2, "lone surrogate"),
        (("pause", "nightly", "--note", "a\x00b"), 2, "NUL"),
        (("backfill", "nightly", "--start", "yesterday", "--end", "2025-01-01"), 2, "ISO 8601"),
        (("backfill", "nightly", "--start", "2025-01-01", "--end", "2999-01-01"), 2, "future"),
        (("backfill", "nightly", "--end", "2025-01-01"), 2, "--start"),
    ],
)
def test_bad_input_is_one_line(world: World, args: tuple[str, ...], code: int, words: str) -> None:
    declare(world)
    result = world.invoke("schedules", *args)
    assert result.exit_code == code, result.output
    assert words in one_line_error(result)
    # and the schedules go on
    assert world.engine.get_schedule("nightly").next_fire_at is not None


def test_a_stored_schedule_whose_fires_cannot_be_computed_is_one_line_exit_1(world: World) -> None:
    """A definition an older dex stored (here through the store's own port) that today's bounds
    refuse: resume and backfill say why in one line, list and show still work, and the other
    schedules are managed as before."""
    declare(world)
    record = world.engine.store.get_schedule("often")
    assert record is not None
    world.engine.store.update_schedule(
        attrs.evolve(record.definition, every=timedelta(days=36_500_000)), record.next_fire_at, record.due_at
    )
    world.engine.pause_schedule("often")
    for args in (
        ("schedules", "resume", "often"),
        ("schedules", "backfill", "often", "--start", "2025-03-01T00:00:00Z", "--end", "2025-03-04T00:00:00Z"),
    ):
        result = world.invoke(*args)
        assert result.exit_code == 1, result.output
        assert "cannot be computed" in one_line_error(result) and "Traceback" not in result.output
    assert world.engine.list_runs(labels={"dex.schedule": "often"}) == []  # the backfill started nothing
    assert world.invoke("schedules", "show", "often").exit_code == 0
    assert world.invoke("schedules", "list").exit_code == 0
    assert world.invoke("schedules", "pause", "nightly").exit_code == 0
    resumed = world.invoke("schedules", "resume", "nightly")
    assert resumed.exit_code == 0, resumed.output
    triggered = world.invoke("schedules", "trigger", "nightly")
    assert triggered.exit_code == 0
    world.engine.drain()
    assert world.engine.get_run(triggered.stdout.strip()).status is not dex.RunStatus.FAILED


def test_the_dashboard_words_schedules_as_the_command_line_does(world: World) -> None:
    pytest.importorskip("starlette", reason="the dashboard needs the web extra")
    from dex.web import create_app
    from tests.web.conftest import client

    declare(world)
    world.engine.create_schedule(dex.Schedule("hourly", order, every=timedelta(hours=1), args=("hugo",)))
    assert world.invoke("schedules", "pause", "hourly", "--note", "migration").exit_code == 0
    listed = world.invoke("schedules", "list")
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "every 1h00m" in rows["hourly"] and "PAUSED" in rows["hourly"]
    assert "every 15m00s" in rows["often"] and "ACTIVE" in rows["often"]
    with client(create_app(world.engine)) as http:
        page = http.get("/schedules").text
    cells = {}  # schedule name -> the text of its row's cells (tags dropped, entities decoded)
    for row in page.split("<tr>")[1:]:
        texts = [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", cell)).split()) for cell in row.split("</td>")]
        if texts and texts[0] in ("nightly", "often", "hourly"):
            cells[texts[0]] = texts
    assert cells["nightly"][2] == "cron '0 3 * * *' Europe/Berlin"
    assert cells["often"][2:4] == ["every 15m00s", "ACTIVE"]
    assert cells["hourly"][2:4] == ["every 1h00m", "PAUSED migration"]
