"""FailureInfo: built from any exception without raising, its texts always storable (docs/reference/contract.md §8)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dex
from dex.domain.definitions import validate_text
from dex.domain.values import MAX_CAUSES, FailureInfo, visible_text
from dex.serialization.values import decode_failure, encode_failure


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


class RaisesBaseException(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt


class HostileProperties(dex.ApplicationError):
    @property
    def terminal(self) -> bool:  # type: ignore[override]
        raise RuntimeError("no terminal")

    @terminal.setter
    def terminal(self, value: bool) -> None:
        pass

    @property
    def failure(self) -> FailureInfo:
        raise RuntimeError("no failure")


class UnformattableTraceback(Exception):
    @property
    def __notes__(self) -> list[str]:  # traceback formatting reads it
        raise RuntimeError("no notes")


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (Unprintable(), "<unprintable Unprintable: __str__ raised RuntimeError>"),
        (RaisesBaseException(), "<unprintable RaisesBaseException: __str__ raised KeyboardInterrupt>"),
        (ValueError("a\ud800b"), "a\\ud800b"),
        (ValueError("a\x00b"), "a\x00b"),
    ],
    ids=["str-raises", "str-raises-base-exception", "surrogate", "nul"],
)
def test_a_hostile_exception_is_described_not_raised(exc: BaseException, message: str) -> None:
    failure = FailureInfo.from_exception(_raised(exc))
    assert failure.message == message
    assert failure.type == type(exc).__name__
    assert decode_failure(encode_failure(failure)) == failure  # storable as it is


def test_hostile_properties_read_as_absent() -> None:
    failure = FailureInfo.from_exception(_raised(HostileProperties("boom")))
    assert (failure.message, failure.terminal, failure.cause) == ("boom", False, None)


def test_a_traceback_that_cannot_be_formatted_degrades_to_its_frames() -> None:
    failure = FailureInfo.from_exception(_raised(UnformattableTraceback("x")))
    assert failure.message == "x"
    assert "its traceback could not be formatted" in failure.stack_trace
    assert "_raised" in failure.stack_trace  # the frames are still there


def test_a_cycle_of_causes_ends_where_it_comes_back() -> None:
    first, second = ValueError("first"), KeyError("second")
    first.__cause__, second.__cause__ = second, first
    failure = FailureInfo.from_exception(first)
    assert failure.cause is not None and failure.cause.message == "'second'"
    assert failure.cause.cause is None


def test_a_very_long_chain_of_causes_is_cut_short_without_recursion() -> None:
    exc: BaseException = ValueError("0")
    for index in range(1, 5000):
        outer = ValueError(str(index))
        outer.__cause__ = exc
        exc = outer
    failure = FailureInfo.from_exception(exc)
    depth = 0
    cursor: FailureInfo | None = failure
    while cursor is not None:
        depth, cursor = depth + 1, cursor.cause
    assert depth == MAX_CAUSES + 1


def test_a_carried_failure_still_becomes_the_cause() -> None:
    inner = FailureInfo(type="E", message="inner")
    failure = FailureInfo.from_exception(dex.ActivityFailedError("outer", inner))
    assert failure.cause == inner


def test_failure_texts_built_by_hand_are_escaped_too() -> None:
    failure = FailureInfo(type="T\ud800", message="m\udfff", stack_trace="s\ud800")
    assert (failure.type, failure.message, failure.stack_trace) == ("T\\ud800", "m\\udfff", "s\\ud800")
    assert decode_failure(encode_failure(failure)) == failure


@given(st.text())
def test_visible_text_keeps_every_encodable_text(text: str) -> None:
    assert visible_text(text) == text


@pytest.mark.parametrize("value", ["a\x00b", "\ud800", "x\udfffy"])
def test_validate_text_names_the_field(value: str) -> None:
    with pytest.raises(ValueError, match="my_field"):
        validate_text(value, "my_field")


def test_validate_text_takes_a_str_subclass_as_plain_text() -> None:
    class Name(str):
        pass

    checked = validate_text(Name("n"), "name")
    assert checked == "n" and type(checked) is str
    with pytest.raises(TypeError, match="name must be a str, got int"):
        validate_text(1, "name")


def test_application_error_takes_its_arguments_as_spec_writes_them() -> None:
    # docs/reference/contract.md §4: ApplicationError(msg, terminal=False, retry_after=None), positionally or by name
    positional = dex.ApplicationError("later", True, 5)
    assert (positional.message, positional.terminal, positional.retry_after) == ("later", True, timedelta(seconds=5))
    named = dex.ApplicationError("later", retry_after=timedelta(minutes=1))
    assert (named.terminal, named.retry_after) == (False, timedelta(minutes=1))
    assert dex.TerminalError("stop").terminal is True
