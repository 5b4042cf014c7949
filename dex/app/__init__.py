"""The application layer: ports, registry, engine facade, workers and schedulers.

It depends on :mod:`dex.domain` and on the payload/history codecs in :mod:`dex.serialization`,
never on an adapter; adapters implement the ports declared in :mod:`dex.app.ports.store`.
"""
