"""The backoff of a task that failed for a reason other than its code.

A workflow task given back (the store failed, the code blocked its thread, a deploy's code no
longer matches the history) and an activity attempt whose claim did not count both wait this
long before the next claim: 1 s, 2 s, 4 s ... at most every 5 minutes, for as long as it takes.
The attempts are claims, so nothing gives up: what failed was the machinery, not the run.
"""

from __future__ import annotations

from datetime import timedelta

from dex.domain.retry import RetryPolicy

TASK_RETRY = RetryPolicy(
    initial_delay=timedelta(seconds=1), multiplier=2.0, max_delay=timedelta(minutes=5), max_attempts=2**31 - 1
)
