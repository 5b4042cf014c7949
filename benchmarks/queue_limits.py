"""Claims from a rate-limited queue on PostgreSQL: throughput beside an unlimited queue, and
how closely a low limit holds.

    python -m benchmarks.queue_limits [--tasks 5000] [--threads 4] [--batch 32] [--pairs 1]
                                      [--rate 20] [--period 1] [--seconds 10]

1. Claim throughput. ``--tasks`` runs wait on a workflow queue (their workflow tasks
   scheduled); ``--threads`` threads claim them ``--batch`` at a time through the store's
   port (``claim_workflow_tasks``) until none is left, after one untimed claim each (their
   sessions, prepared statements and first reservation), on a fresh schema each time: once with
   no limit (the plain claim), once with a rate limit set far above what the claims reach
   (100,000 a second: every claim goes through the start slots, none waits for one). Reported:
   tasks claimed per second and the claim statements' median time. ``--pairs`` repeats the
   two, alternated (unlimited, limited, unlimited, ...), and reports each pair's ratio and
   their median: on a shared machine one pair says little.
2. Accuracy of a low limit. A queue limited to ``--rate`` per ``--period`` seconds holds more
   tasks than it may start in ``--seconds``; the threads claim one task at a time, as fast as
   they can. Reported: the starts, the most in any window of the period by the time each
   claim stamped its slot (the limit's own clock: never above the limit), and by the time the
   claim's answer came back (what a caller sees: the commit's delay may bunch them), and the
   rate reached against the limit.

Nothing executes the tasks: this measures the claims alone. Figures depend on the machine;
record them only from an idle one.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from benchmarks.common import table
from dex.adapters.postgres import PostgresAdapter
from dex.domain import events as ev
from dex.domain.queue_limits import RateLimit
from dex.domain.values import Payload
from tests.pg import fresh_schema, postgres_dsn

WF = "bench-limited"
QUEUE = "bench"
LEASE = timedelta(minutes=5)


def fill(adapter: PostgresAdapter, tasks: int) -> None:
    """Make ``tasks`` runs on the queue and schedule their workflow tasks."""
    payload = Payload(encoding="json/plain", data=b"1")
    now = datetime.now(UTC)
    for _ in range(tasks):
        created = ev.RunCreated(workflow_name=WF, input=(payload,), queue=QUEUE)
        adapter.create_run(str(uuid.uuid4()), created, now)
    while adapter.schedule_workflow_tasks(datetime.now(UTC), 1000):
        pass


def claim_all(
    adapter: PostgresAdapter, threads: int, batch: int, until: float | None = None, each: int | None = None
) -> list[tuple]:
    """Claim with ``threads`` threads until nothing is left (or until ``until``, a monotonic
    time, or ``each`` claims per thread); each claim's (stamp, answered at, tasks, seconds)
    with wall-clock times."""
    records: list[tuple] = []
    lock = threading.Lock()
    names = frozenset({WF})

    def worker(n: int) -> None:
        empty = 0
        made = 0
        while (until is None or time.monotonic() < until) and (each is None or made < each):
            made += 1
            stamp = datetime.now(UTC)
            began = time.perf_counter()
            got = adapter.claim_workflow_tasks(names, f"w{n}", stamp, LEASE, batch)
            took = time.perf_counter() - began
            with lock:
                records.append((stamp, datetime.now(UTC), len(got), took))
            if not got:
                empty += 1
                if until is None and empty >= 3:
                    return
                time.sleep(0.002)
            else:
                empty = 0

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return records


def throughput(dsn: str, tasks: int, threads: int, batch: int, rate: RateLimit | None) -> list[object]:
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema, max_connections=threads + 2)
        try:
            adapter.create_queue(QUEUE, "workflow", 2**31 - 1, 1, rate)
            fill(adapter, tasks + threads * batch)
            # one claim per thread first, not timed: the sessions, their prepared statements and
            # (limited) the first reservation of starts, which a claimer makes once, not per claim
            claim_all(adapter, threads, batch, each=1)
            began = time.perf_counter()
            records = claim_all(adapter, threads, batch)
            seconds = time.perf_counter() - began
        finally:
            adapter.close()
    claimed = sum(r[2] for r in records)
    median = statistics.median(r[3] for r in records if r[2]) * 1000
    label = "unlimited" if rate is None else f"{rate.starts}/{rate.period.total_seconds():g}s"
    return [label, claimed, round(claimed / seconds), round(median, 2)]


def most_in_a_window(moments: list[datetime], period: timedelta) -> int:
    moments = sorted(moments)
    most, first = 0, 0
    for last, moment in enumerate(moments):
        while moment - moments[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def accuracy(dsn: str, threads: int, rate: RateLimit, seconds: float) -> list[object]:
    with fresh_schema(dsn) as schema:
        adapter = PostgresAdapter(dsn, schema=schema, max_connections=threads + 2)
        try:
            adapter.create_queue(QUEUE, "workflow", 2**31 - 1, 1, rate)
            per_second = rate.starts / rate.period.total_seconds()
            fill(adapter, int(per_second * seconds * 1.5) + rate.starts + 10)
            records = claim_all(adapter, threads, 1, until=time.monotonic() + seconds)
        finally:
            adapter.close()
    starts = [r for r in records if r[2]]
    stamped = most_in_a_window([r[0] for r in starts], rate.period)
    answered = most_in_a_window([r[1] for r in starts], rate.period)
    reached = len(starts) / seconds / per_second
    return [f"{rate.starts}/{rate.period.total_seconds():g}s", len(starts), stamped, answered, f"{reached:.0%}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--rate", type=int, default=20)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    dsn = postgres_dsn()
    high = RateLimit(100_000, timedelta(seconds=1))
    rows, ratios = [], []
    for _ in range(args.pairs):
        pair = [throughput(dsn, args.tasks, args.threads, args.batch, rate) for rate in (None, high)]
        ratios.append(pair[1][2] / pair[0][2])
        rows += [[*row, f"{ratios[-1]:.0%}" if row is pair[1] else ""] for row in pair]
    print(table("claim throughput", ["limit", "claimed", "tasks/s", "median claim ms", "of unlimited"], rows))
    if args.pairs > 1:
        print(
            f"limited/unlimited over {args.pairs} pairs: median {statistics.median(ratios):.1%},"
            f" from {min(ratios):.1%} to {max(ratios):.1%}"
        )
    low = RateLimit(args.rate, timedelta(seconds=args.period))
    row = accuracy(dsn, args.threads, low, args.seconds)
    print(
        table(
            "a low limit",
            ["limit", "starts", "most in a window (stamped)", "most in a window (answered)", "of the limit's rate"],
            [row],
        )
    )


if __name__ == "__main__":
    main()
