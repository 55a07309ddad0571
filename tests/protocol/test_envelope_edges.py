"""The envelope rules of ``sdk.protocol.envelope`` pinned down by mutation testing: the frame
validity edges, which prompt an event names, decoding lists of frames, the one encoding (key
order, absent keys), and wrapping the reference daemon's page shape."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdk.protocol.constants import MAX_EVENT_ID
from sdk.protocol.envelope import (
    DaemonEvent,
    decode_event,
    decode_events,
    encode_envelope,
    event_from_mapping,
    event_prompt_id,
    names_prompt,
    normalize_page_event,
    read_payload,
    valid_event_id,
)
from sdk.protocol.events import TurnCompleteData, TurnErrorData


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1), (7.0, 7), (MAX_EVENT_ID, MAX_EVENT_ID), (float(MAX_EVENT_ID), MAX_EVENT_ID),
     (0, None), (0.0, None), (-3, None), (MAX_EVENT_ID + 1, None), (2.0**53, None), (True, None),
     (False, None), (1.5, None), ("1", None), (None, None)],
)
def test_valid_event_id(value: object, expected: int | None) -> None:
    got = valid_event_id(value)
    assert got == expected and type(got) is type(expected)


def test_envelope_version_one_may_be_written_as_a_float() -> None:
    event = decode_event(b'{"v":1.0,"type":"x","id":2}')
    assert event is not None and event.v == 1 and event.id == 2
    assert decode_event(b'{"v":1.5,"type":"x"}') is None
    assert decode_event(b'{"v":0,"type":"x"}') is None


def test_every_envelope_field_is_read() -> None:
    event = event_from_mapping({"v": 1, "type": "t", "id": 3, "data": {"k": 1}, "promptId": "p",
                                "originatorClientId": "c", "_meta": {"m": 2}})
    assert event == DaemonEvent(type="t", id=3, data={"k": 1}, prompt_id="p",
                                originator_client_id="c", meta={"m": 2})
    assert event_from_mapping([1]) is None and event_from_mapping(None) is None
    bare = event_from_mapping({"v": 1, "type": "t"})
    assert bare == DaemonEvent(type="t") and bare.data is None


@pytest.mark.parametrize("form", [bytes, bytearray, memoryview, str, msgspec.Raw])
def test_raw_forms_decode_and_type_their_payload_from_the_bytes(form: Any) -> None:
    raw = encode_envelope("turn_error", {"promptId": "p", "message": "sent"}, event_id=4)
    item = form(raw.decode() if form is str else raw)
    event = decode_event(item)
    assert event is not None and event.id == 4
    event.data["message"] = "changed"
    assert event.payload == TurnErrorData(prompt_id="p", message="sent")


def test_a_parsed_object_converts_its_data() -> None:
    event = decode_event({"v": 1, "type": "turn_error", "data": {"promptId": "p", "message": "a"}})
    assert event is not None
    event.data["message"] = "b"
    assert event.payload == TurnErrorData(prompt_id="p", message="b")


def test_the_payload_is_kept_once_typed() -> None:
    event = DaemonEvent(type="turn_complete", data={"promptId": "p"})
    first = event.payload
    assert first == TurnCompleteData(prompt_id="p")
    event.data = {"promptId": "q"}
    assert event.payload is first


def test_decode_events_takes_raw_frames_and_parsed_objects() -> None:
    good = encode_envelope("a", None, event_id=1)
    items = [good, bytearray(good), memoryview(good), msgspec.Raw(good), {"v": 1, "type": "b"},
             b"not json", {"v": 2, "type": "c"}, "a string is not a frame", None]
    events = decode_events(items)
    assert [(e.type, e.id) for e in events] == [("a", 1)] * 4 + [("b", None)]
    assert decode_events([]) == []


def test_event_prompt_id_edges() -> None:
    assert event_prompt_id(DaemonEvent(type="x", prompt_id="", data={"promptId": "d"})) == "d"
    assert event_prompt_id(DaemonEvent(type="x", data={"promptId": ""})) is None
    assert event_prompt_id(DaemonEvent(type="x", data=["promptId"])) is None
    assert event_prompt_id(DaemonEvent(type="x")) is None


def test_names_prompt_in_the_envelope_or_the_data() -> None:
    assert names_prompt(DaemonEvent(type="x", prompt_id="p"), "p")
    assert names_prompt(DaemonEvent(type="x", prompt_id="q", data={"promptId": "p"}), "p")
    assert not names_prompt(DaemonEvent(type="x", prompt_id="q", data={"promptId": "r"}), "p")
    assert not names_prompt(DaemonEvent(type="x", data=["p"]), "p")
    assert not names_prompt(DaemonEvent(type="x"), "p")


def test_encoding_orders_keys_like_the_daemon_and_leaves_absent_ones_out() -> None:
    assert encode_envelope("t", None) == b'{"v":1,"type":"t","data":null}'
    full = encode_envelope("t", {"a": 1}, event_id=9, prompt_id="p", originator_client_id="c",
                           meta={"serverTimestamp": 5})
    assert full == (b'{"id":9,"v":1,"type":"t","data":{"a":1},"promptId":"p",'
                    b'"originatorClientId":"c","_meta":{"serverTimestamp":5}}')
    assert encode_envelope("t", TurnCompleteData(prompt_id="p"), event_id=0) == (
        b'{"id":0,"v":1,"type":"t","data":{"sessionId":null,"stopReason":"end_turn",'
        b'"promptId":"p"}}')
    assert encode_envelope("t", 1, prompt_id="", originator_client_id="", meta={}) == (
        b'{"v":1,"type":"t","data":1,"promptId":"","originatorClientId":"","_meta":{}}')


UPDATE = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}


def test_page_shape_takes_the_session_id_from_the_argument_then_the_update() -> None:
    in_data = normalize_page_event({"v": 1, "type": "session_update",
                                    "data": {**UPDATE, "sessionId": "d"}})
    assert in_data is not None
    assert in_data.data == {"sessionId": "d", "update": {**UPDATE, "sessionId": "d"}}
    given = normalize_page_event({"v": 1, "type": "session_update",
                                  "data": {**UPDATE, "sessionId": "d"}}, "s")
    assert given is not None and given.data["sessionId"] == "s"
    odd = normalize_page_event({"v": 1, "type": "session_update",
                                "data": {**UPDATE, "sessionId": 3}})
    assert odd is not None and odd.data == {"update": {**UPDATE, "sessionId": 3}}


@pytest.mark.parametrize("data", [None, [UPDATE], {"sessionId": "s"},
                                  {"update": None, "sessionUpdate": "plan"}])
def test_page_events_that_are_not_the_page_shape_are_left_alone(data: Any) -> None:
    event = DaemonEvent(type="session_update", id=2, data=data)
    assert normalize_page_event(event, "s") is event


def test_wrapping_keeps_the_envelope_and_leaves_the_original_alone() -> None:
    event = DaemonEvent(type="session_update", id=2, prompt_id="p", data=dict(UPDATE))
    wrapped = normalize_page_event(event, "s")
    assert wrapped is not None and wrapped is not event
    assert (wrapped.id, wrapped.prompt_id, wrapped.type) == (2, "p", "session_update")
    assert event.data == UPDATE


# --- reading a payload without keeping it ------------------------------------------------------------


def test_read_payload_types_like_payload_but_keeps_nothing() -> None:
    built = DaemonEvent(type="turn_complete", data={"promptId": "p"})
    assert read_payload(built) == TurnCompleteData(prompt_id="p")
    assert "_payload" not in built.__dict__
    built.data = {"promptId": "q"}  # nothing was kept, so the next read sees the new data
    assert read_payload(built) == TurnCompleteData(prompt_id="q")
    decoded = decode_event(encode_envelope("turn_error", {"promptId": "p", "message": "sent"}))
    assert decoded is not None
    decoded.data["message"] = "changed"
    # From the frame's bytes, and the bytes stay for the next reader.
    assert read_payload(decoded) == TurnErrorData(prompt_id="p", message="sent")
    assert "_payload" not in decoded.__dict__
    assert decoded.payload == TurnErrorData(prompt_id="p", message="sent")


def test_read_payload_answers_the_payload_already_kept() -> None:
    event = DaemonEvent(type="turn_complete", data={"promptId": "p"})
    kept = event.payload
    event.data = {"promptId": "q"}
    assert read_payload(event) is kept
    unknown = DaemonEvent(type="future_event", data={"a": 1})
    assert unknown.payload is None
    unknown.type = "turn_complete"  # a kept None is an answer too
    unknown.data = {"promptId": "p"}
    assert read_payload(unknown) is None


# --- the one-pass envelope decode agrees with the field-by-field rules ----------------------------

_JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**53 + 2), st.sampled_from([1.0, 7.0, 2.5, -0.0]),
    st.sampled_from(["", "p", "session_update"]), st.just([1]), st.just({"k": 1}),
)
_ENVELOPE_KEYS = ["id", "v", "type", "data", "promptId", "originatorClientId", "_meta", "other"]


@given(
    fields=st.dictionaries(st.sampled_from(_ENVELOPE_KEYS), _JSON_VALUES, max_size=8),
    well_formed=st.booleans(),
)
def test_decoding_bytes_applies_the_same_rules_as_a_parsed_object(
    fields: dict[str, Any], well_formed: bool
) -> None:
    if well_formed:  # most frames are valid: make sure both paths see many of them
        fields = {"v": 1, "type": "t", **{k: v for k, v in fields.items() if k not in ("v", "type")}}
        if isinstance(fields.get("id"), bool) or fields.get("id") is None:
            fields.pop("id", None)
    raw = msgspec.json.encode(fields)
    from_bytes = decode_event(raw)
    from_mapping = event_from_mapping(msgspec.json.decode(raw))
    assert from_bytes == from_mapping
    if from_bytes is not None:
        assert type(from_bytes.id) is type(from_mapping.id if from_mapping else None)


@pytest.mark.parametrize("raw", [b'[1]', b'"x"', b'{"v":1,"type":"t"', b'\xff', b'',
                                 b'{"v":1,"type":"t","id":1,"id":null}',
                                 b'{"v":1,"type":"t","id":null,"id":2}'])
def test_frames_that_are_not_envelopes_or_json(raw: bytes) -> None:
    try:
        expected = event_from_mapping(msgspec.json.decode(raw))
    except msgspec.DecodeError:
        expected = None
    assert decode_event(raw) == expected
