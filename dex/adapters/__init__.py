"""Adapters: implementations of the ports in :mod:`dex.app.ports.store`."""
