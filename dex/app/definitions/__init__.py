"""What application code declares and calls from inside its steps.

Owns the ``@dex.workflow``, ``@dex.activity`` and ``@dex.transaction`` decorators and the
per-engine registry they fill (:mod:`.registry`, :mod:`.transactions`), and
``dex.activity_context()`` (:mod:`.activity_context`).

May import ``ports`` and ``dex.domain`` only.
"""
