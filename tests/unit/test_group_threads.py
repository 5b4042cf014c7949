"""The threads where transaction steps' groups run (dex.app.workflows.step_groups.GroupThreads): a group
stuck in a step's code no longer counts once it has run ``stall`` seconds, so the groups behind
it get threads of their own, up to ``spare`` beyond the pool's size; the pool is back to its
size once the stuck groups end."""

from __future__ import annotations

import threading
import time

from dex.app.workflows.step_groups import GroupThreads

WAIT = 10  # seconds a thread may take to start on a healthy machine; never reached when it works


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _job(ran: threading.Event, hold: threading.Event | None = None) -> object:
    def job() -> None:
        ran.set()
        if hold is not None:
            hold.wait(WAIT * 3)

    return job


def test_a_group_stuck_past_the_stall_no_longer_holds_the_next_ones() -> None:
    clock, stuck, release = Clock(), threading.Event(), threading.Event()
    groups = GroupThreads(1, stall=1.0, spare=1, monotonic=clock)
    try:
        assert groups.submit(_job(stuck, release))
        assert stuck.wait(WAIT)
        behind = threading.Event()
        assert groups.submit(_job(behind))  # the one thread is busy, and not stalled: it waits
        assert not behind.wait(0.2)
        clock.now = 5.0  # the first group has run past the stall: a thread of its own for the next
        assert behind.wait(WAIT)
        # at the most threads (one, and one spare), both stuck now: the next waits for one to end
        second, third = threading.Event(), threading.Event()
        assert groups.submit(_job(second, release))
        assert second.wait(WAIT)
        clock.now = 10.0
        assert groups.submit(_job(third))
        assert not third.wait(0.2)
        release.set()  # the stuck groups end
        assert third.wait(WAIT)
    finally:
        release.set()
        groups.close(time.monotonic() + WAIT)


def test_groups_under_way_are_waited_for_and_a_closed_pool_takes_no_more() -> None:
    groups = GroupThreads(2)
    ran = [threading.Event() for _ in range(5)]
    for event in ran:
        assert groups.submit(_job(event))
    groups.close(time.monotonic() + WAIT)
    assert all(event.is_set() for event in ran)
    assert not groups.submit(_job(threading.Event()))


def test_a_failing_group_does_not_end_its_thread() -> None:
    groups = GroupThreads(1)

    def fails() -> None:
        raise KeyboardInterrupt

    try:
        assert groups.submit(fails)
        after = threading.Event()
        assert groups.submit(_job(after))
        assert after.wait(WAIT)
    finally:
        groups.close(time.monotonic() + WAIT)
