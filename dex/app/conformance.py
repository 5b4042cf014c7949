"""Checks for mypy that the facade keeps its promises: ``dex.app.aio`` casts the engine to the
``EngineCalls`` protocol, which mypy would otherwise never hold ``Engine`` to. Nothing imports
this module; ``mypy dex`` (tests/unit/test_typing.py) checks it, and fails when they drift."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dex.app.aio import EngineCalls
    from dex.app.engine import Engine

    _ENGINE_CALLS: type[EngineCalls] = Engine
