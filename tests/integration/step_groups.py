"""What the transaction-step tests share: the groups an adapter writes, counted."""

from __future__ import annotations

from typing import Any

from dex.adapters.postgres import PostgresAdapter


def count_groups(adapter: PostgresAdapter) -> list[int]:
    """Have ``adapter`` record the size of each group of steps it writes
    (``checkpoint_steps``); the list the sizes go to."""
    groups: list[int] = []
    real = adapter.checkpoint_steps

    def counted(items: Any, now: Any) -> Any:
        groups.append(len(items))
        return real(items, now)

    adapter.checkpoint_steps = counted  # type: ignore[method-assign]
    return groups
