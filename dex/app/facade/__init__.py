"""The engine facade: ``dex.Engine`` and the services it is a thin face over.

Owns what an application calls: starting runs (:mod:`.starts`), sending them messages
(:mod:`.messages`), reading them (:mod:`.reads`, :mod:`.info`, their activity steps' attempts:
:mod:`.steps`), forking (:mod:`.fork`), queue
administration (:mod:`.queues`) and the asyncio face (:mod:`.aio`). :mod:`.engine` builds these
services and, when the engine starts, the runtime.

May import every other package of ``dex.app``, ``dex.domain`` and ``dex.serialization`` (the
default payload converter, histories exported as JSON); nothing below imports it.
"""
