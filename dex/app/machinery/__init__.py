"""The machinery workers run on: batched writes, threads, and the watch over user code.

Owns the write buffer (:mod:`.buffer`) and how a batch the store refuses is settled item by
item (:mod:`.refusals`), the background threads and the activity pool (:mod:`.threads`), the
watchdog over workflow code that blocks (:mod:`.watchdog`), the workflows this process no longer
runs (:mod:`.quarantine`) and the backoff of tasks that failed for a reason other than their
code (:mod:`.backoff`).

May import ``ports`` and ``dex.domain``; never a package above it.
"""
