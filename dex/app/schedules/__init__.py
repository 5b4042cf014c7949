"""Schedules: a workflow started on a calendar or an interval.

Owns the ``dex.Schedule`` value (:mod:`.spec`), fire times (:mod:`.times`), the leader's step
that starts due fires (:mod:`.runner`) and the management calls behind ``Engine.create_schedule``
and the rest (:mod:`.calls`).

May import ``definitions``, ``ports`` and ``dex.domain``; never ``machinery`` or a package above.
"""
