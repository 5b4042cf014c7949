"""The idle connections of transaction steps (dex/adapters/postgres/idle_connections.py): which
one a step is handed, which are closed, how many wait. The connections here are plain objects:
the bookkeeping does no I/O, and says which ones its caller is to close."""

from __future__ import annotations

from dex.adapters.postgres.idle_connections import IdleConnections


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_step_is_handed_the_connection_given_back_last_and_the_others_wait() -> None:
    idle: IdleConnections[str] = IdleConnections(keep=3, idle_for=60.0, clock=Clock())
    assert idle.take() == (None, [])
    assert idle.keep("a") and idle.keep("b") and idle.keep("c")
    assert idle.take() == ("c", [])
    assert idle.take() == ("b", [])
    assert idle.keep("d")
    assert idle.take() == ("d", [])
    assert idle.take() == ("a", [])
    assert idle.take() == (None, [])


def test_at_most_keep_wait_and_the_one_beyond_is_for_the_caller_to_close() -> None:
    idle: IdleConnections[str] = IdleConnections(keep=2, idle_for=60.0, clock=Clock())
    assert idle.keep("a") and idle.keep("b")
    assert not idle.keep("c")
    assert idle.take() == ("b", [])
    assert idle.keep("c")  # room again
    assert idle.close() == ["a", "c"]


def test_a_connection_idle_for_idle_for_or_longer_is_closed_when_the_next_step_asks() -> None:
    clock = Clock()
    idle: IdleConnections[str] = IdleConnections(keep=3, idle_for=60.0, clock=clock)
    idle.keep("old")
    clock.now = 30.0
    idle.keep("newer")
    clock.now = 60.0  # "old" waited 60 s exactly: too long; "newer" 30 s
    assert idle.take() == ("newer", ["old"])
    idle.keep("newer")
    clock.now = 200.0
    assert idle.take() == (None, ["newer"])
    assert idle.close() == []


def test_a_connection_of_another_owner_is_not_handed_out_but_closed() -> None:
    first_loop, second_loop = object(), object()
    idle: IdleConnections[str] = IdleConnections(keep=3, idle_for=60.0, clock=Clock())
    idle.keep("on-first", first_loop)
    idle.keep("on-second", second_loop)
    idle.keep("also-on-first", first_loop)
    # the owner that asks is the second loop: the first loop's connections go (the loop restarted)
    assert idle.take(second_loop) == ("on-second", ["also-on-first", "on-first"])
    assert idle.take(first_loop) == (None, [])


def test_once_closed_the_waiting_ones_are_the_callers_to_close_and_none_is_kept_again() -> None:
    idle: IdleConnections[str] = IdleConnections(keep=3, idle_for=60.0, clock=Clock())
    idle.keep("a")
    idle.keep("b")
    assert idle.close() == ["a", "b"]
    assert idle.close() == []
    assert not idle.keep("late")
    assert idle.take() == (None, [])
