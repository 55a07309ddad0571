"""Envelope decoding, typed payloads, unknown-type counting and transcript-page shapes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from sdk._truncation import DaemonHistoryTruncatedData
from sdk.protocol.constants import MAX_EVENT_ID
from sdk.protocol.envelope import (
    DaemonEvent,
    UnknownEventCounter,
    decode_event,
    decode_events,
    event_prompt_id,
    normalize_page_event,
    typed_data,
)
from sdk.protocol.events import (
    ClientEvictedData,
    PermissionRequestData,
    PromptCancelledData,
    ReplayCompleteData,
    SessionClosedData,
    SessionDiedData,
    SessionUpdateData,
    SlowClientWarningData,
    StateResyncRequiredData,
    TurnCompleteData,
    TurnErrorData,
)

# A frame as the reference daemon sends it (samples/sse-frames.txt, turn_complete).
TURN_COMPLETE = (
    b'{"id":7,"v":1,"type":"turn_complete","promptId":"p-1","data":{"sessionId":"s-1",'
    b'"stopReason":"end_turn","promptId":"p-1","branchPoint":{"checkpointUuid":"c"}},'
    b'"originatorClientId":"client_1","_meta":{"serverTimestamp":1796204622900}}'
)


def test_decode_full_envelope_with_wire_names() -> None:
    event = decode_event(TURN_COMPLETE)
    assert event == DaemonEvent(
        type="turn_complete",
        id=7,
        data={
            "sessionId": "s-1",
            "stopReason": "end_turn",
            "promptId": "p-1",
            "branchPoint": {"checkpointUuid": "c"},
        },
        prompt_id="p-1",
        originator_client_id="client_1",
        meta={"serverTimestamp": 1796204622900},
    )


@pytest.mark.parametrize("form", ["bytes", "str", "dict"])
def test_decode_accepts_bytes_str_and_dict(form: str) -> None:
    raw: Any = {
        "bytes": TURN_COMPLETE,
        "str": TURN_COMPLETE.decode(),
        "dict": msgspec.json.decode(TURN_COMPLETE),
    }[form]
    event = decode_event(raw)
    assert event is not None and event.id == 7 and event.type == "turn_complete"


def test_idless_synthetic_frame_is_valid() -> None:
    event = decode_event(b'{"v":1,"type":"replay_complete","data":{"replayedCount":0}}')
    assert event is not None and event.id is None


@pytest.mark.parametrize(
    "raw",
    [
        b"[1,2]",
        b'"text"',
        b"null",
        b"42",
        b"not json",
        b"",
        b"\xff\xfe",
        b'{"type":"x","data":{}}',  # v missing
        b'{"v":2,"type":"x"}',
        b'{"v":true,"type":"x"}',
        b'{"v":"1","type":"x"}',
        b'{"v":1}',
        b'{"v":1,"type":7}',
        b'{"v":1,"type":null}',
        b'{"v":1,"type":"x","id":0}',
        b'{"v":1,"type":"x","id":-1}',
        b'{"v":1,"type":"x","id":true}',
        b'{"v":1,"type":"x","id":"5"}',
        b'{"v":1,"type":"x","id":1.5}',
        b'{"v":1,"type":"x","id":null}',
        b'{"v":1,"type":"x","id":9007199254740992}',
    ],
)
def test_invalid_frames_decode_to_none(raw: bytes) -> None:
    assert decode_event(raw) is None


def test_id_bounds() -> None:
    low = decode_event({"v": 1, "type": "x", "id": 1})
    high = decode_event({"v": 1, "type": "x", "id": MAX_EVENT_ID})
    assert low is not None and low.id == 1
    assert high is not None and high.id == 2**53 - 1


def test_integral_float_id_is_an_int() -> None:
    event = decode_event(b'{"v":1,"type":"x","id":5.0}')
    assert event is not None and event.id == 5 and type(event.id) is int


def test_wrongly_typed_optional_envelope_fields_are_dropped_not_fatal() -> None:
    event = decode_event(
        {"v": 1, "type": "x", "promptId": 5, "originatorClientId": [], "_meta": "m", "data": 3}
    )
    assert event is not None
    assert event.prompt_id is None and event.originator_client_id is None and event.meta is None
    assert event.data == 3


def test_decode_events_drops_invalid_items() -> None:
    events = decode_events([{"v": 1, "type": "a", "id": 1}, {"v": 1, "type": "b", "id": 0}, 7])
    assert [e.type for e in events] == ["a"]


def test_event_prompt_id_envelope_then_data() -> None:
    assert event_prompt_id(DaemonEvent(type="x", prompt_id="env", data={"promptId": "d"})) == "env"
    assert event_prompt_id(DaemonEvent(type="x", data={"promptId": "d"})) == "d"
    assert event_prompt_id(DaemonEvent(type="x", prompt_id="", data={"promptId": 3})) is None


# --- typed payloads ---------------------------------------------------------------------------


def ev(kind: str, data: Any) -> DaemonEvent:
    return DaemonEvent(type=kind, data=data)


def test_typed_turn_complete() -> None:
    event = decode_event(TURN_COMPLETE)
    assert event is not None
    assert typed_data(event) == TurnCompleteData(
        prompt_id="p-1", stop_reason="end_turn", session_id="s-1"
    )


def test_typed_turn_complete_defaults_stop_reason() -> None:
    assert typed_data(ev("turn_complete", {"promptId": "p"})) == TurnCompleteData(prompt_id="p")


def test_typed_turn_error() -> None:
    data = {
        "sessionId": "s",
        "message": "boom",
        "code": "channel_closed",
        "errorKind": "x",
        "promptId": "p",
    }
    assert typed_data(ev("turn_error", data)) == TurnErrorData(
        prompt_id="p", message="boom", code="channel_closed", error_kind="x", session_id="s"
    )


@pytest.mark.parametrize(
    ("kind", "data", "expected"),
    [
        (
            "session_update",
            {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk"}},
            SessionUpdateData(session_id="s", update={"sessionUpdate": "agent_message_chunk"}),
        ),
        ("prompt_cancelled", {"sessionId": "s"}, PromptCancelledData(session_id="s")),
        (
            "permission_request",
            {"requestId": "r", "sessionId": "s", "toolCall": {"t": 1}, "options": [{"o": 1}]},
            PermissionRequestData(
                request_id="r", session_id="s", tool_call={"t": 1}, options=[{"o": 1}]
            ),
        ),
        (
            "replay_complete",
            {"lastReplayedEventId": 7, "lastEventId": 7, "replayedCount": 4},
            ReplayCompleteData(last_replayed_event_id=7, last_event_id=7, replayed_count=4),
        ),
        (
            "state_resync_required",
            {
                "reason": "epoch_reset",
                "detail": "epoch_mismatch",
                "lastDeliveredId": 5,
                "earliestAvailableId": 1,
            },
            StateResyncRequiredData(
                reason="epoch_reset",
                detail="epoch_mismatch",
                last_delivered_id=5,
                earliest_available_id=1,
            ),
        ),
        (
            "slow_client_warning",
            {
                "queueSize": 192,
                "maxQueued": 256,
                "lastEventId": 9,
                "queuedBytes": 10,
                "maxQueuedBytes": 2097152,
                "threshold": "frames",
            },
            SlowClientWarningData(
                queue_size=192,
                max_queued=256,
                last_event_id=9,
                queued_bytes=10,
                max_queued_bytes=2097152,
                threshold="frames",
            ),
        ),
        (
            "client_evicted",
            {"reason": "queue_overflow", "droppedAfter": 12, "queueSize": 257, "maxQueued": 256},
            ClientEvictedData(
                reason="queue_overflow", dropped_after=12, queue_size=257, max_queued=256
            ),
        ),
        (
            "session_closed",
            {"sessionId": "s", "reason": "client_close"},
            SessionClosedData(session_id="s", reason="client_close"),
        ),
        (
            "session_died",
            {"sessionId": "s", "reason": "channel_closed", "exitCode": 1, "signalCode": None},
            SessionDiedData(session_id="s", reason="channel_closed", exit_code=1),
        ),
    ],
)
def test_typed_known_payloads(kind: str, data: dict[str, Any], expected: Any) -> None:
    assert typed_data(ev(kind, data)) == expected


def test_typed_history_truncated_uses_validation() -> None:
    good = {
        "reason": "replay_window_exceeded",
        "truncatedEvents": 1,
        "retainedEvents": 1,
        "maxBytes": 1,
        "fullTranscriptAvailable": True,
    }
    assert isinstance(typed_data(ev("history_truncated", good)), DaemonHistoryTruncatedData)
    assert typed_data(ev("history_truncated", {**good, "maxEvents": "3"})) is None


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("turn_complete", {"stopReason": "end_turn"}),  # promptId required
        ("turn_complete", {"promptId": 5}),
        ("turn_error", {"promptId": "p", "code": 500}),
        ("replay_complete", {"replayedCount": True}),
        ("session_update", {"update": "text"}),
        ("turn_complete", None),
        ("turn_complete", ["promptId"]),
        ("future_type", {"anything": 1}),
    ],
)
def test_typed_data_none_when_payload_does_not_fit(kind: str, data: Any) -> None:
    assert typed_data(ev(kind, data)) is None


def test_unknown_counter_counts_and_keeps_raw_frames() -> None:
    counter = UnknownEventCounter(keep=2)
    frames = [
        ev("future_a", {"x": 1}),
        ev("turn_complete", {"promptId": "p"}),
        ev("future_a", {"x": 2}),
        ev("turn_complete", {"bad": True}),
        ev("future_b", None),
    ]
    typed = [counter.observe(f) for f in frames]
    assert typed[1] == TurnCompleteData(prompt_id="p")
    assert [t is None for t in typed] == [True, False, True, True, True]
    assert counter.total == 4
    assert counter.by_type == {"future_a": 2, "turn_complete": 1, "future_b": 1}
    assert list(counter.recent) == [frames[3], frames[4]]


def test_unknown_counter_rejects_negative_keep() -> None:
    with pytest.raises(ValueError, match="keep"):
        UnknownEventCounter(keep=-1)


# --- transcript page shapes ---------------------------------------------------------------------

UPDATE = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}


def test_page_bus_shape_is_unchanged() -> None:
    raw = {"v": 1, "type": "session_update", "id": 4, "data": {"sessionId": "s", "update": UPDATE}}
    event = normalize_page_event(raw, "s")
    assert event is not None and event.data == {"sessionId": "s", "update": UPDATE}


def test_page_reference_shape_is_wrapped() -> None:
    raw = {"v": 1, "type": "session_update", "id": 4, "promptId": "p", "data": dict(UPDATE)}
    event = normalize_page_event(raw, "s")
    assert event is not None
    assert event.data == {"sessionId": "s", "update": UPDATE}
    assert event.id == 4 and event.prompt_id == "p"


def test_page_reference_shape_without_session_id() -> None:
    event = normalize_page_event({"v": 1, "type": "session_update", "data": dict(UPDATE)})
    assert event is not None and event.data == {"update": UPDATE}


def test_page_accepts_daemon_event_and_leaves_other_types() -> None:
    terminal = DaemonEvent(type="turn_complete", data={"promptId": "p", "stopReason": "end_turn"})
    assert normalize_page_event(terminal, "s") is terminal
    wrapped = normalize_page_event(DaemonEvent(type="session_update", data=dict(UPDATE)), "s")
    assert wrapped is not None and wrapped.data == {"sessionId": "s", "update": UPDATE}


def test_page_invalid_frame_is_none() -> None:
    assert normalize_page_event({"v": 2, "type": "session_update"}, "s") is None
