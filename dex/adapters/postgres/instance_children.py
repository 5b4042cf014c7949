"""Children started under ``id_reuse`` in a workflow task's completion (docs/reference/contract.md §15).

A child with ``id_reuse="failed_only"`` or ``"never"`` is not made when an ended run of its
instance id answers the start (:func:`dex.domain.instance_keys.decide`): its parent gets that
run's outcome instead (:func:`~dex.domain.writes.reused_outcome`). The completion asks
:func:`answered_children` which children those are, in one statement for the batch, before it
inserts the others; a live run's clash is left to the insert (the live-run index), as for any
child. The completion holds the children's instance-id locks (:func:`.instances.send_tries`),
so no keyed start of those ids (:mod:`.instance_keys`) comes between this read and its insert.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg

from dex.adapters.postgres import arrays
from dex.adapters.postgres.schema import LIVE, Statements
from dex.domain import events as ev
from dex.domain.instance_keys import LatestRun, Reuse, decide
from dex.domain.status import RunStatus
from dex.domain.task import NewRun
from dex.domain.writes import reused_outcome
from dex.serialization.values import decode_failure, decode_payload

# per instance id, its live run if any, else its newest: the runs that answer children started
# under id_reuse, with what an ended one's parent is told (its result or failure)
_LATEST_OF_IDS = (
    "SELECT k.id, r.run_id, r.workflow_name, r.status, r.created_at, r.result, r.failure"
    " FROM unnest(%b::text[]) AS k(id) CROSS JOIN LATERAL ("
    "  (SELECT run_id, workflow_name, status, created_at, result, failure, 0 AS o FROM {s}.runs"
    "   WHERE instance_id = k.id AND status IN " + LIVE + " LIMIT 1)"
    "  UNION ALL (SELECT run_id, workflow_name, status, created_at, result, failure, 1 FROM {s}.runs"
    "   WHERE instance_id = k.id ORDER BY created_at DESC, position DESC LIMIT 1)"
    "  ORDER BY o LIMIT 1) AS r"
)


def answered_children(
    conn: psycopg.Connection, q: Statements, children: Sequence[NewRun], now: datetime
) -> dict[str, ev.Message]:
    """Of the children a completion starts under ``id_reuse``, those an ended run of their
    instance id answers (not to be made), with the message their parent gets instead."""
    keys = sorted({child.created.instance_id for child in children if child.created.instance_id is not None})
    if not keys:
        return {}
    found = {row[0]: row[1:] for row in conn.execute(q(_LATEST_OF_IDS), [arrays.texts(keys)]).fetchall()}
    answers: dict[str, ev.Message] = {}
    for child in children:
        row = found.get(child.created.instance_id)
        if row is None:
            continue
        run_id, workflow_name, status, created_at, result, failure = row
        latest = LatestRun(
            run_id=run_id, workflow_name=workflow_name, status=RunStatus(status), created_at=created_at, waiting=False
        )
        decision = decide(latest, child.rule, child.created.workflow_name, now)
        if isinstance(decision, Reuse) and latest.status.is_terminal:
            answers[child.run_id] = reused_outcome(
                child,
                latest.status,
                decode_payload(result) if result is not None else None,
                decode_failure(failure) if failure is not None else None,
            )
    return answers
