"""Activity tasks: claim, run each attempt on the pool under a lease, hand back its outcome.

Owns the activity worker (:mod:`.worker`), what it keeps of attempts (:mod:`.attempts`), the
leases of running attempts and what keeps them alive (:mod:`.leases`, :mod:`.lease_keeper`),
the event loop of ``async def`` activities (:mod:`.event_loop`) and a transaction step's attempt
(:mod:`.transaction_steps`).

May import ``machinery``, ``definitions``, ``ports`` and ``dex.domain``; never ``workflows``,
``runtime`` or ``facade``.
"""
