"""An ended run's page reads only what it shows, on both adapters: the history's bounds, the
page's events, its first event, a few events after the page, and its activity steps' attempts
and outcomes; never the whole history. Each page shows what it showed when it read the whole
history, and its pager is the one the whole history gives."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import dex
from dex.domain import events as ev
from dex.web import create_app, run_view
from dex.web.run_view import HISTORY_PAGE, history_page, pager_of
from tests.web.conftest import ACTIVITIES, WORKFLOWS, charge, client

STEPS = 300  # four events each: three pages


@dex.workflow(name="web-bounded")
async def long_run(ctx: dex.WorkflowContext, n: int) -> int:
    for i in range(n):
        await ctx.activity(charge, i)
    return n


def outcomes(page: str) -> list[tuple[int, str]]:
    """The timeline table's rows: (sequence number, outcome)."""
    table = page.split('class="steps"', 1)[1].split("</table>", 1)[0]
    return [(int(seq), outcome) for seq, outcome in re.findall(r"<tr><td>(\d+)</td>.*?outcome-([\w-]+)", table)]


def statuses(page: str) -> set[str]:
    table = page.split('id="attempts"', 1)[1].split("</table>", 1)[0]
    return set(re.findall(r'class="outcome-(\w+)"', table))


@pytest.mark.parametrize("following", [run_view.FOLLOWING, 1])
def test_an_ended_run_is_paged_without_reading_its_whole_history(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch, following: int
) -> None:
    engine = make_engine([*WORKFLOWS, long_run], ACTIVITIES)
    run_id = engine.start_workflow(long_run, STEPS)
    engine.drain()
    seqs = [item.sequence_number for item in engine.store.load_history(run_id)]

    def whole(run_id: str) -> Any:
        raise AssertionError("the page read the whole history")

    monkeypatch.setattr(engine.store, "load_history", whole)
    monkeypatch.setattr(run_view, "FOLLOWING", following)  # 1: outcomes past it are looked for further
    with client(create_app(engine)) as http:
        shown = 0
        for start in range(seqs[0], seqs[-1] + 1, HISTORY_PAGE):
            page = http.get(f"/runs/{run_id}?from={start}")
            assert page.status_code == 200, page.text
            rows = outcomes(page.text)
            assert rows and all(start <= seq < start + HISTORY_PAGE for seq, _ in rows)
            assert {outcome for _, outcome in rows} == {"completed"}
            assert statuses(page.text) == {"completed"}
            shown += len(rows)
        assert shown == STEPS  # every step once, on the page that scheduled it
        first = http.get(f"/runs/{run_id}").text
        assert '<pre class="payload">300</pre>' in first  # the input, from the first event


def test_the_pager_by_arithmetic_is_the_pager_of_the_whole_history() -> None:
    for first_seq, last_seq in ((1, 1), (1, 499), (1, 500), (1, 501), (7, 1206), (40, 2039)):
        seqs = list(range(first_seq, last_seq + 1))
        for start in (None, 0, 1, first_seq, first_seq + 499, first_seq + 500, last_seq, last_seq + 999):
            history = [_event(seq) for seq in seqs]
            assert pager_of(first_seq, last_seq, start) == history_page(history, start)[1], (first_seq, last_seq, start)


def _event(seq: int) -> ev.HistoryEvent:
    return ev.HistoryEvent(
        sequence_number=seq, timestamp=datetime(2025, 1, 1, tzinfo=UTC), event=ev.WorkflowTaskStarted()
    )


@dex.workflow(name="web-late-timer")
async def late_timer(ctx: dex.WorkflowContext, n: int) -> int:
    # the timer and the activities are scheduled on the first page; the timer fires after them all
    await ctx.gather(ctx.sleep(timedelta(hours=1)), *(ctx.activity(charge, i) for i in range(n)))
    return n


@pytest.mark.parametrize(("following", "shown"), [(run_view.FOLLOWING, "fired"), (1, run_view.NOT_READ)])
def test_a_timer_that_ends_past_the_events_read_says_so(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch, following: int, shown: str
) -> None:
    engine = make_engine([*WORKFLOWS, late_timer], ACTIVITIES)
    run_id = engine.start_workflow(late_timer, 600)
    engine.drain()
    history = engine.store.load_history(run_id)
    (timer,) = [item.sequence_number for item in history if isinstance(item.event, ev.TimerCreated)]
    (fired,) = [item.sequence_number for item in history if isinstance(item.event, ev.TimerElapsed)]
    assert timer <= HISTORY_PAGE < fired - 1  # on the first page, its end well after it
    monkeypatch.setattr(run_view, "FOLLOWING", following)
    with client(create_app(engine)) as http:
        page = http.get(f"/runs/{run_id}").text
    rows = dict(outcomes(page))
    assert rows[timer] == shown
    assert {outcome for seq, outcome in rows.items() if seq != timer} == {"completed"}  # found further on
