"""When a workflow is quarantined in its process (dex.app.machinery.quarantine), and what is counted."""

from __future__ import annotations

import logging

import pytest

from dex.app.machinery.quarantine import BLOCKS, Quarantine
from dex.app.ports.telemetry import TelemetryHub


class Sink:
    def __init__(self) -> None:
        self.quarantined: list[str] = []
        self.interrupted: list[int] = []

    def workflow_quarantined(self, workflow: str) -> None:
        self.quarantined.append(workflow)

    def interrupted_threads(self, count: int) -> None:
        self.interrupted.append(count)


def _quarantine() -> tuple[Quarantine, Sink]:
    hub, sink = TelemetryHub(), Sink()
    hub.attach(sink)  # type: ignore[arg-type]
    return Quarantine(hub), sink


def test_a_workflow_whose_tasks_block_again_and_again_is_quarantined_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="dex")
    quarantine, sink = _quarantine()
    for _ in range(BLOCKS - 1):
        quarantine.blocked("slow", "r1")
        quarantine.blocked("other", "r2")
    assert quarantine.names == frozenset()
    quarantine.blocked("slow", "r3")
    quarantine.blocked("slow", "r4")
    assert quarantine.names == {"slow"} and quarantine.holds("slow") and not quarantine.holds("other")
    assert sink.quarantined == ["slow"]  # reported and logged once
    assert [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()] == [
        "workflow slow is quarantined in this process: its tasks were blocked past the deadline 3 times "
        "(last at run r3); its tasks are left to other processes (or to this one after a restart)"
    ]


def test_code_beyond_reach_is_quarantined_at_once() -> None:
    quarantine, sink = _quarantine()
    quarantine.blocked("regex", "r1", beyond_reach="it held the GIL for 2.0 s")
    assert quarantine.names == {"regex"}
    assert sink.quarantined == ["regex"]


def test_interrupted_threads_are_counted_until_they_end_and_two_of_one_workflow_quarantine_it() -> None:
    quarantine, sink = _quarantine()
    quarantine.interrupted(1, "spins", "r1")
    quarantine.interrupted(2, "sleeps", "r2")
    assert quarantine.interrupted_threads == 2 and quarantine.names == frozenset()
    quarantine.ended(2)
    quarantine.ended(2)  # once only
    quarantine.interrupted(3, "spins", "r1")
    assert quarantine.names == {"spins"}
    assert quarantine.interrupted_threads == 2
    quarantine.ended(1)
    quarantine.ended(3)
    assert quarantine.interrupted_threads == 0
    assert sink.interrupted == [1, 2, 1, 2, 1, 0]
    assert quarantine.names == {"spins"}  # for the process's life
