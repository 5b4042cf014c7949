"""A request checked against what the OpenAPI document says of it, before its handler runs.

Each ``/v1`` operation declares the JSON Schema of its path and query parameters and of its
body (:mod:`dex.web.operations`); the document shows exactly those schemas, and this module
refuses, with a 400 naming the field and the rule, whatever they rule out: a value of the wrong
type, out of its range, not matching its pattern (a NUL or a lone surrogate is outside every
documented string), a required field missing. So the document and the server cannot drift
apart: what the document allows reaches the handler, what it rules out never does. A value of
the right form that dex refuses for what it means (arguments the workflow cannot take, a fork
point the run's history has not) is the handler's to answer (409, 422).

Only the keywords the declarations use are understood (``KEYWORDS``); ``tests/web`` checks that
every declared schema keeps to them, so a keyword added later cannot be shown and not enforced.
JSON Schema's rules are followed where Python's differ: ``49.0`` is an integer, ``true`` is not
a number, and a pattern matches anywhere unless anchored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from dex.web.errors import bad_request

KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "properties",
        "required",
        "additionalProperties",
        "propertyNames",
        "items",
        "minItems",
        "maxItems",
        "format",
        "anyOf",
        # annotations only
        "description",
        "default",
        "examples",
        "title",
    }
)
# RFC 3339 (what OpenAPI's date-time is): a date, a time and an offset; a space for the offset's
# "+" too, which an unencoded "+" in a query string turns into
DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+\- ]\d{2}:\d{2})")
_SHOWN = 60  # characters of a refused value shown in the message
# text PostgreSQL can store: no NUL (a regex escape, so the document stays plain JSON). A lone
# surrogate is not Unicode text at all (RFC 8259 leaves such strings undefined, and the regex
# engines of the tools that read the document refuse to name one), so a string under this
# pattern that holds one is refused with it (see _string_problem)
NO_NUL = "^[^\\x00]*$"


def check(value: Any, schema: Mapping[str, Any], where: str) -> None:
    """Raise a 400 naming ``where`` unless ``value`` (JSON data) is valid under ``schema``."""
    problem = _problem(value, schema, where)
    if problem is not None:
        raise bad_request(problem)


def check_text(text: str, schema: Mapping[str, Any], where: str) -> None:
    """A path or query parameter's text, read as the type ``schema`` names, then checked."""
    check(_from_text(text, schema, where), schema, where)


def _from_text(text: str, schema: Mapping[str, Any], where: str) -> Any:
    kinds = _types(schema)
    if "integer" in kinds and re.fullmatch(r"-?[0-9]{1,40}", text):
        return int(text)
    if kinds and "string" not in kinds:
        if "integer" in kinds:
            raise bad_request(f"{where} must be an integer, got {_shown(text)}")
        raise bad_request(f"{where} must be of type {' or '.join(kinds)}, got {_shown(text)}")
    return text


def _problem(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    kinds = _types(schema)
    if kinds and not any(_is(value, kind) for kind in kinds):
        return f"{where} must be of type {' or '.join(kinds)}, got {_json_type(value)}"
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        options = ", ".join(str(option) for option in schema["enum"][:20])
        return f"{where} must be one of {options}, got {_shown(value)}"
    problem = _own_problem(value, schema, where)
    if problem is None and "anyOf" in schema:
        found = [_problem(value, option, where) for option in schema["anyOf"]]
        if None not in found:  # the alternative that got furthest says most: not the one of another name
            problem = next((text for text in found if text is not None and " must be one of " not in text), found[0])
    return problem


def _own_problem(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    if isinstance(value, str):
        return _string_problem(value, schema, where)
    if _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be at least {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be at most {schema['maximum']}, got {value}"
    if isinstance(value, list):
        return _array_problem(value, schema, where)
    if isinstance(value, dict):
        return _object_problem(value, schema, where)
    return None


def _string_problem(value: str, schema: Mapping[str, Any], where: str) -> str | None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        return f"{where} must be at least {schema['minLength']} characters long, got {_shown(value)}"
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return f"{where} must be at most {schema['maxLength']} characters long, got {len(value)}"
    if schema.get("pattern") == NO_NUL:
        if "\x00" in value or not _is_unicode(value):
            return f"{where} must not contain a NUL character or a lone surrogate, got {_shown(value)}"
    elif "pattern" in schema and _regex(schema["pattern"]).search(value) is None:
        return f"{where} must match {schema['pattern']}, got {_shown(value)}"
    if schema.get("format") == "date-time" and not _is_date_time(value):
        return f"{where} must be an RFC 3339 time with an offset (2026-01-05T02:00:00Z), got {_shown(value)}"
    return None


def _array_problem(value: list[Any], schema: Mapping[str, Any], where: str) -> str | None:
    if "minItems" in schema and len(value) < schema["minItems"]:
        return f"{where} must hold at least {schema['minItems']} items, got {len(value)}"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{where} must hold at most {schema['maxItems']} items, got {len(value)}"
    items = schema.get("items")
    if items is not None:
        for index, item in enumerate(value):
            problem = _problem(item, items, f"{where}[{index}]")
            if problem is not None:
                return problem
    return None


def _object_problem(value: dict[str, Any], schema: Mapping[str, Any], where: str) -> str | None:
    prefix = f"{where}." if where else ""
    for name in schema.get("required", ()):
        if name not in value:
            return f"{prefix}{name} is required"
    properties: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    names = schema.get("propertyNames")
    for key, item in value.items():
        problem = _problem(key, names, f"a key of {where or 'the body'}") if names is not None else None
        if problem is not None:
            return problem
        if key in properties:
            problem = _problem(item, properties[key], prefix + key)
        elif extra is False:
            problem = f"{where or 'the body'} has no field {_shown(key)}"
        elif isinstance(extra, Mapping):
            problem = _problem(item, extra, f"{prefix}{_shown(key)}")
        if problem is not None:
            return problem
    return None


def _types(schema: Mapping[str, Any]) -> tuple[str, ...]:
    kind = schema.get("type")
    if kind is None:
        return ()
    return (kind,) if isinstance(kind, str) else tuple(kind)


def _is(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":  # JSON Schema: a number whose fraction is zero, 49.0 included
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    raise ValueError(f"the schema names an unknown type {kind!r}")


def _same(value: Any, option: Any) -> bool:
    return type(value) is type(option) and value == option  # 1 is not true, as in JSON


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _is_date_time(text: str) -> bool:
    if DATE_TIME.fullmatch(text) is None:
        return False
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00").replace(" ", "+"))
    except ValueError:  # month 13, hour 25
        return False
    return True


def _json_type(value: Any) -> str:
    for kind in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _is(value, kind):
            return kind
    return type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


@lru_cache(maxsize=64)
def _regex(pattern: str) -> re.Pattern[str]:
    # a pattern is ECMA-262's, whose final $ is the end of the text; Python's $ also matches
    # before a final newline ("name\n" would pass a name's pattern), \Z does not
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + "\\Z"
    return re.compile(pattern)
