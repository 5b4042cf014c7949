"""A workflow completion's writes, dispatch and claim as calls of ``complete_workflow_writes``.

:func:`.completion.complete_workflow_tasks` locks the runs, takes the tasks whose lease
holds, checks each result against its locked run and gathers the writes of each round
(:class:`.completion.WriteRound`): that part reads, and is the same on every path. What
follows it reads nothing: each round's writes (the run rows, the history blocks, the
activity tasks, the ended runs' inbox and tasks, the messages), then the dispatch of what
the batch made due (:func:`.dispatch.dispatch_now`'s statements, the scheduler's lock tried)
and the activity claim. Sent as statements they are some eight to ten of them, each parsed,
planned and dumped; here they are one call of the function of migration 9 per round (the
dispatch and the claim in the last), whose statements keep their plans per session. The
call's rows are the claimed tasks, read after the commit they come with.

A batch in which a result starts child runs or replaces the history (continue-as-new) keeps
the statements (:meth:`.completion.WriteRound.flush`): the children's inserts are read back
to tell created from clashing ones, and the function writes neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.completion import WriteRound
from dex.adapters.postgres.schema import LOCK_SCHEDULE_ACTIVITIES, LOCK_SCHEDULE_WORKFLOWS, Statements
from dex.app.ports import Claim, WorkflowTask
from dex.domain.task import WorkflowTaskResult
from dex.domain.writes import WAKING_KINDS

_WRITES = 32  # the function's arguments that WriteRound.arguments gives
_CALL = (
    "SELECT * FROM {s}.complete_workflow_writes("
    "%s::timestamptz, %b::bigint[], %b::text[],"
    " %b::text[], %b::text[], %b::boolean[], %b::boolean[], %b::text[], %b::integer[], %b::boolean[],"
    " %b::bytea[], %b::bytea[],"
    " %b::text[], %b::integer[], %b::integer[], %b::bytea[],"
    " %b::text[], %b::text[], %b::integer[], %b::text[], %b::bytea[], %b::integer[], %b::bytea[],"
    " %b::interval[], %b::timestamptz[], %b::text[], %b::integer[],"
    " %b::text[],"
    " %b::text[], %b::text[], %b::bytea[], %b::timestamptz[],"
    " %s::text, %s::boolean, %s::integer, %s::integer, %b::text[], %s::integer, %b::text[],"
    " %s::boolean, %b::text[], %s::text, %s::interval, %s::integer)"
)


@attrs.frozen(kw_only=True)
class After:
    """What the last round's call does after the writes: dispatch, then claim."""

    activities: bool  # the batch made activity tasks: dispatch them
    told: tuple[str, ...]  # runs the batch sent messages to: dispatch their workflow tasks
    claim: Claim | None  # an activity claim (only when the batch made activity tasks)
    limit: int  # the dispatch's batch (dispatch.DISPATCH_BATCH)


def by_function(results: Sequence[tuple[WorkflowTask, WorkflowTaskResult]]) -> bool:
    """Whether a batch's writes can go as calls: no child runs, no history replaced."""
    return not any(result.child_runs or result.new_history is not None for _task, result in results)


def send(conn: psycopg.Connection, q: Statements, rounds: Sequence[WriteRound], after: After) -> psycopg.Cursor[Any]:
    """Send one call per round (``after`` with the last); the last call's cursor gives the
    claimed tasks. ``rounds`` holds at least one round with writes."""
    quiet = After(activities=False, told=(), claim=None, limit=after.limit)
    last = len(rounds) - 1
    cursor = None
    for index, batch in enumerate(rounds):
        cursor = conn.execute(q(_CALL), batch.arguments() + _after(q, after if index == last else quiet))
    assert cursor is not None
    return cursor


def _after(q: Statements, after: After) -> list[object]:
    claim = after.claim
    return [
        q.schema,
        after.activities,
        LOCK_SCHEDULE_ACTIVITIES,
        after.limit,
        arrays.texts(sorted(set(after.told))),
        LOCK_SCHEDULE_WORKFLOWS,
        list(WAKING_KINDS),
        claim is not None,
        sorted(claim.names) if claim is not None else [],
        claim.owner if claim is not None else None,
        claim.lease if claim is not None else None,
        claim.limit if claim is not None else 0,
    ]


assert _CALL.count("%") == _WRITES + 12
