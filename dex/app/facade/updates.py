"""``engine.update`` (docs/reference/contract.md §14): a request to a running workflow, and its answer.

:class:`RunUpdates` puts an ``UpdateRequested`` message in the run's inbox and wakes the run as
an event does; the run's next workflow task screens it (validator, known name, repeated id) and
runs the handler, and the store keeps the answer by update id in the same transaction as the
history block (:mod:`dex.app.ports.updates`). The caller waits for that answer, woken when it
is written (PostgreSQL: a NOTIFY; memory: a condition), so the round trip costs one workflow
task and its writes, with no poll interval.

A caller that gives an ``update_id`` which already has an answer gets that answer at once:
nothing is sent and no handler runs again. One that names an id still being handled waits for
the same answer as the first caller.

On an engine with code that is not started (tests that ``drain()`` with a virtual clock)
nothing else would run the task, so the call drives the engine itself, as
``drain(advance_time=False)`` does, between looks at the answer. An engine without code (``dex
web`` over a database, the command line) only sends and waits: the engines that run the
workflow answer.

Faults stay the caller's or the machinery's, never the run's: a bad name, id or argument is a
``ValueError``/``TypeError`` before anything is written; a store that fails while the caller
waits is read again with a backoff until the call's own deadline (``TimeoutError`` then says
so); a request that was written stays in the inbox and is answered even if its caller gave up.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from dex.app.facade.reads import run_id_of, wait_seconds
from dex.app.machinery.threads import Foreground
from dex.app.ports.store import Claim, Loaded, Store, WorkflowTask
from dex.domain import events as ev
from dex.domain.definitions import PayloadConverter
from dex.domain.errors import DexError
from dex.domain.handlers import update_request, validate_handler_name
from dex.domain.task import UpdateAnswer, update_result

log = logging.getLogger("dex.updates")

# how long one wait for an answer lasts before the store is read again: a NOTIFY or the memory
# condition wakes the caller at once, so this only bounds what a lost notification (a listener
# reconnecting) can cost
LOOK_AGAIN = 2.0


class RunUpdates:
    """Sends updates to the runs of ``store`` and returns their answers.

    ``drives`` says whether the call must run the engine itself (one with code, not started);
    then ``drive`` runs everything due (``drain(advance_time=False)``). ``nudge_scheduler`` wakes the
    scheduler of a started engine, which turns the request into a workflow task; ``claim``
    gives the claim a started engine makes with the request instead (None: none now) and
    ``hand`` gives what it claimed to the engine's workflow worker."""

    def __init__(
        self,
        store: Store,
        converter: PayloadConverter,
        *,
        foreground: Foreground,
        nudge_scheduler: Callable[[], None],
        drives: Callable[[], bool],
        drive: Callable[[], None],
        claim: Callable[[str], Claim | None] = lambda _run_id: None,
        hand: Callable[[list[WorkflowTask], list[Loaded], datetime], None] = lambda _t, _l, _n: None,
    ) -> None:
        self._claim = claim
        self._hand = hand
        self._store = store
        self._converter = converter
        self._foreground = foreground
        self._nudge_scheduler = nudge_scheduler
        self._drives = drives
        self._drive = drive

    def update(
        self,
        run_id: str,
        name: str,
        args: Sequence[Any],
        update_id: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> Any:
        """``Engine.update``: the handler's result, or UpdateRejectedError / UpdateFailedError /
        InvalidStateError (an ended run) / RunNotFoundError / TimeoutError."""
        run_id = run_id_of(run_id)
        name = validate_handler_name(name, "update name")
        seconds = wait_seconds(timeout)
        update_id = str(uuid.uuid4()) if update_id is None else update_id
        payloads = tuple(self._converter.encode(arg) for arg in args)
        request = update_request(update_id, name, payloads)  # checks the id: nothing written if bad
        deadline = None if seconds is None else time.monotonic() + seconds
        answer = self._request(run_id, request)
        if answer is None:
            answer = self._answer(run_id, request.update_id, deadline, seconds)
        result = update_result(answer)  # raises the rejection or the handler's failure
        return None if result is None else self._converter.decode(result)

    def _request(self, run_id: str, request: ev.UpdateRequested) -> UpdateAnswer | None:
        """Send the request; on a started engine with room, claim the run's workflow task in the
        same transaction and hand it to this engine's worker, which holds the run's executor if
        any engine does (the claim loads from where it stands): no scheduler round, no poll."""
        now = self._store.clock.now()
        claim = self._claim(run_id)
        claimed: list[WorkflowTask] = []
        loaded: list[Loaded] = []
        with self._foreground.calling():
            if claim is None:
                answer = self._store.request_update(run_id, request, now)
            else:
                answer, claimed, loaded = self._store.request_update_then_claim(run_id, request, now, claim)
        if answer is None:
            if claimed:
                self._hand(claimed, loaded, now)
            else:
                self._nudge_scheduler()  # the scheduler makes the workflow task; it wakes the worker
        return answer

    def _answer(self, run_id: str, update_id: str, deadline: float | None, seconds: float | None) -> UpdateAnswer:
        pause = 0.001
        failures = 0
        last: Exception | None = None
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                if not self._drives():
                    look = LOOK_AGAIN if left is None else max(0.0, min(left, LOOK_AGAIN))
                    answer = self._store.wait_update_answer(run_id, update_id, look)
                else:
                    self._drive()
                    answer = self._store.update_answer(run_id, update_id)
                    if answer is None:
                        # nothing left to run here: wait a little for another thread's drain or
                        # the clock (never a hot loop), and drive again
                        look = pause if left is None else max(0.0, min(left, pause))
                        answer = self._store.wait_update_answer(run_id, update_id, look)
                        pause = min(pause * 2, 0.05)
            except DexError:
                raise
            except Exception as exc:  # noqa: BLE001 - the store failed (a connection, a timeout): read again
                failures += 1
                last = exc
                log.log(
                    logging.INFO if failures == 1 else logging.DEBUG,
                    "update %r of run %s: reading its answer failed (%s); retrying until the call's timeout",
                    update_id,
                    run_id,
                    type(exc).__name__,
                )
                answer = None
                time.sleep(min(0.05 * failures, 1.0) if left is None else max(0.0, min(left, 0.05 * failures, 1.0)))
            else:
                failures, last = 0, None
            if answer is not None:
                return answer
            if deadline is not None and time.monotonic() >= deadline:
                raise _timed_out(run_id, update_id, seconds, last) from last


def _timed_out(run_id: str, update_id: str, seconds: float | None, last: Exception | None) -> TimeoutError:
    text = (
        f"update {update_id!r} of run {run_id} got no answer within {seconds} s; the request stays with"
        " the run, which still answers it (call update again with this update_id for its answer)"
    )
    if last is None:
        return TimeoutError(text)
    return TimeoutError(f"{text}; the store was failing (the last error: {type(last).__name__})")
