"""The history codec: every domain event survives protobuf bytes exactly; bad bytes fail clearly."""

from __future__ import annotations

import typing
from datetime import UTC, datetime, timedelta, timezone

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dex.domain import events as ev
from dex.domain.retry import RetryPolicy
from dex.domain.status import RunStatus
from dex.domain.values import FailureInfo, Payload
from dex.serialization import history as codec
from dex.serialization import values as values_codec
from dex.v1 import history_pb2

# --- strategies ---------------------------------------------------------------------------

texts = st.text(max_size=20)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
optional_texts = st.none() | texts
# Timestamp covers exactly Python's datetime range (years 1..9999).
utc_datetimes = st.datetimes(timezones=st.just(UTC))
# Keep durations inside Duration's documented range (about +-10,000 years).
durations = st.timedeltas(min_value=timedelta(days=-3_650_000), max_value=timedelta(days=3_650_000))

payloads = st.builds(Payload, encoding=texts, data=st.binary(max_size=40), message_type=texts)
payload_tuples = st.lists(payloads, max_size=3).map(tuple)
labels = st.lists(st.tuples(texts, texts), max_size=4).map(tuple)
failures: st.SearchStrategy[FailureInfo] = st.recursive(
    st.builds(FailureInfo, type=texts, message=texts, stack_trace=texts, terminal=st.booleans(), cause=st.none()),
    lambda causes: st.builds(
        FailureInfo, type=texts, message=texts, stack_trace=texts, terminal=st.booleans(), cause=causes
    ),
    max_leaves=4,
)
retry_policies = st.builds(
    RetryPolicy,
    initial_delay=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3_650_000)),
    multiplier=st.floats(min_value=1, allow_nan=False, allow_infinity=False),
    randomization_factor=st.floats(min_value=0, max_value=1),
    max_delay=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3_650_000)),
    max_attempts=st.integers(min_value=1, max_value=2**31 - 1),
)

# One strategy per event class, with every field random; the test below checks none is missing.
EVENT_STRATEGIES: dict[type, st.SearchStrategy[typing.Any]] = {
    ev.RunCreated: st.builds(
        ev.RunCreated,
        workflow_name=texts,
        input=payload_tuples,
        queue=texts,
        instance_id=optional_texts,
        priority=int32s,
        concurrency_key=optional_texts,
        labels=labels,
        parent_run_id=optional_texts,
        generation=int64s,
        code_version=optional_texts,
        deadline=st.none() | utc_datetimes,
    ),
    ev.RunStarted: st.just(ev.RunStarted()),
    ev.WorkflowTaskStarted: st.just(ev.WorkflowTaskStarted()),
    ev.WorkflowTaskCompleted: st.just(ev.WorkflowTaskCompleted()),
    ev.ActivityTaskCreated: st.builds(
        ev.ActivityTaskCreated,
        name=texts,
        input=payload_tuples,
        queue=texts,
        priority=int32s,
        retry_policy=retry_policies,
        lock_timeout=durations,
    ),
    ev.ActivityTaskCompleted: st.builds(ev.ActivityTaskCompleted, created_seq=int64s, result=payloads),
    ev.ActivityTaskFailed: st.builds(ev.ActivityTaskFailed, created_seq=int64s, failure=failures),
    ev.TimerCreated: st.builds(ev.TimerCreated, fire_at=utc_datetimes),
    ev.TimerElapsed: st.builds(ev.TimerElapsed, created_seq=int64s),
    ev.ExternalEventReceived: st.builds(ev.ExternalEventReceived, event_id=texts, payload=payloads),
    ev.ChildRunCreated: st.builds(
        ev.ChildRunCreated,
        child_run_id=texts,
        workflow_name=texts,
        input=payload_tuples,
        queue=texts,
        instance_id=optional_texts,
        priority=int32s,
        concurrency_key=optional_texts,
        labels=labels,
        deadline=st.none() | utc_datetimes,
    ),
    ev.ChildRunCompleted: st.builds(ev.ChildRunCompleted, child_run_id=texts, result=payloads),
    ev.ChildRunFailed: st.builds(ev.ChildRunFailed, child_run_id=texts, failure=failures),
    ev.SideEffectExecuted: st.builds(ev.SideEffectExecuted, name=texts, result=payloads),
    ev.PatchApplied: st.builds(ev.PatchApplied, patch_id=texts),
    ev.RunSuspended: st.just(ev.RunSuspended()),
    ev.RunResumed: st.just(ev.RunResumed()),
    ev.RunCancelled: st.builds(ev.RunCancelled, reason=texts),
    ev.RunCompleted: st.builds(
        ev.RunCompleted,
        status=st.sampled_from(RunStatus),
        result=st.none() | payloads,
        failure=st.none() | failures,
    ),
    ev.RunTerminated: st.builds(ev.RunTerminated, reason=texts),
    ev.UpdateRequested: st.builds(ev.UpdateRequested, update_id=texts, name=texts, args=payload_tuples),
    ev.UpdateAccepted: st.builds(ev.UpdateAccepted, update_id=texts, name=texts, args=payload_tuples),
    ev.UpdateCompleted: st.builds(
        ev.UpdateCompleted, update_id=texts, result=st.none() | payloads, failure=st.none() | failures
    ),
    ev.ValuePublished: st.builds(ev.ValuePublished, key=texts, value=payloads),
    ev.StreamItemWritten: st.builds(ev.StreamItemWritten, key=texts, value=payloads),
    ev.StreamClosed: st.builds(ev.StreamClosed, key=texts),
    ev.LabelsChanged: st.builds(ev.LabelsChanged, set=labels, removed=st.lists(texts, max_size=3).map(tuple)),
    ev.CancelRequested: st.builds(ev.CancelRequested, created_seq=int64s),
    ev.DetachedRunCreated: st.builds(
        ev.DetachedRunCreated,
        run_id=texts,
        workflow_name=texts,
        input=payload_tuples,
        queue=texts,
        instance_id=optional_texts,
        priority=int32s,
        concurrency_key=optional_texts,
        labels=labels,
        deadline=st.none() | utc_datetimes,
    ),
}
events = st.one_of(*EVENT_STRATEGIES.values())
messages = st.one_of(*(EVENT_STRATEGIES[kind] for kind in ev.MESSAGE_TYPES))
history_events = st.builds(ev.HistoryEvent, sequence_number=int64s, timestamp=utc_datetimes, event=events)


def test_every_event_kind_has_a_strategy_and_a_proto_message() -> None:
    kinds = set(typing.get_args(ev.Event))
    assert set(EVENT_STRATEGIES) == kinds == set(ev.EVENT_TYPES)
    assert _oneof_message_names(history_pb2.HistoryEvent) == {kind.__name__ for kind in kinds}
    assert _oneof_message_names(history_pb2.InboxMessage) == {kind.__name__ for kind in ev.MESSAGE_TYPES}


def _oneof_message_names(envelope: typing.Any) -> set[str]:
    return {field.message_type.name for field in envelope.DESCRIPTOR.oneofs_by_name["event"].fields}


def test_proto_messages_have_the_fields_of_the_domain_events() -> None:
    for kind in ev.EVENT_TYPES:
        descriptor = getattr(history_pb2, kind.__name__).DESCRIPTOR
        assert set(descriptor.fields_by_name) == {a.name for a in attrs.fields(kind)}, kind.__name__


# --- round trips --------------------------------------------------------------------------


@given(history_events)
def test_history_event_round_trips_exactly(event: ev.HistoryEvent) -> None:
    decoded = codec.decode_event(codec.encode_event(event))
    assert decoded == event
    assert decoded.kind == event.kind
    assert decoded.timestamp.tzinfo == UTC


@pytest.mark.parametrize("kind", list(EVENT_STRATEGIES), ids=lambda kind: kind.__name__)
@given(data=st.data())
def test_each_event_kind_round_trips(kind: type, data: st.DataObject) -> None:
    event = ev.HistoryEvent(
        sequence_number=7, timestamp=datetime(2024, 5, 6, 7, 8, 9, 123456, UTC), event=data.draw(EVENT_STRATEGIES[kind])
    )
    proto = codec.event_to_proto(event)
    assert proto.WhichOneof("event") is not None
    assert codec.event_from_proto(proto) == event


@pytest.mark.parametrize("kind", list(EVENT_STRATEGIES), ids=lambda kind: kind.__name__)
@given(data=st.data(), sequence_number=int64s, timestamp=utc_datetimes)
def test_encode_event_writes_the_bytes_of_the_generated_classes(
    kind: type, data: st.DataObject, sequence_number: int, timestamp: datetime
) -> None:
    # the kinds every step writes are put together by dex.serialization.wire: the same bytes
    body = data.draw(EVENT_STRATEGIES[kind])
    event = ev.HistoryEvent(sequence_number=sequence_number, timestamp=timestamp, event=body)
    assert codec.encode_event(event) == codec.event_to_proto(event).SerializeToString()


def test_encode_event_writes_an_activity_task_created_of_another_policy_with_that_policy() -> None:
    # the cached tail (queue, priority, policy, lock timeout) belongs to those values only
    moment = datetime(2024, 5, 6, tzinfo=UTC)
    for policy in (RetryPolicy(), RetryPolicy(max_attempts=2), RetryPolicy(initial_delay=timedelta(seconds=9))):
        for queue in ("a", "b"):
            lock = timedelta(seconds=30)
            created = ev.ActivityTaskCreated(
                name="charge", input=(), queue=queue, priority=3, retry_policy=policy, lock_timeout=lock
            )
            event = ev.HistoryEvent(sequence_number=4, timestamp=moment, event=created)
            assert codec.decode_event(codec.encode_event(event)).event == created


def test_encode_event_refuses_what_the_generated_classes_refuse() -> None:
    naive = ev.HistoryEvent(sequence_number=1, timestamp=datetime(2024, 1, 1), event=ev.WorkflowTaskStarted())
    with pytest.raises(ValueError, match="naive datetime"):
        codec.encode_event(naive)
    huge = ev.HistoryEvent(sequence_number=2**63, timestamp=datetime(2024, 1, 1, tzinfo=UTC), event=ev.RunStarted())
    with pytest.raises(ValueError, match="out of range"):
        codec.encode_event(huge)


@given(st.lists(history_events, min_size=1, max_size=6))
def test_history_block_round_trips_as_the_bytes_of_the_generated_classes(events: list[ev.HistoryEvent]) -> None:
    # the PostgreSQL adapter stores a write's events as one block: a dex.v1.HistoryBlock
    data = codec.encode_block(events)
    assert data == history_pb2.HistoryBlock(events=[codec.event_to_proto(e) for e in events]).SerializeToString()
    assert codec.decode_block(data) == events


def test_decode_block_names_what_it_could_not_read() -> None:
    with pytest.raises(ValueError, match="cannot decode a history block from 3 bytes"):
        codec.decode_block(b"\x0a\x05x")


@given(messages)
def test_inbox_message_round_trips(message: ev.Message) -> None:
    assert codec.decode_message(codec.encode_message(message)) == message


def test_encode_message_refuses_a_non_message_kind() -> None:
    with pytest.raises(TypeError, match="TimerCreated is not an inbox message"):
        codec.encode_message(ev.TimerCreated(fire_at=datetime(2024, 1, 1, tzinfo=UTC)))  # type: ignore[arg-type]


@given(st.text(max_size=10), st.text(max_size=10), st.lists(history_events, max_size=5))
def test_workflow_history_round_trips(run_id: str, name: str, history: list[ev.HistoryEvent]) -> None:
    data = codec.encode_history(run_id, name, history)
    assert codec.decode_history(data) == history
    exported = codec.decode_exported_history(data)
    assert (exported.run_id, exported.workflow_name, exported.events) == (run_id, name, tuple(history))
    parsed = history_pb2.WorkflowHistory.FromString(data)
    assert [e.sequence_number for e in parsed.events] == [e.sequence_number for e in history]


@given(payloads)
def test_payload_round_trips(payload: Payload) -> None:
    assert codec.decode_payload(codec.encode_payload(payload)) == payload


@given(payload_tuples)
def test_payload_list_round_trips(items: tuple[Payload, ...]) -> None:
    assert codec.decode_payloads(codec.encode_payloads(items)) == items


@given(failures)
def test_failure_round_trips_with_its_causes(failure: FailureInfo) -> None:
    assert codec.decode_failure(codec.encode_failure(failure)) == failure


@given(retry_policies)
def test_retry_policy_round_trips(policy: RetryPolicy) -> None:
    assert codec.decode_retry_policy(codec.encode_retry_policy(policy)) == policy


def test_default_retry_policy_round_trips() -> None:
    assert codec.decode_retry_policy(codec.encode_retry_policy(RetryPolicy())) == RetryPolicy()


# --- time ---------------------------------------------------------------------------------


@given(st.datetimes(timezones=st.just(UTC)))
def test_datetimes_keep_every_microsecond(moment: datetime) -> None:
    back = codec.datetime_from_proto(codec.datetime_to_proto(moment))
    assert back == moment and back.microsecond == moment.microsecond and back.tzinfo == UTC


def test_datetime_before_1970_is_exact() -> None:
    moment = datetime(1969, 12, 31, 23, 59, 59, 999999, UTC)
    stamp = codec.datetime_to_proto(moment)
    assert (stamp.seconds, stamp.nanos) == (-1, 999_999_000)
    assert codec.datetime_from_proto(stamp) == moment


def test_aware_datetime_in_another_zone_comes_back_in_utc() -> None:
    moment = datetime(2024, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    back = codec.datetime_from_proto(codec.datetime_to_proto(moment))
    assert back == moment
    assert back.tzinfo == UTC and back.hour == 6 and back.minute == 30


def test_naive_datetime_is_refused() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        codec.datetime_to_proto(datetime(2024, 1, 1))


@given(durations)
def test_durations_round_trip_exactly(delta: timedelta) -> None:
    duration = values_codec.timedelta_to_proto(delta)
    assert duration.seconds * duration.nanos >= 0  # proto requires the same sign
    assert values_codec.timedelta_from_proto(duration) == delta


# --- what proto sees ----------------------------------------------------------------------


def test_optional_strings_keep_empty_apart_from_absent() -> None:
    created = ev.RunCreated(workflow_name="w", input=(), queue="q", instance_id="", concurrency_key=None)
    proto = codec.event_to_proto(
        ev.HistoryEvent(sequence_number=1, timestamp=datetime(2024, 1, 1, tzinfo=UTC), event=created)
    )
    assert proto.run_created.HasField("instance_id")
    assert not proto.run_created.HasField("concurrency_key")
    assert codec.event_from_proto(proto).event == created


def test_run_completed_status_is_the_proto_enum() -> None:
    event = ev.HistoryEvent(
        sequence_number=3, timestamp=datetime(2024, 1, 1, tzinfo=UTC), event=ev.RunCompleted(status=RunStatus.CANCELLED)
    )
    proto = history_pb2.HistoryEvent.FromString(codec.encode_event(event))
    assert proto.run_completed.status == history_pb2.RUN_STATUS_CANCELLED
    assert not proto.run_completed.HasField("result")


# --- bad bytes ----------------------------------------------------------------------------


def _event_bytes(**fields: typing.Any) -> bytes:
    return history_pb2.HistoryEvent(**fields).SerializeToString()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xff\xff", "cannot decode a history event from 3 bytes"),
        (_event_bytes(sequence_number=4, run_started=history_pb2.RunStarted()), "history event #4 has no timestamp"),
        (_event_bytes(sequence_number=5, timestamp={"seconds": 1}), "history event #5 holds no event"),
        (
            _event_bytes(sequence_number=6, timestamp={"seconds": 1}, activity_task_completed={"created_seq": 2}),
            r"ActivityTaskCompleted.result is missing",
        ),
        (
            _event_bytes(sequence_number=7, timestamp={"seconds": 1}, run_completed={}),
            "RunCompleted has no valid status",
        ),
        (
            _event_bytes(
                sequence_number=8,
                timestamp={"seconds": 1},
                activity_task_created={"name": "a", "lock_timeout": {"seconds": 1}},
            ),
            "ActivityTaskCreated.retry_policy is missing",
        ),
    ],
)
def test_undecodable_event_bytes_raise_value_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        codec.decode_event(data)


def test_invalid_retry_policy_bytes_raise_value_error() -> None:
    with pytest.raises(ValueError, match=r"cannot decode a retry policy.*initial_delay is missing"):
        codec.decode_retry_policy(b"")
    zero_attempts = values_codec.retry_policy_to_proto(RetryPolicy())
    zero_attempts.max_attempts = 0
    with pytest.raises(ValueError, match="max_attempts must be >= 1"):
        codec.decode_retry_policy(zero_attempts.SerializeToString())


def test_garbage_raises_value_error_for_every_decoder() -> None:
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # a length-delimited field far longer than the data
    for decode in (
        codec.decode_history,
        codec.decode_message,
        codec.decode_payload,
        codec.decode_payloads,
        codec.decode_failure,
        codec.decode_event,
    ):
        with pytest.raises(ValueError, match="cannot decode"):
            decode(garbage)


def test_empty_inbox_message_raises_value_error() -> None:
    with pytest.raises(ValueError, match="inbox message holds no event"):
        codec.decode_message(b"")


def test_out_of_range_numbers_are_refused_when_encoding() -> None:
    event = ev.HistoryEvent(
        sequence_number=1,
        timestamp=datetime(2024, 1, 1, tzinfo=UTC),
        event=ev.RunCreated(workflow_name="w", input=(), queue="q", priority=2**40),
    )
    with pytest.raises(ValueError, match="out of range"):
        codec.encode_event(event)


def test_a_block_tail_decodes_only_the_events_asked_for() -> None:
    from datetime import UTC, datetime

    from dex.domain import events as ev
    from dex.serialization.history import decode_block, decode_block_from, encode_block

    moment = datetime(2026, 11, 24, 6, 0, tzinfo=UTC)
    events = [
        ev.HistoryEvent(sequence_number=seq, timestamp=moment, event=ev.WorkflowTaskStarted()) for seq in range(5, 10)
    ]
    block = encode_block(events)
    assert decode_block_from(block, last_seq=9, first_wanted=8) == events[3:]
    assert decode_block_from(block, last_seq=9, first_wanted=9) == events[4:]
    assert decode_block_from(block, last_seq=9, first_wanted=5) == events  # the whole block
    assert decode_block_from(block, last_seq=9, first_wanted=0) == events  # a full load
    # numbering that does not match the stored last_seq: decoded whole and filtered instead
    assert decode_block_from(block, last_seq=12, first_wanted=8) == decode_block(block)[3:]
    with pytest.raises(ValueError, match="history block"):
        decode_block_from(b"\x0a\x05ab", last_seq=9, first_wanted=8)


def test_a_block_encoded_ahead_travels_with_its_events_and_is_the_block_written() -> None:
    from datetime import UTC, datetime

    from dex.domain import events as ev
    from dex.serialization import history

    moment = datetime(2026, 11, 24, 6, 0, tzinfo=UTC)
    events = tuple(
        ev.HistoryEvent(sequence_number=seq, timestamp=moment, event=ev.WorkflowTaskStarted()) for seq in range(1, 4)
    )
    ahead = history.encode_ahead(events)
    assert ahead == events and isinstance(ahead, tuple)  # the same events for every reader
    assert history.encode_block(ahead) == history.encode_block(events)  # the same bytes
    assert history.decode_block(history.encode_block(ahead)) == list(events)
    # the block is the one encoded ahead (a stand-in proves it is not encoded again) ...
    ahead.block = b"ahead"  # type: ignore[attr-defined]
    assert history.encode_block(ahead) == b"ahead"
    # ... and only that tuple carries it: slices and equal tuples are encoded anew
    assert history.encode_block(ahead[:2]) == history.encode_block(events[:2]) != b"ahead"
    assert history.encode_block(tuple(ahead)) == history.encode_block(events)
