"""Ledgers of what the store handed out: task leases, the leadership lease, run statuses.

Each ledger keeps the grants it was told about and raises :class:`InvariantViolation` the
moment a new one contradicts them: a task granted while another lease on it is live, a second
leader while the first one's lease holds, a run that leaves a terminal status or vanishes
before its retention period.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

import attrs

from dex.app.ports.store import Lease, RunRecord
from dex.domain.status import ALLOWED_TRANSITIONS, RunStatus
from dex.simulation.invariants import InvariantViolation


@attrs.define
class _Claim:
    run_id: str
    owner: str
    version: int
    until: datetime
    released: bool = False

    def live(self, now: datetime) -> bool:
        return not self.released and self.until > now


class LeaseLedger:
    """Every task lease the store granted; a grant must never overlap a live one."""

    def __init__(self) -> None:
        self._claims: dict[tuple[str, int], _Claim] = {}
        self._workflow_task_of_run: dict[str, int] = {}

    def claimed(self, kind: str, task_id: int, run_id: str, lease: Lease, now: datetime) -> None:
        previous = self._claims.get((kind, task_id))
        if previous is not None and previous.live(now):
            raise InvariantViolation(
                "no-two-live-leases",
                f"{kind} task {task_id} of run {run_id} granted to {lease.owner} (v{lease.version}) while "
                f"{previous.owner}'s lease v{previous.version} holds until {previous.until.isoformat()}",
            )
        if previous is not None and lease.version <= previous.version:
            raise InvariantViolation(
                "no-two-live-leases", f"{kind} task {task_id}: lease version {lease.version} did not grow"
            )
        if kind == "workflow":
            other = self._workflow_task_of_run.get(run_id)
            if other is not None and other != task_id and not self._claims[("workflow", other)].released:
                raise InvariantViolation(
                    "no-two-live-leases", f"run {run_id} has workflow tasks {other} and {task_id} at once"
                )
            self._workflow_task_of_run[run_id] = task_id
        self._claims[(kind, task_id)] = _Claim(run_id, lease.owner, lease.version, lease.until)

    def extended(self, kind: str, task_id: int, lease: Lease, until: datetime) -> None:
        claim = self._claims.get((kind, task_id))
        if claim is None or (claim.owner, claim.version) != (lease.owner, lease.version):
            raise InvariantViolation("no-two-live-leases", f"{kind} task {task_id}: a lost lease was extended")
        claim.until = until

    def completed(self, kind: str, task_id: int, lease: Lease, applied: bool) -> None:
        """A completion came back; the store's answer must fit the latest grant."""
        claim = self._claims.get((kind, task_id))
        latest = claim is not None and (claim.owner, claim.version) == (lease.owner, lease.version)
        if applied and not latest:
            raise InvariantViolation(
                "no-two-live-leases",
                f"{kind} task {task_id}: a completion under lost lease {lease.owner} v{lease.version} was applied",
            )
        if applied and claim is not None and latest and claim.released:
            raise InvariantViolation(
                "duplicates-discarded", f"{kind} task {task_id}: a completion of lease v{lease.version} applied twice"
            )
        if latest and claim is not None:
            claim.released = True  # the task is done, retried or dropped: the lease ends here

    def given_back(self, kind: str, task_id: int, lease: Lease, ok: bool) -> None:
        """A claim was given back without a result (retry_later); only the latest may be."""
        claim = self._claims.get((kind, task_id))
        latest = claim is not None and (claim.owner, claim.version) == (lease.owner, lease.version)
        if ok and not latest:
            raise InvariantViolation(
                "no-two-live-leases", f"{kind} task {task_id}: lost lease {lease.owner} v{lease.version} was given back"
            )
        if ok and claim is not None:
            claim.released = True


class LeaderLedger:
    """Leadership leases: never two nodes whose leases overlap."""

    def __init__(self) -> None:
        self._holder: tuple[str, datetime] | None = None

    def granted(self, node_id: str, now: datetime, ttl: timedelta) -> None:
        if self._holder is not None and self._holder[0] != node_id and self._holder[1] > now:
            raise InvariantViolation(
                "one-leader",
                f"{node_id} took the leadership at {now.isoformat()} while {self._holder[0]} "
                f"holds it until {self._holder[1].isoformat()}",
            )
        self._holder = (node_id, now + ttl)

    def released(self, node_id: str) -> None:
        if self._holder is not None and self._holder[0] == node_id:
            self._holder = None


def _reachable(start: RunStatus) -> set[RunStatus]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in ALLOWED_TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


REACHABLE = {status: _reachable(status) for status in RunStatus}


class StatusWatch:
    """Run statuses as seen between steps: legal moves only, none out of a terminal status,
    one live run per instance id and one started run per concurrency key, and deletions by
    retention only."""

    def __init__(self, retention: timedelta) -> None:
        self.retention = retention
        self.last: dict[str, RunRecord] = {}
        self.deleted: set[str] = set()

    def observe(self, records: Mapping[str, RunRecord | None], now: datetime) -> None:
        holders: dict[str, str] = {}
        instances: dict[str, str] = {}
        for run_id, record in records.items():
            before = self.last.get(run_id)
            if record is None:
                self._vanished(run_id, before, now)
                continue
            if run_id in self.deleted:
                raise InvariantViolation("terminal-is-final", f"run {run_id} came back after it was deleted")
            if before is not None and record.status not in REACHABLE[before.status]:
                raise InvariantViolation(
                    "terminal-is-final", f"run {run_id} went from {before.status.value} to {record.status.value}"
                )
            if before is not None and before.status.is_terminal and record != before:
                raise InvariantViolation("terminal-is-final", f"run {run_id} changed after it ended: {record}")
            if record.status.is_terminal and record.completed_at is None:
                raise InvariantViolation("terminal-is-final", f"run {run_id} ended without completed_at")
            self.last[run_id] = record
            if record.status in (RunStatus.RUNNING, RunStatus.SUSPENDED) and record.concurrency_key is not None:
                other = holders.setdefault(record.concurrency_key, run_id)
                if other != run_id:
                    raise InvariantViolation(
                        "concurrency-key", f"runs {other} and {run_id} both run under key {record.concurrency_key!r}"
                    )
            if not record.status.is_terminal and record.instance_id is not None:
                other = instances.setdefault(record.instance_id, run_id)
                if other != run_id:
                    raise InvariantViolation(
                        "instance-id", f"runs {other} and {run_id} both live with instance id {record.instance_id!r}"
                    )

    def _vanished(self, run_id: str, before: RunRecord | None, now: datetime) -> None:
        if run_id in self.deleted:
            return
        if before is None or not before.status.is_terminal or before.completed_at is None:
            raise InvariantViolation(
                "retention", f"run {run_id} vanished while {before.status.value if before else '?'}"
            )
        if before.completed_at >= now - self.retention:
            raise InvariantViolation(
                "retention",
                f"run {run_id} deleted at {now.isoformat()}, only {now - before.completed_at} after it ended",
            )
        self.deleted.add(run_id)
