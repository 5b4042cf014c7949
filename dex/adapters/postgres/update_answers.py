"""The rows of ``update_answers`` (migration 16): what a workflow task's completion writes for
``engine.update``'s callers, and how a row reads back as an answer.

:func:`answers_insert` is called by :class:`~dex.adapters.postgres.completion.WriteRound` in
the transaction that writes the history block; its ``NOTIFY`` (the run id as payload, on
:func:`answer_channel`) is delivered at commit, so a caller woken by it finds the answer
written (:mod:`dex.adapters.postgres.updates` waits for it).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from dex.adapters.postgres import arrays
from dex.adapters.postgres.schema import Statements
from dex.domain.task import UpdateAnswer
from dex.serialization.values import decode_failure, decode_payload, encode_failure, encode_payload


@functools.lru_cache(maxsize=64)  # asked at every completion that ends a run or answers one
def answer_channel(schema: str) -> str:
    """The NOTIFY channel of a schema's update answers: a fixed prefix and a digest of the
    schema's name (a channel is an identifier of at most 63 bytes; a schema's name may be as long)."""
    return "dex_updates_" + hashlib.sha256(schema.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def answers_insert(
    q: Statements, channel: str, answers: Sequence[tuple[str, UpdateAnswer]], now: datetime
) -> list[tuple[Any, list[Any]]]:
    """The statements that keep ``answers`` (run id, answer) and notify their runs' waiters.

    A rejection never replaces an answer (``WHERE a.rejected``): an accepted
    update's answer is final, and a refusal of a later duplicate must not hide it."""
    if not answers:
        return []
    # one row per (run, update id) in the statement (ON CONFLICT DO UPDATE may touch a row once):
    # a task can answer one id twice (a request repeated in the task that accepted it, a refusal
    # beside an answer), and an answer wins over a rejection, as the conflict clause says
    kept: dict[tuple[str, str], tuple[str, UpdateAnswer]] = {}
    for run_id, answer in answers:
        known = kept.get((run_id, answer.update_id))
        if known is None or (known[1].rejected and not answer.rejected):
            kept[(run_id, answer.update_id)] = (run_id, answer)
    answers = list(kept.values())
    keep = (
        q(
            "INSERT INTO {s}.update_answers AS a (run_id, update_id, result, failure, rejected, answered_at)"
            " SELECT * FROM unnest(%b::text[], %b::text[], %b::bytea[], %b::bytea[], %b::boolean[],"
            "                      %b::timestamptz[])"
            " ON CONFLICT (run_id, update_id) DO UPDATE SET result = excluded.result,"
            "  failure = excluded.failure, rejected = excluded.rejected, answered_at = excluded.answered_at"
            " WHERE a.rejected"
        ),
        [
            arrays.texts([run_id for run_id, _ in answers]),
            arrays.texts([a.update_id for _, a in answers]),
            arrays.byteas([encode_payload(a.result) if a.result is not None else None for _, a in answers]),
            arrays.byteas([encode_failure(a.failure) if a.failure is not None else None for _, a in answers]),
            arrays.bools([a.rejected for _, a in answers]),
            arrays.timestamptzs([now] * len(answers)),
        ],
    )
    run_ids = sorted({run_id for run_id, _ in answers})
    notify = (q("SELECT pg_notify(%s, r) FROM unnest(%b::text[]) AS r"), [channel, arrays.texts(run_ids)])
    return [keep, notify]


def answer_of(update_id: str, row: Sequence[Any]) -> UpdateAnswer:
    result, failure, rejected = row
    return UpdateAnswer(
        update_id=update_id,
        result=decode_payload(result) if result is not None else None,
        failure=decode_failure(failure) if failure is not None else None,
        rejected=rejected,
    )
