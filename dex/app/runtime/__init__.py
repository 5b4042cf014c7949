"""The runtime of a started engine: its parts built in one place, and what drives them.

Owns the assembly of an engine's workers, buffer, watchdog and pools (:mod:`.assembly`), from
what a simulation or a test may vary of them (:mod:`.options`, production defaults), the
rounds each background thread performs (:mod:`.rounds`), the coordinator that owns their
scheduling state (:mod:`.coordinator`: its state and the pure ``transition``, over the event and
command values of :mod:`.coordination`), the leader's duties
(:mod:`.leader`), and what ``Engine.health()`` reports (:mod:`.health`, :mod:`.long_polls`).

May import ``workflows``, ``activities``, ``machinery``, ``schedules``, ``definitions``,
``ports`` and ``dex.domain``; never ``facade``.
"""
