"""The payload converter: Python values to :class:`~dex.domain.values.Payload` and back (docs/reference/contract.md §2).

Three encodings cover everything dex sends:

* ``json/plain`` — JSON-compatible values (None, bool, int, float, str, lists, tuples, dicts
  with str keys), the standard library's value types (datetime, Decimal, UUID, sets ... in the
  JSON form :mod:`dex.serialization.typed_values` gives them), attrs classes, dataclasses and
  pydantic models: cattrs unstructures each to JSON data first and structures it back from the
  receiver's type hint (docs/decisions/typed-values.md). Without a hint, the JSON data comes back;
* ``binary/plain`` — a ``bytes`` value, as is (a ``bytearray`` too: it comes back as ``bytes``,
  or as a ``bytearray`` where the receiver's hint asks for one);
* ``binary/protobuf`` — a protobuf message, with its full name in ``message_type``.

Anything else raises :class:`~dex.domain.errors.SerializationError` naming the type and where
it was found, so a user learns at the call that tried to send it, not on some worker later.
Nothing is ever pickled. A subclass registers its own types (:meth:`PayloadConverter.register`);
whatever its hooks raise, even an exception that cannot be printed, becomes a
:class:`SerializationError` of the one value they were given.

Values nest at most :data:`MAX_NESTING` levels deep (lists, tuples, dicts, attrs classes and
dataclasses inside each other; a protobuf message's own messages). The limit is checked
without recursion when a value is encoded, so it does not depend on how deep the caller's own
stack is: whatever ``start_workflow`` accepts can be decoded and sent on from workflow code to
an activity, from any thread, and protobuf's parser (which stops at 100 levels) reads back
every message that was sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import types
import typing
from typing import Any

import attrs
import cattrs
from cattrs.v import format_exception
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from dex.domain.errors import SerializationError
from dex.domain.values import Payload
from dex.serialization.pydantic_models import register_pydantic_models
from dex.serialization.typed_values import register_typed_values

JSON_PLAIN = "json/plain"
BINARY_PLAIN = "binary/plain"
BINARY_PROTOBUF = "binary/protobuf"

DEFAULT_MAX_PAYLOAD_SIZE = 2 * 1024 * 1024
# how deep containers may nest in a payload: far below Python's recursion limit (so encoding and
# decoding never depend on the stack they run on), and protobuf's parser's own limit
MAX_NESTING = 100
# a protobuf message nested deeper than MAX_NESTING has at least this many bytes (a tag and a
# length per level), so a shorter one needs no check
_SHALLOW_PROTOBUF = 2 * MAX_NESTING

_ACCEPTED = (
    "dex sends only JSON-compatible values (None, bool, int, float, str, list, dict with str keys), "
    "bytes, protobuf messages, datetime, date, time, timedelta, Decimal, UUID, Enum, tuples, sets, "
    "attrs classes, dataclasses, pydantic models and the types the engine's converter registers"
)
_NO_HINT: tuple[object, ...] = (None, Any, object, type(None))
_T = typing.TypeVar("_T")


class PayloadConverter:
    """Encodes values into payloads and decodes them back, guided by a type hint.

    Implements the domain's ``PayloadConverter`` protocol. ``max_payload_size`` bounds the
    encoded data in bytes; a larger value raises :class:`SerializationError` when encoded.
    Each instance owns its cattrs converter, so two engines never share hooks.

    For a type of one's own, subclass it and register the type in ``__init__``, then pass an
    instance to ``Engine(converter=...)`` (docs/how-to/typed-arguments.md):

    ```python
    class ShopConverter(dex.PayloadConverter):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            self.register(Money, encode=Money.to_text, decode=Money.parse)
    ```
    """

    def __init__(self, *, max_payload_size: int = DEFAULT_MAX_PAYLOAD_SIZE) -> None:
        if max_payload_size < 1:
            raise ValueError(f"max_payload_size must be positive, got {max_payload_size}")
        self.max_payload_size = max_payload_size
        self._cattrs = _make_cattrs_converter()

    def register(
        self, cls: type[_T], *, encode: typing.Callable[[_T], Any], decode: typing.Callable[[Any], _T]
    ) -> None:
        """Send values of ``cls`` (and its subclasses) as ``encode(value)``, JSON data, and make
        them again with ``decode(data)`` where a type hint names ``cls``; wherever they appear
        (an argument, a field, a list item). ``encode`` must return JSON-compatible values (the
        types above included); what ``decode`` raises is reported as the payload not fitting
        the hint. Call it from a subclass's ``__init__``: an engine's converter is complete
        when the engine gets it."""
        self._cattrs.register_unstructure_hook(cls, guarded(encode))
        self._cattrs.register_structure_hook(cls, guarded(lambda data, _cls: decode(data)))

    @property
    def cattrs_converter(self) -> cattrs.Converter:
        """The cattrs converter underneath, for hooks :meth:`register` cannot express (a hook
        factory for a family of types, say): cattrs' own API, used in a subclass's ``__init__``.
        A hook registered here directly should raise ordinary exceptions: unlike those of
        :meth:`register`, a ``BaseException`` from it is not turned into a refusal."""
        return self._cattrs

    def encode(self, value: object) -> Payload:
        """Turn ``value`` into a payload; raise :class:`SerializationError` if it cannot be sent."""
        if isinstance(value, (bytes, bytearray)):
            payload = Payload(encoding=BINARY_PLAIN, data=bytes(value))
        elif isinstance(value, ProtoMessage):
            # Deterministic output keeps replayed arguments byte-equal (map fields are sorted).
            payload = Payload(
                encoding=BINARY_PROTOBUF,
                data=value.SerializeToString(deterministic=True),
                message_type=value.DESCRIPTOR.full_name,
            )
            if len(payload.data) > _SHALLOW_PROTOBUF:
                _check_protobuf_reads_back(value, payload.data)
        else:
            payload = Payload(encoding=JSON_PLAIN, data=self._encode_json(value))
        if len(payload.data) > self.max_payload_size:
            raise SerializationError(
                f"payload of {len(payload.data)} bytes exceeds the limit of {self.max_payload_size} bytes"
            )
        return payload

    def decode(self, payload: Payload, hint: object = None) -> Any:
        """Read the value in ``payload``; ``hint`` (a type) restores classes and checks the shape.

        With no hint (None, ``typing.Any`` or ``object``) JSON payloads come back as plain data.
        """
        if payload.encoding == JSON_PLAIN:
            return self._decode_json(payload, hint)
        if payload.encoding == BINARY_PLAIN:
            if hint is bytearray:
                return bytearray(payload.data)
            return _check_instance(bytes(payload.data), hint)
        if payload.encoding == BINARY_PROTOBUF:
            return _check_instance(_decode_protobuf(payload, hint), hint)
        raise SerializationError(f"unknown payload encoding {payload.encoding!r}")

    def _encode_json(self, value: object) -> bytes:
        # the common cases, without cattrs and the walk below (the long way reports the errors:
        # an int too long for str(), a string with a lone surrogate)
        if type(value) is int:
            with contextlib.suppress(ValueError):
                return str(value).encode("utf-8")
        elif type(value) is str:
            with contextlib.suppress(ValueError):
                return json.dumps(value, ensure_ascii=False).encode("utf-8")
        try:
            data = self._cattrs.unstructure(value)
            # cattrs passes objects it does not know through unchanged, so check the result.
            _validate_json(data, ())
            text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
            return text.encode("utf-8")
        except SerializationError:
            raise
        except RecursionError:  # far deeper than MAX_NESTING, or it contains itself
            raise SerializationError(
                f"value of type {_type_name(value)} is not serialisable: it is nested too deeply or contains "
                f"itself (values may nest at most {MAX_NESTING} levels deep)"
            ) from None
        except UnicodeEncodeError as exc:
            raise SerializationError(
                f"value of type {_type_name(value)} is not serialisable: it holds a string that is not valid Unicode ({exc.reason})"
            ) from None
        except Exception as exc:
            # cattrs fails on a dict key it cannot keep (a tuple key becomes a list); say where
            found = _bad_key(value, ())
            if found is not None:
                container, path, key = found
                raise SerializationError(_key_refused(container, path, key)) from None
            raise SerializationError(f"value of type {_type_name(value)} is not serialisable: {_problem(exc)}") from exc

    def _decode_json(self, payload: Payload, hint: object) -> Any:
        try:
            data = json.loads(payload.data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise SerializationError(f"payload is not valid UTF-8 JSON: {exc}") from exc
        if not _wants_structuring(hint):
            return data
        plain = _PLAIN.get(hint) if isinstance(hint, type) else None
        if plain is not None and type(data) in plain:
            return typing.cast(Any, hint)(data)
        try:
            return self._cattrs.structure(data, typing.cast(Any, hint))
        except Exception as exc:
            details = "; ".join(cattrs.transform_error(exc, format_exception=_described))
            raise SerializationError(f"cannot decode the payload as {describe_hint(hint)}: {details}") from exc


# the JSON types each plain hint takes as it is (what the strict hooks below accept, minus
# their errors, which the cattrs path raises): a bool is no int here, an int is a float
_PLAIN: dict[type, tuple[type, ...]] = {int: (int,), str: (str,), bool: (bool,), float: (int, float)}


def describe_hint(hint: object) -> str:
    """A short readable name of a type hint, for error messages."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__qualname__
    return repr(hint).replace("typing.", "")


def _make_cattrs_converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    # Some messages (Struct, ListValue) pose as mappings or sequences; keep every message whole so
    # that the JSON check refuses it inside a container, as it does all other messages.
    converter.register_unstructure_hook_func(_is_message_class, lambda message: message)
    # cattrs calls int(x), str(x) ... on primitives, which would turn 1.5 into 1 or 5 into "5";
    # a payload that does not match its hint is a bug to report, not to paper over.
    converter.register_structure_hook(int, _strict_primitive((int,), "an int"))
    converter.register_structure_hook(bool, _strict_primitive((bool,), "a bool"))
    converter.register_structure_hook(float, _strict_primitive((int, float), "a number"))
    converter.register_structure_hook(str, _strict_primitive((str,), "a str"))
    register_typed_values(converter)
    register_pydantic_models(converter, guarded)
    # `object` (as in dict[str, object]) accepts any JSON value as it is, like Any
    # (a predicate, not a class hook: a hook on `object` would catch every class)
    converter.register_structure_hook_func(lambda cls: cls is object, lambda value, _cls: value)
    return converter


class HookRaisedError(Exception):
    """A ``BaseException`` that user code in a converter hook raised (a ``SystemExit``, a
    ``KeyboardInterrupt`` of its own making), carried as an ordinary error: it becomes the one
    value's :class:`SerializationError`, with cattrs' path to it, and never escapes a worker."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__()
        self.raised = raised

    def __str__(self) -> str:
        return _problem(self.raised)


_F = typing.TypeVar("_F", bound=typing.Callable[..., Any])


def guarded(hook: _F) -> _F:
    """``hook`` (user code), what it raises that is no ``Exception`` raised as :class:`HookRaisedError`."""

    def call(*args: Any) -> Any:
        try:
            return hook(*args)
        except Exception:
            raise
        except BaseException as exc:  # noqa: BLE001 - user code's: the one value's refusal, not the process's
            raise HookRaisedError(exc) from None

    return typing.cast(_F, call)


def _problem(exc: BaseException) -> str:
    """What went wrong, in one line that can always be printed (a hook's exception may not be)."""
    if isinstance(exc, HookRaisedError):
        return _problem(exc.raised)
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    try:
        text = str(exc)
    except BaseException as error:  # noqa: BLE001 - the refusal must be readable all the same
        return f"<unprintable {type(exc).__name__}: __str__ raised {type(error).__name__}>"
    text = " ".join(text.split())
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, (TypeError, ValueError)) or not text else text


def _described(exc: BaseException, hint: type | None) -> str:
    """cattrs' words for one error at one place, with the error's own text where it says more
    (why a date did not parse, what a pydantic model's validators said)."""
    try:
        text = format_exception(exc, hint)
    except BaseException:  # noqa: BLE001 - cattrs prints some errors itself: this one cannot be
        text = "invalid value"
    if isinstance(exc, ValueError):  # a TypeError's text is cattrs' already, or a wrong JSON type
        detail = _problem(exc)
        if detail and detail not in text:
            text += f" ({detail})"
    elif not isinstance(exc, (KeyError, TypeError, cattrs.ForbiddenExtraKeysError, AttributeError)):
        text = f"invalid value ({_problem(exc)})"
    return text


def _is_message_class(cls: object) -> bool:
    return isinstance(cls, type) and issubclass(cls, ProtoMessage)


def _strict_primitive(accepts: tuple[type, ...], expected: str) -> typing.Callable[[Any, type], Any]:
    def structure(value: Any, cls: type) -> Any:
        if issubclass(cls, enum.Enum):  # IntEnum / StrEnum reach this hook through their base
            return typing.cast(Any, cls)(value)
        if isinstance(value, bool) and bool not in accepts and cls is not bool:
            raise TypeError(f"expected {expected}, got bool")
        if not isinstance(value, accepts):
            raise TypeError(f"expected {expected}, got {type(value).__name__}")
        return typing.cast(Any, cls)(value)

    return structure


def _validate_json(data: object, path: tuple[object, ...]) -> None:
    """Raise :class:`SerializationError` naming the first value in ``data`` JSON cannot hold,
    or the first container nested deeper than :data:`MAX_NESTING`. Loops, not recursion: its
    own depth does not depend on the caller's stack. A walk level by level finds whether there
    is a problem without building a path per value; only then does :func:`_explain` find where."""
    level: list[object] = [data]
    depth = len(path)
    while level:
        below: list[object] = []
        for item in level:
            kind = type(item)
            if item is None or kind in _SCALARS:
                continue
            if kind is list or kind is tuple:
                below.extend(typing.cast("list[object]", item))
            elif kind is dict and all(type(key) is str for key in typing.cast("dict[object, object]", item)):
                below.extend(typing.cast("dict[object, object]", item).values())
            else:  # a key that is no str, a subclass, a value JSON cannot hold: the long way
                _explain(data, path)  # validates the whole value, and raises if it must
                return
        depth += 1  # how deep the containers just looked at are (the outermost: 1); `below` is one deeper
        if depth >= MAX_NESTING and any(isinstance(item, (list, tuple, dict)) for item in below):
            _explain(data, path)
            return
        level = below


_SCALARS = frozenset((bool, int, float, str))


def _explain(data: object, path: tuple[object, ...]) -> None:
    """What :func:`_validate_json` raises, found with the path to it (only when there is one)."""
    pending: list[tuple[object, tuple[object, ...]]] = [(data, path)]
    while pending:
        data, path = pending.pop()
        if data is None or isinstance(data, (bool, int, float, str)):
            continue
        if isinstance(data, (list, tuple, dict)):
            if len(path) >= MAX_NESTING:
                raise SerializationError(_too_deep(data, path))
            if isinstance(data, dict):
                for key in data:
                    if not isinstance(key, str):
                        raise SerializationError(_key_refused(data, path, key))
                items: list[tuple[object, tuple[object, ...]]] = [(item, (*path, key)) for key, item in data.items()]
            else:
                items = [(item, (*path, index)) for index, item in enumerate(data)]
            pending.extend(reversed(items))  # the first item is looked at first
            continue
        if isinstance(data, ProtoMessage):
            reason = "protobuf messages can be sent only as a whole value, not inside a list, dict or class"
        else:
            reason = _ACCEPTED
        raise SerializationError(f"{_where(data, path)} is not serialisable: {reason}")


def nesting_problem(value: object) -> str | None:
    """Why the JSON value ``value`` nests too deeply to be a payload (as JSON parsers give it:
    lists and dicts), or None; without recursion."""
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (list, tuple, dict)):
            if depth >= MAX_NESTING:
                return f"it is nested more than {MAX_NESTING} levels deep"
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return None


def _too_deep(data: object, path: tuple[object, ...]) -> str:
    shown = "".join(f"[{step!r}]" for step in path[:5])
    return (
        f"value of type {_type_name(data)} at {shown}... (depth {len(path) + 1}) is not serialisable: "
        f"values may nest at most {MAX_NESTING} levels deep (lists, dicts and classes inside each other)"
    )


def _check_protobuf_reads_back(message: ProtoMessage, data: bytes) -> None:
    """Refuse a message protobuf's own parser would refuse to read back (nested more than its
    limit of 100 messages deep): found here, not by the workflow or activity it was sent to."""
    try:
        type(message).FromString(data)
    except DecodeError as exc:
        raise SerializationError(
            f"protobuf message {message.DESCRIPTOR.full_name} is not serialisable: it cannot be read back "
            f"(nested more than {MAX_NESTING} levels deep?): {exc}"
        ) from None


def _key_refused(container: object, path: tuple[object, ...], key: object) -> str:
    return (
        f"{_where(container, path)} is not serialisable: its key {key!r} is of type "
        f"{_type_name(key)}; only str keys are allowed"
    )


_Found = tuple[object, tuple[object, ...], object]  # the dict, where it sits, its key


def _bad_key(value: object, path: tuple[object, ...], depth: int = 0) -> _Found | None:
    """The first dict (with its path) in ``value`` whose key is not a str, and that key.

    Looks into dicts, lists, tuples and the fields of attrs classes and dataclasses: only run
    when encoding failed, to tell the user where."""
    if depth > 100:
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return value, path, key
            found = _bad_key(item, (*path, key), depth + 1)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _bad_key(item, (*path, index), depth + 1)
            if found is not None:
                return found
    elif attrs.has(type(value)) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        cls: Any = type(value)
        names = [f.name for f in (attrs.fields(cls) if attrs.has(cls) else dataclasses.fields(cls))]
        for name in names:
            found = _bad_key(getattr(value, name, None), (*path, name), depth + 1)
            if found is not None:
                return found
    return None


def _where(value: object, path: tuple[object, ...]) -> str:
    text = f"value of type {_type_name(value)}"
    if path:
        text += " at " + "".join(f"[{step!r}]" for step in path)
    return text


def _type_name(value: object) -> str:
    return type(value).__qualname__


def _wants_structuring(hint: object) -> bool:
    # Unresolved forward references (strings) and type variables carry no usable type.
    return not (hint in _NO_HINT or isinstance(hint, (str, typing.TypeVar)))


def _union_members(hint: object) -> tuple[object, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(arg for arg in typing.get_args(hint) if arg is not type(None))
    return (hint,)


def _message_class_of(hint: object) -> type[ProtoMessage] | None:
    for member in _union_members(hint):
        if isinstance(member, type) and issubclass(member, ProtoMessage):
            return member
    return None


def _decode_protobuf(payload: Payload, hint: object) -> ProtoMessage:
    cls = _message_class_of(hint)
    if cls is None:
        try:
            descriptor = descriptor_pool.Default().FindMessageTypeByName(payload.message_type)
        except KeyError:
            raise SerializationError(
                f"unknown protobuf message type {payload.message_type!r}: import its _pb2 module or give a type hint"
            ) from None
        cls = message_factory.GetMessageClass(descriptor)
    elif payload.message_type and cls.DESCRIPTOR.full_name != payload.message_type:
        raise SerializationError(
            f"payload holds a {payload.message_type} message, not the {cls.DESCRIPTOR.full_name} of "
            f"the type hint {describe_hint(hint)}"
        )
    try:
        return cls.FromString(payload.data)
    except DecodeError as exc:
        raise SerializationError(f"cannot decode the payload as {cls.DESCRIPTOR.full_name}: {exc}") from exc


def _check_instance(value: object, hint: object) -> Any:
    """Return ``value`` if it can be what ``hint`` asks for; a JSON-free payload is never converted."""
    if not _wants_structuring(hint):
        return value
    classes = []
    for member in _union_members(hint):
        cls = typing.get_origin(member) or member
        if not isinstance(cls, type) or cls is object:
            return value  # a hint we cannot check with isinstance (Any in a union, Literal, ...)
        classes.append(cls)
    if not isinstance(value, tuple(classes)):
        raise SerializationError(
            f"cannot decode the payload as {describe_hint(hint)}: it holds a value of type {_type_name(value)}"
        )
    return value
