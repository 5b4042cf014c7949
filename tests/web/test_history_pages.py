"""A long history, a page at a time, on both adapters: the run page shows 500 events and the
steps scheduled among them, with links to the first, previous, next and last page; the JSON
API pages with ``limit`` and ``after``. Bad paging parameters are 400s that name them, and a
healthy run completes afterwards."""

from __future__ import annotations

import re
from typing import Any

import pytest

import dex
from dex.web import create_app
from dex.web.run_view import HISTORY_PAGE, history_page
from tests.web.conftest import ACTIVITIES, WORKFLOWS, charge, checkout, client

STEPS = 300  # activities: four events each, so 1,200-odd events, three pages


@dex.workflow(name="web-long")
async def long_run(ctx: dex.WorkflowContext, n: int) -> int:
    for i in range(n):
        await ctx.activity(charge, i)
    return n


@dex.workflow(name="web-again")
async def again(ctx: dex.WorkflowContext, n: int) -> int:
    for i in range(5):
        await ctx.activity(charge, i)
    if n > 0:
        ctx.continue_as_new(n - 1)
    return n


def history_rows(page: str) -> list[int]:
    """The sequence numbers of the rows of the page's history table."""
    table = page.split('id="history"', 1)[1].split("</table>", 1)[0]
    return [int(seq) for seq in re.findall(r"<tr><td>(\d+)</td>", table)]


def step_rows(page: str) -> list[int]:
    """The sequence numbers of the rows of the page's steps table (the timeline's)."""
    if 'class="steps"' not in page:
        return []
    table = page.split('class="steps"', 1)[1].split("</table>", 1)[0]
    return [int(seq) for seq in re.findall(r"<tr><td>(\d+)</td>", table)]


def link(page: str, name: str) -> str | None:
    found = re.search(rf'href="([^"]+)" id="history-{name}"', page)
    return found.group(1).replace("&amp;", "&") if found else None


@pytest.fixture
def long_engine(make_engine: Any) -> tuple[dex.Engine, str, list[int]]:
    engine = make_engine([*WORKFLOWS, long_run], ACTIVITIES)
    run_id = engine.start_workflow(long_run, STEPS)
    engine.drain()
    assert engine.get_run(run_id).result == STEPS
    seqs = [item.sequence_number for item in engine.store.load_history(run_id)]
    assert len(seqs) > 2 * HISTORY_PAGE  # three pages at least: first, middle, last
    return engine, run_id, seqs


def test_the_run_page_walks_a_long_history_a_page_at_a_time(long_engine: Any) -> None:
    engine, run_id, seqs = long_engine
    with client(create_app(engine)) as http:
        page = http.get(f"/runs/{run_id}").text
        assert history_rows(page) == seqs[:HISTORY_PAGE]
        assert f"Events {seqs[0]}–{seqs[HISTORY_PAGE - 1]} of {len(seqs)}" in page
        assert link(page, "first") is None and link(page, "previous") is None
        # the timeline holds the steps scheduled among the events shown, not the whole run's
        steps = step_rows(page)
        assert steps and all(seqs[0] <= s <= seqs[HISTORY_PAGE - 1] for s in steps)
        assert len(steps) < STEPS
        seen, pages = list(history_rows(page)), 1
        while (following := link(page, "next")) is not None:
            page = http.get(following).text
            rows = history_rows(page)
            assert rows and rows[0] == seen[-1] + 1  # the next events, none skipped, none twice
            seen += rows
            pages += 1
            assert link(page, "first") is not None and link(page, "previous") is not None
        assert seen == seqs and pages == -(-len(seqs) // HISTORY_PAGE)
        assert link(page, "last") is None  # the last page links to no last page
        # and back: previous from the last page, first from anywhere
        previous = http.get(link(page, "previous") or "").text
        assert history_rows(previous) == seqs[(pages - 2) * HISTORY_PAGE : (pages - 1) * HISTORY_PAGE]
        assert history_rows(http.get(link(previous, "first") or "").text) == seqs[:HISTORY_PAGE]
        assert history_rows(http.get(link(previous, "last") or "").text) == seqs[(pages - 1) * HISTORY_PAGE :]


def test_from_names_the_page_that_holds_that_event(long_engine: Any) -> None:
    engine, run_id, seqs = long_engine
    with client(create_app(engine)) as http:
        middle = seqs[HISTORY_PAGE + 17]  # on the second page, not its first event
        assert history_rows(http.get(f"/runs/{run_id}?from={middle}").text) == seqs[HISTORY_PAGE : 2 * HISTORY_PAGE]
        assert history_rows(http.get(f"/runs/{run_id}?from=0").text) == seqs[:HISTORY_PAGE]
        last_page = (len(seqs) - 1) // HISTORY_PAGE * HISTORY_PAGE
        beyond = http.get(f"/runs/{run_id}?from={seqs[-1] + 1000}")  # past the end: the last page
        assert beyond.status_code == 200 and history_rows(beyond.text) == seqs[last_page:]


def test_a_short_history_is_one_page_without_a_pager(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(checkout, 5)
    engine.drain()
    page = http.get(f"/runs/{run_id}").text
    seqs = [item.sequence_number for item in engine.store.load_history(run_id)]
    assert history_rows(page) == seqs and 'id="history-pager"' not in page and 'id="timeline-note"' not in page
    assert step_rows(page)  # its one activity, on the timeline as before


def test_the_api_pages_a_history_with_limit_and_after(long_engine: Any) -> None:
    engine, run_id, seqs = long_engine
    with client(create_app(engine)) as http:
        whole = http.get(f"/v1/runs/{run_id}/history").json()
        assert [e["sequence_number"] for e in whole["events"]] == seqs and whole["next_after"] is None
        gathered: list[dict[str, Any]] = []
        after: int | None = None
        while True:
            query = f"limit=400&after={after}" if after is not None else "limit=400"
            body = http.get(f"/v1/runs/{run_id}/history?{query}").json()
            assert 0 < len(body["events"]) <= 400
            gathered += body["events"]
            after = body["next_after"]
            if after is None:
                break
            assert after == body["events"][-1]["sequence_number"]
        assert gathered == whole["events"]
        tail = http.get(f"/v1/runs/{run_id}/history?after={seqs[-3]}").json()
        assert [e["sequence_number"] for e in tail["events"]] == seqs[-2:] and tail["next_after"] is None
        exact = http.get(f"/v1/runs/{run_id}/history?limit={len(seqs)}").json()
        assert len(exact["events"]) == len(seqs) and exact["next_after"] is None  # nothing follows
        assert http.get(f"/v1/runs/{run_id}/history?after={seqs[-1]}").json() == {"events": [], "next_after": None}
        described = http.get("/v1/openapi.json").json()["paths"]["/v1/runs/{run_id}/history"]["get"]
        assert {p["name"] for p in described["parameters"]} >= {"run_id", "after", "limit"}


def test_the_pages_of_a_continued_run_start_at_its_first_stored_event(make_engine: Any) -> None:
    engine = make_engine([*WORKFLOWS, again], ACTIVITIES)
    run_id = engine.start_workflow(again, 2)
    engine.drain()
    whole = [item.sequence_number for item in engine.store.load_history(run_id)]
    assert whole[0] > 1  # the last generation numbers on from the one before
    with client(create_app(engine)) as http:
        gathered: list[int] = []
        query = "limit=3"
        while True:
            body = http.get(f"/v1/runs/{run_id}/history?{query}").json()
            gathered += [e["sequence_number"] for e in body["events"]]
            if body["next_after"] is None:
                break
            query = f"limit=3&after={body['next_after']}"
        assert gathered == whole
        page = http.get(f"/runs/{run_id}?from=1").text  # before its first event: the first page
        assert history_rows(page) == whole[:HISTORY_PAGE]
        assert http.get("/v1/runs/nope/history?limit=5").status_code == 404


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("from=-1", "from"),
        ("from=abc", "from"),
        ("from=1%00", "from"),
        ("from=%ED%A0%80", "from"),
        ("from=" + "9" * 50, "from"),
        ("from=" + "9" * 20, "from"),  # beyond a bigint
    ],
)
def test_a_bad_from_is_a_400_naming_it(engine: dex.Engine, http: Any, query: str, named: str) -> None:
    run_id = engine.start_workflow(checkout, 2)
    engine.drain()
    response = http.get(f"/runs/{run_id}?{query}")
    assert response.status_code == 400 and named in response.text
    assert "Traceback" not in response.text
    healthy_page_and_run(engine, http)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=x", "limit"),
        ("limit=5%00", "limit"),
        ("limit=%ED%A0%80", "limit"),
        ("after=-5", "after"),
        ("after=1.5", "after"),
        ("after=1%00", "after"),
        ("after=" + "1" * 60, "after"),
    ],
)
def test_bad_paging_parameters_of_the_api_are_400s_naming_them(
    engine: dex.Engine, http: Any, query: str, named: str
) -> None:
    run_id = engine.start_workflow(checkout, 2)
    engine.drain()
    response = http.get(f"/v1/runs/{run_id}/history?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert named in error["message"], error
    healthy_page_and_run(engine, http)


def test_history_page_cuts_pages_at_multiples_of_its_size() -> None:
    class Item:
        def __init__(self, seq: int) -> None:
            self.sequence_number = seq

    history: Any = [Item(seq) for seq in range(7, 7 + 23)]  # a continued run numbers on: 7..29
    index, pager = history_page(history, 15, size=10)
    assert (index, pager.first_seq, pager.last_seq) == (0, 7, 16)
    assert (pager.first, pager.previous, pager.next, pager.last) == (None, None, 17, 27)
    index, pager = history_page(history, 18, size=10)
    assert (index, pager.first_seq, pager.last_seq, pager.first, pager.previous) == (10, 17, 26, 7, 7)
    index, pager = history_page(history, 1_000, size=10)
    assert (index, pager.first_seq, pager.last_seq, pager.next, pager.last) == (20, 27, 29, None, None)
    assert not history_page(history[:10], None, size=10)[1].paged
    assert history_page([], 5)[1].total == 0


def healthy_page_and_run(engine: dex.Engine, http: Any) -> None:
    run_id = engine.start_workflow(checkout, 9)
    engine.drain()
    assert http.get(f"/runs/{run_id}").status_code == 200
    assert http.get(f"/v1/runs/{run_id}/history?limit=2").json()["next_after"] is not None
    assert engine.get_run(run_id).status.value == "COMPLETED"
