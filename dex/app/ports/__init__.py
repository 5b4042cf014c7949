"""Ports: what the application needs from outside it, in domain terms.

Owns the store port (:mod:`.store`) with the records of claimed tasks (:mod:`.tasks`) and of
activity steps' attempts (:mod:`.attempts`), the
schedule and transaction-step ports (:mod:`.schedules`, :mod:`.transactions`), the answers of
updates (:mod:`.updates`), published values and streams (:mod:`.streams`), telemetry and
tracing hooks (:mod:`.telemetry`, :mod:`.tracing`), clocks (:mod:`.clock`) and run ids
(:mod:`.ids`). Adapters (``dex.adapters``) implement them.

May import ``dex.domain`` only.
"""
