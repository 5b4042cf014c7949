"""The watcher of transaction steps' attempts (dex/adapters/postgres/overruns.py), without a
database: watches end in deadline order whatever their limits, a watch stopped in time never
fires and is forgotten at once, and a watch that fails does not end the others."""

from __future__ import annotations

import threading
import time

from dex.adapters.postgres.overruns import Overrun, Watcher


class Probe(Overrun):
    """A watch whose firing is recorded instead of ending a session."""

    def __init__(self, name: str, limit: float, fired: list[str], raises: bool = False) -> None:
        self.name, self.limit, self._fired, self._raises = name, limit, fired, raises
        self.deadline = time.monotonic() + limit
        self.done = threading.Event()

    def fire(self) -> None:
        self._fired.append(self.name)
        self.done.set()
        if self._raises:
            raise RuntimeError("a bug in a watch")


def test_watches_fire_in_deadline_order_and_a_stopped_one_never() -> None:
    watcher, fired = Watcher(), []
    slow, stopped, quick, failing = (
        Probe("slow", 0.4, fired),
        Probe("stopped", 0.1, fired),
        Probe("quick", 0.2, fired),
        Probe("failing", 0.05, fired, raises=True),
    )
    for probe in (slow, stopped, quick, failing):
        watcher.add(probe)
    watcher.remove(stopped)
    assert slow.done.wait(5)
    assert fired == ["failing", "quick", "slow"]  # the failing watch did not end the others
    assert not stopped.done.is_set()


def test_a_watch_stopped_in_time_is_forgotten_at_once() -> None:
    watcher, fired = Watcher(), []
    probes = [Probe(f"p{i}", 300.0, fired) for i in range(1000)]
    for probe in probes:
        watcher.add(probe)
    for probe in probes:
        watcher.remove(probe)
    assert all(not watches for watches in watcher._by_limit.values())
    late = Probe("late", 0.05, fired)
    watcher.add(late)  # the thread, waiting for a deadline 300 s away, is woken for an earlier one
    assert late.done.wait(5) and fired == ["late"]


def test_a_forked_child_starts_with_no_watches_of_its_parents() -> None:
    import os

    from dex.adapters.postgres import overruns

    fired: list[str] = []
    parents = Probe("parent's", 300.0, fired)
    overruns.WATCHER.add(parents)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fresh watcher, which still works
        try:
            empty = not any(overruns.WATCHER._by_limit.values())
            mine: list[str] = []
            probe = Probe("child's", 0.05, mine)
            overruns.WATCHER.add(probe)
            ok = empty and probe.done.wait(5) and mine == ["child's"]
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 2) == b"ok"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
        overruns.WATCHER.remove(parents)
    assert fired == []
