"""Workflow tasks: claim, load the run, decide in the domain, carry out the commands, write.

Owns the workflow worker (:mod:`.worker`), the cache of executors (:mod:`.executors`), runs held
for code that no longer matches their history (:mod:`.held`), activities answered or run inside
the workflow task (:mod:`.answers`, :mod:`.inline`) and transaction steps grouped into one
transaction per round (:mod:`.step_groups`).

May import ``activities``, ``machinery``, ``definitions``, ``ports``, ``dex.domain`` and
``dex.serialization``; never ``runtime`` or ``facade``.
"""
