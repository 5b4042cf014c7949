"""Pydantic models in payloads, in pydantic's own JSON form (``pip install "dex-engine[pydantic]"``).

A model is encoded with ``model_dump(mode="json")`` and decoded with ``model_validate_json``, so
its own configuration (aliases, serializers, validators, base64 bytes) decides both directions,
exactly as it does for the model's JSON anywhere else.

dex never imports pydantic: a model can only be in a value if the program imported pydantic
already, so the hooks look for the module among those imported and stay out of the way when
it is not there.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import cattrs

_Hook = Callable[..., Any]


def register_pydantic_models(converter: cattrs.Converter, guarded: Callable[[_Hook], _Hook]) -> None:
    """Teach ``converter`` pydantic (v2) models, both ways; ``guarded`` wraps each hook, since
    a model's serializers and validators are user code."""
    converter.register_unstructure_hook_func(is_pydantic_model, guarded(_dump))
    converter.register_structure_hook_func(is_pydantic_model, guarded(_validate))


def is_pydantic_model(hint: object) -> bool:
    """Whether ``hint`` is a pydantic ``BaseModel`` class (False when pydantic was never imported)."""
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
    return base is not None and isinstance(hint, type) and issubclass(hint, base)


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True)  # what model_validate_json reads back


def _validate(value: Any, model: Any) -> Any:
    # through JSON text, so that the model's JSON-only settings (base64 bytes, say) apply;
    # ASCII escapes keep a lone surrogate from a payload a readable refusal, not a crash
    return model.model_validate_json(json.dumps(value))
