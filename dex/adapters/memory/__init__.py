"""The in-memory adapter: deterministic, single-process, driven by an injectable clock."""

from dex.adapters.memory.store import InMemoryAdapter

__all__ = ["InMemoryAdapter"]
