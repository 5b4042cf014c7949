"""What an activity writes to its run's streams: ``dex.activity_context().write_stream(key, value)``
(docs/reference/contract.md §14).

An item is checked (its key) and encoded in the activity's thread, then appended by the store at
once, outside any workflow task: readers see it while the attempt goes on. Nothing of it is
recorded in the history, so an attempt that is retried writes its items again (at least once,
like the activity itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dex.app.ports.store import Store
from dex.domain.definitions import PayloadConverter, validate_key


class ActivityStreams:
    """Writes activities' stream items to ``store``, values encoded by ``converter``."""

    def __init__(self, store: Store, converter: PayloadConverter) -> None:
        self._store, self._converter = store, converter

    def writer(self, run_id: str) -> Callable[[str, Any], None]:
        """The ``write_stream`` of an attempt for ``run_id``."""
        return lambda key, value: self.write(run_id, key, value)

    def write(self, run_id: str, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"stream key must be a str, got {type(key).__name__}")
        checked = validate_key(key, "stream key")
        assert checked is not None
        payload = self._converter.encode(value)
        self._store.write_stream_items(run_id, [(checked, payload)], self._store.clock.now())
