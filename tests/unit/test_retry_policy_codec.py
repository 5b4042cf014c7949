"""A retry policy's bytes, as every activity task carries them: the caches of its encoding and
decoding (``dex.serialization.values``) give what the generated classes give."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dex.domain.retry import RetryPolicy
from dex.serialization import values
from dex.serialization.values import decode_retry_policy, encode_retry_policy, retry_policy_to_proto

policies = st.builds(
    RetryPolicy,
    initial_delay=st.timedeltas(timedelta(microseconds=1), timedelta(days=30)),
    multiplier=st.floats(1, 10),
    randomization_factor=st.floats(0, 1),
    max_delay=st.timedeltas(timedelta(microseconds=1), timedelta(days=30)),
    max_attempts=st.integers(1, 2**31 - 1),
)


@given(policies)
def test_a_policy_encodes_as_the_generated_classes_do_and_decodes_to_itself(policy: RetryPolicy) -> None:
    for _ in range(2):  # the first time fills the caches, the second reads them
        data = encode_retry_policy(policy)
        assert data == retry_policy_to_proto(policy).SerializeToString()
        assert decode_retry_policy(data) == policy


def test_equal_numbers_of_other_types_are_not_taken_for_each_other() -> None:
    """6 == 6.0, but only an int is an int32: a float count is refused however often an int one
    was encoded before (the cache's key holds the numbers' types)."""
    encode_retry_policy(RetryPolicy(max_attempts=6))
    with pytest.raises(TypeError):
        encode_retry_policy(RetryPolicy(max_attempts=6.0))  # type: ignore[arg-type]
    assert encode_retry_policy(RetryPolicy(multiplier=2)) == encode_retry_policy(RetryPolicy(multiplier=2.0))


def test_bytes_that_are_no_policy_are_refused_each_time() -> None:
    for _ in range(2):  # a failure is not remembered as a policy
        with pytest.raises(ValueError, match="cannot decode a retry policy"):
            decode_retry_policy(b"\xff\xff\xff")


def test_the_caches_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "_POLICY_CACHE_SIZE", 4)
    monkeypatch.setattr(values, "_encoded_policies", {})
    monkeypatch.setattr(values, "_decoded_policies", {})
    for attempts in range(1, 20):
        decode_retry_policy(encode_retry_policy(RetryPolicy(max_attempts=attempts)))
        assert len(values._encoded_policies) <= 4 and len(values._decoded_policies) <= 4
