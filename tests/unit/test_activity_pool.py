"""The activity pool's threads (``dex.app.machinery.threads.ActivityPool``): ``call`` calls a function and
then its callback on a pool thread, and nothing either lets through ends the thread."""

from __future__ import annotations

import logging
import threading

import pytest

from dex.app.machinery.threads import ACTIVITY_THREADS, ActivityPool


class Hostile(BaseException):
    """A BaseException whose text cannot be had."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def run_and_wait(pool: ActivityPool, fn: object, arg: object) -> list[str]:
    """``pool.call(fn, arg)``; the names of the threads ``then`` ran on, once it has."""
    done = threading.Event()
    threads: list[str] = []

    def then() -> None:
        threads.append(threading.current_thread().name)
        done.set()

    pool.call(fn, arg, then=then)  # type: ignore[arg-type]
    assert done.wait(5), "the callback never ran"
    return threads


def test_run_calls_the_function_then_the_callback_on_a_pool_thread() -> None:
    pool = ActivityPool(2)
    seen: list[tuple[int, str]] = []
    try:
        threads = run_and_wait(pool, lambda x: seen.append((x, threading.current_thread().name)), 7)
        assert seen == [(7, f"{ACTIVITY_THREADS}_0")]
        assert threads == [f"{ACTIVITY_THREADS}_0"]
    finally:
        pool.shutdown()


@pytest.mark.parametrize("raised", [ValueError("bad"), KeyboardInterrupt(), Hostile()])
def test_what_the_function_raises_is_logged_and_the_callback_still_runs(
    raised: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    pool = ActivityPool(1)

    def fail(_arg: object) -> None:
        raise raised

    try:
        with caplog.at_level(logging.ERROR, logger="dex.runner"):
            assert run_and_wait(pool, fail, None) == [f"{ACTIVITY_THREADS}_0"]
        assert "a call in the activity pool raised" in caplog.text
        # the same thread goes on with the next job
        results: list[int] = []
        run_and_wait(pool, results.append, 1)
        assert results == [1]
        assert pool._workers and all(thread.is_alive() for thread in pool._workers)
    finally:
        pool.shutdown()


def test_what_the_callback_raises_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    pool = ActivityPool(1)

    def then() -> None:
        raise Hostile()

    try:
        with caplog.at_level(logging.ERROR, logger="dex.runner"):
            pool.call(lambda _x: None, None, then=then)
            results: list[int] = []
            run_and_wait(pool, results.append, 2)  # one thread: it ran after the hostile callback
        assert results == [2]
        assert "the callback after a call in the activity pool raised" in caplog.text
    finally:
        pool.shutdown()


def test_run_after_shutdown_is_refused_and_submit_still_gives_a_future() -> None:
    pool = ActivityPool(1)
    assert pool.submit(lambda: 41 + 1).result(timeout=5) == 42
    pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.call(lambda _x: None, None, then=lambda: None)


def test_threads_start_only_while_none_is_idle_and_never_beyond_the_size() -> None:
    pool = ActivityPool(3)
    release = threading.Event()
    started = threading.Barrier(4)
    try:
        for _ in range(3):
            pool.call(lambda _x: (started.wait(5), release.wait(5)), None, then=lambda: None)
        started.wait(5)  # three calls run at once, each on a thread of its own
        pool.call(lambda _x: None, None, then=lambda: None)  # a fourth waits for one of them
        assert len(pool._workers) == 3
        release.set()
        assert run_and_wait(pool, lambda _x: None, None)[0].startswith(ACTIVITY_THREADS)
        assert len(pool._workers) == 3
    finally:
        release.set()
        pool.shutdown()


def test_calls_dropped_by_a_cancelling_shutdown_still_get_their_callbacks() -> None:
    """A stopping engine cancels the attempts not started; each one's callback frees its slot,
    so the stop does not wait its whole timeout for slots that nothing will free."""
    pool = ActivityPool(1)
    release, started = threading.Event(), threading.Event()
    ran: list[int] = []
    ended: list[int] = []
    pool.call(lambda _x: (started.set(), release.wait(5)), None, then=lambda: ended.append(0))
    assert started.wait(5)
    for n in (1, 2):  # queued behind the busy thread: never started
        pool.call(ran.append, n, then=lambda n=n: ended.append(n))  # type: ignore[misc]
    future = pool.submit(ran.append, 3)

    def more() -> None:  # a callback that hands the pool more work: refused, no deadlock
        ended.append(4)
        with pytest.raises(RuntimeError, match="after shutdown"):
            pool.call(ran.append, 5, then=lambda: None)

    pool.call(ran.append, 4, then=more)
    pool.shutdown(wait=False, cancel_futures=True)
    assert sorted(ended) == [1, 2, 4]  # at once, before the running call ends
    assert future.cancelled()
    release.set()
    pool.shutdown(wait=True)
    assert ran == [] and sorted(ended) == [0, 1, 2, 4]
