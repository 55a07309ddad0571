"""The payload rules of ``sdk.protocol.events`` pinned down by mutation testing: what each
typed view answers at its edges (numbers, record ids, content, options, plans), the
``history_truncated`` invariants, which decoder a frame takes, and the unknown-frame counter."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from sdk.protocol.envelope import (
    DaemonEvent,
    UnknownEventCounter,
    decode_event,
    encode_envelope,
    record_ids_of,
    server_timestamp,
)
from sdk.protocol.events import (
    AgentMessageChunk,
    ContentChunk,
    DaemonHistoryTruncatedData,
    PermissionOption,
    PermissionRequestData,
    PermissionToolCall,
    Plan,
    QwenTranscript,
    RawUpdate,
    SessionUpdateData,
    ToolCall,
    TurnCompleteData,
    UpdateMeta,
    decode_payload,
    finite_number,
    parse_truncation,
    payload_from_data,
)

# --- numbers and timestamps -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3.0), (2.5, 2.5), (0, 0.0), (-1, -1.0), (True, None), (False, None), ("3", None),
     (None, None), (math.inf, None), (-math.inf, None), (math.nan, None)],
)
def test_finite_number(value: object, expected: float | None) -> None:
    got = finite_number(value)
    assert got == expected and type(got) is type(expected)


def test_agent_timestamp_prefers_the_update_then_meta() -> None:
    both = AgentMessageChunk(timestamp=1, meta=UpdateMeta(timestamp=2))
    assert both.agent_timestamp == 1.0
    meta_only = AgentMessageChunk(meta=UpdateMeta(timestamp=2))
    assert meta_only.agent_timestamp == 2.0
    bad_update = AgentMessageChunk(timestamp="x", meta=UpdateMeta(timestamp=5))
    assert bad_update.agent_timestamp == 5.0
    assert AgentMessageChunk(timestamp=math.nan).agent_timestamp is None
    assert AgentMessageChunk().agent_timestamp is None


def test_server_timestamp_reads_the_envelope_meta() -> None:
    assert server_timestamp(DaemonEvent(type="x", meta={"serverTimestamp": 17})) == 17.0
    assert server_timestamp(DaemonEvent(type="x", meta={"serverTimestamp": True})) is None
    assert server_timestamp(DaemonEvent(type="x", meta={})) is None
    assert server_timestamp(DaemonEvent(type="x")) is None


# --- record ids, content, plans ------------------------------------------------------------------


def test_record_ids_put_the_own_id_first_and_keep_each_once() -> None:
    meta = UpdateMeta(record_id="r1", qwen_transcript=QwenTranscript(
        source_record_ids=["r2", "r1", "", 7, None, "r3", "r2"]))
    assert meta.record_ids == ("r1", "r2", "r3")
    assert UpdateMeta(record_id="").record_ids == ()
    assert UpdateMeta().record_ids == ()
    only_sources = UpdateMeta(qwen_transcript=QwenTranscript(source_record_ids=["a", "b"]))
    assert only_sources.record_ids == ("a", "b")
    assert AgentMessageChunk(meta=meta).record_ids == ("r1", "r2", "r3")
    assert AgentMessageChunk().record_ids == ()


def test_record_ids_decode_from_the_wire_key() -> None:
    meta = msgspec.convert(
        {"qwen.session.recordId": "r", "qwenTranscript": {"sourceRecordIds": ["s"]}}, UpdateMeta)
    assert meta.record_ids == ("r", "s")


def test_display_text_of_content() -> None:
    assert ContentChunk(type="text", text="hi").display_text == "hi"
    assert ContentChunk(type="text", text="").display_text == ""
    assert ContentChunk(type="text", text=3).display_text == "[text]"
    assert ContentChunk(type="image", text="hi").display_text == "[image]"
    assert AgentMessageChunk(content=ContentChunk(type="text", text="a")).text == "a"
    assert AgentMessageChunk().text == ""


def test_a_plan_is_completed_when_every_entry_is() -> None:
    assert Plan(entries=[{"status": "completed"}, {"status": "completed"}]).completed is True
    assert Plan(entries=[{"status": "completed"}, {"status": "pending"}]).completed is False
    assert Plan(entries=[{"status": "pending"}, {"status": "completed"}]).completed is False
    assert Plan(entries=[]).completed is False
    assert Plan().completed is False


# --- session_update payloads and their ACP update -------------------------------------------------


def test_session_update_kind_is_the_discriminator_when_a_string() -> None:
    assert SessionUpdateData(update={"sessionUpdate": "plan"}).kind == "plan"
    assert SessionUpdateData(update={"sessionUpdate": 3}).kind is None
    assert SessionUpdateData(update={}).kind is None


def test_acp_is_typed_once_and_kept() -> None:
    payload = SessionUpdateData(update={"sessionUpdate": "tool_call", "toolCallId": "t"})
    first = payload.acp
    assert isinstance(first, ToolCall) and first.tool_call_id == "t"
    assert payload.acp is first


def test_an_untyped_or_unfitting_update_is_raw_with_its_meta() -> None:
    raw = SessionUpdateData(update={
        "sessionUpdate": "new_kind", "timestamp": 4, "_meta": {"qwen.session.recordId": "r"}}).acp
    assert isinstance(raw, RawUpdate)
    assert (raw.kind, raw.timestamp, raw.record_ids, raw.typed_kind) == ("new_kind", 4, ("r",), False)
    assert raw.data == {"sessionUpdate": "new_kind", "timestamp": 4,
                        "_meta": {"qwen.session.recordId": "r"}}
    bad = SessionUpdateData(update={"sessionUpdate": "tool_call", "toolCallId": 5,
                                    "_meta": {"source": 7}}).acp
    assert isinstance(bad, RawUpdate)
    assert (bad.kind, bad.typed_kind, bad.meta) == ("tool_call", True, None)
    nameless = SessionUpdateData(update={"sessionUpdate": 9, "_meta": "x"}).acp
    assert isinstance(nameless, RawUpdate)
    assert (nameless.kind, nameless.meta, nameless.typed_kind) == (None, None, False)


def _frame(event_type: str, data: Any, **kw: Any) -> DaemonEvent:
    event = decode_event(encode_envelope(event_type, data, **kw))
    assert event is not None
    return event


def test_session_update_frames_decode_both_shapes_and_keep_untyped_kinds() -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}
    bus = _frame("session_update", {"sessionId": "s", "update": update}).payload
    assert isinstance(bus, SessionUpdateData)
    assert (bus.session_id, bus.update) == ("s", update)
    assert isinstance(bus.acp, AgentMessageChunk) and bus.acp.text == "x"
    page = _frame("session_update", {**update, "sessionId": "s"}).payload
    assert isinstance(page, SessionUpdateData) and isinstance(page.acp, AgentMessageChunk)
    assert page.session_id == "s" and page.update == {**update, "sessionId": "s"}
    odd = _frame("session_update", {"sessionId": 5, "update": {"sessionUpdate": "odd"}}).payload
    assert isinstance(odd, SessionUpdateData) and odd.session_id is None
    assert isinstance(odd.acp, RawUpdate) and odd.acp.kind == "odd"


@pytest.mark.parametrize(
    "data",
    [None, [], "x", {"update": 3}, {"update": None, "sessionUpdate": "plan"}, {"sessionId": "s"},
     {"sessionUpdate": 4}],
)
def test_session_update_without_an_update_has_no_payload(data: Any) -> None:
    assert _frame("session_update", data).payload is None
    assert DaemonEvent(type="session_update", data=data).payload is None


def test_built_session_update_types_its_update() -> None:
    payload = payload_from_data("session_update", {"sessionId": "s", "update": {
        "sessionUpdate": "plan", "entries": [{"status": "completed"}]}})
    assert isinstance(payload, SessionUpdateData) and payload.session_id == "s"
    assert isinstance(payload.acp, Plan) and payload.acp.completed


# --- the decoder per type -----------------------------------------------------------------------


def test_frames_and_built_events_decode_to_the_same_payloads() -> None:
    data = {"sessionId": "s", "promptId": "p", "stopReason": "cancelled", "extra": 1}
    from_frame = decode_payload("turn_complete", encode_envelope("turn_complete", data), data)
    from_data = payload_from_data("turn_complete", data)
    expected = TurnCompleteData(session_id="s", prompt_id="p", stop_reason="cancelled")
    assert from_frame == expected and from_data == expected


@pytest.mark.parametrize("decode", ["frame", "data"])
def test_unknown_types_and_unfitting_payloads_have_none(decode: str) -> None:
    def payload(kind: str, data: Any) -> Any:
        if decode == "frame":
            return decode_payload(kind, encode_envelope(kind, data), data)
        return payload_from_data(kind, data)

    assert payload("no_such_type", {"promptId": "p"}) is None
    assert payload("turn_complete", {"sessionId": "s"}) is None  # promptId missing
    assert payload("turn_complete", ["p"]) is None
    assert payload("turn_complete", None) is None


def test_history_truncated_decodes_through_its_validation() -> None:
    data = {"reason": "replay_window_exceeded", "truncatedEvents": 2.0, "retainedEvents": 1,
            "maxBytes": 10, "fullTranscriptAvailable": False, "note": "n"}
    for payload in (decode_payload("history_truncated", encode_envelope("history_truncated", data), data),
                    payload_from_data("history_truncated", data)):
        assert isinstance(payload, DaemonHistoryTruncatedData)
        assert payload.truncated_events == 2 and type(payload.truncated_events) is int
        assert payload.extra == {"note": "n"}
    bad = {**data, "maxBytes": -1}
    assert decode_payload("history_truncated", encode_envelope("history_truncated", bad), bad) is None
    assert payload_from_data("history_truncated", bad) is None


# --- permission requests ------------------------------------------------------------------------


def test_permission_option_labels() -> None:
    assert PermissionOption(option_id="o", name="Allow", kind="allow_once").label == "Allow [allow_once]"
    assert PermissionOption(option_id="o", name="Allow").label == "Allow"
    assert PermissionOption(option_id="o", name="", kind="k").label == "o [k]"
    assert PermissionOption(option_id="o").label == "o"


def test_permission_answers_and_tool_are_typed_leniently() -> None:
    request = PermissionRequestData(
        options=[{"optionId": "a", "name": "A", "kind": "allow_once"}, {"optionId": 3},
                 {"name": "no id"}, {"optionId": "b"}],
        tool_call={"toolCallId": "t", "title": "T", "kind": "edit", "other": 1},
    )
    assert request.answers == [PermissionOption(option_id="a", name="A", kind="allow_once"),
                               PermissionOption(option_id="b")]
    assert request.tool == PermissionToolCall(tool_call_id="t", title="T", kind="edit")
    assert PermissionRequestData(tool_call={"title": 5}).tool == PermissionToolCall()
    assert PermissionRequestData().tool == PermissionToolCall()
    assert PermissionRequestData().answers == []


# --- history_truncated invariants ---------------------------------------------------------------


def _marker(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"reason": "replay_window_exceeded", "truncatedEvents": 3,
                            "retainedEvents": 4, "maxBytes": 100, "fullTranscriptAvailable": True}
    data.update(overrides)
    return data


def test_marker_defaults_and_views() -> None:
    marker = parse_truncation(_marker())
    assert marker is not None
    assert (marker.scope, marker.max_events, marker.truncated_turns, marker.record_id,
            marker.extra) == (None, None, None, None, {})
    assert (marker.is_live, marker.is_recoverable_live) == (False, False)
    live = parse_truncation(_marker(scope="live_journal"))
    assert live is not None and (live.is_live, live.is_recoverable_live) == (True, True)
    lost = parse_truncation(_marker(scope="live_journal", fullTranscriptAvailable=False))
    assert lost is not None and (lost.is_live, lost.is_recoverable_live) == (True, False)
    other = parse_truncation(_marker(scope="ring"))
    assert other is not None and other.scope == "ring" and not other.is_live


def test_marker_optional_counts_null_and_floats() -> None:
    marker = parse_truncation(_marker(truncatedTurns=2.0, recordId=5))
    assert marker is not None
    assert (marker.max_events, marker.truncated_turns, marker.record_id) == (None, 2, None)
    assert type(marker.truncated_turns) is int
    assert parse_truncation(_marker(maxEvents=None)) is None  # null is not a count on the wire
    built = DaemonHistoryTruncatedData(
        reason="replay_window_exceeded", truncated_events=1, retained_events=1, max_bytes=1,
        full_transcript_available=False, max_events=None, truncated_turns=None)
    assert (built.max_events, built.truncated_turns) == (None, None)
    named = parse_truncation(_marker(maxEvents=7, recordId="r"))
    assert named is not None and (named.max_events, named.record_id) == (7, "r")


@pytest.mark.parametrize(
    "overrides",
    [{"truncatedEvents": None}, {"retainedEvents": 1.5}, {"maxBytes": True}, {"maxEvents": -1},
     {"truncatedTurns": False}, {"truncatedEvents": math.inf}, {"scope": ""}, {"scope": None},
     {"fullTranscriptAvailable": 1}, {"reason": "other"}],
)
def test_malformed_markers_are_none(overrides: dict[str, Any]) -> None:
    assert parse_truncation(_marker(**overrides)) is None


def test_unknown_keys_never_make_a_marker_malformed() -> None:
    marker = parse_truncation(_marker(extra={"x": 1}, scope2=None))
    assert marker is not None and marker.extra == {"extra": {"x": 1}, "scope2": None}
    assert parse_truncation(["x"]) is None and parse_truncation(None) is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("truncated_events", -1, "history_truncated truncated_events must be an integer >= 0"),
     ("max_bytes", None, "history_truncated max_bytes must be an integer >= 0"),
     ("retained_events", True, "history_truncated retained_events must be an integer >= 0"),
     ("max_events", 1.5, "history_truncated max_events must be an integer >= 0"),
     ("scope", "", "history_truncated scope must be a non-empty string when present"),
     ("full_transcript_available", 1,
      "history_truncated fullTranscriptAvailable must be a boolean"),
     ("reason", "nope", "history_truncated reason must be 'replay_window_exceeded'")],
)
def test_direct_construction_says_what_is_wrong(field: str, value: Any, message: str) -> None:
    fields: dict[str, Any] = {"reason": "replay_window_exceeded", "truncated_events": 0,
                              "retained_events": 0, "max_bytes": 0,
                              "full_transcript_available": True, field: value}
    with pytest.raises(ValueError) as info:
        DaemonHistoryTruncatedData(**fields)
    assert str(info.value) == message


# --- the unknown-frame counter -------------------------------------------------------------------


def test_counter_counts_per_type_and_keeps_the_newest() -> None:
    counter = UnknownEventCounter(keep=2)
    frames = [DaemonEvent(type=t, data={}) for t in ("a", "b", "a", "a")]
    for frame in frames:
        assert counter.observe(frame) is None
    known = DaemonEvent(type="turn_complete", data={"promptId": "p"})
    assert counter.observe(known) == TurnCompleteData(prompt_id="p")
    assert counter.total == 4
    assert counter.by_type == {"a": 3, "b": 1}
    assert list(counter.recent) == frames[2:]


def test_counter_keeps_64_by_default_and_zero_keeps_none() -> None:
    counter = UnknownEventCounter()
    assert counter.recent.maxlen == 64
    none = UnknownEventCounter(keep=0)
    none.observe(DaemonEvent(type="x"))
    assert (none.total, len(none.recent)) == (1, 0)
    with pytest.raises(ValueError, match="keep must be >= 0, got -1"):
        UnknownEventCounter(keep=-1)


# --- a session_update's ACP update is typed from the frame bytes, once ----------------------------


@pytest.mark.parametrize("shape", ["bus", "page"])
def test_session_update_acp_is_decoded_from_the_frame_bytes_not_from_data(shape: str) -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "sent"}}
    data = {"sessionId": "s", "update": update} if shape == "bus" else {**update, "sessionId": "s"}
    event = _frame("session_update", data)
    content = event.data["update"]["content"] if shape == "bus" else event.data["content"]
    content["text"] = "changed after decoding"
    payload = event.payload
    assert isinstance(payload, SessionUpdateData)
    assert isinstance(payload.acp, AgentMessageChunk) and payload.acp.text == "sent"
    # A frame built in code types its update from data.
    built = DaemonEvent(type="session_update", data=event.data).payload
    assert isinstance(built, SessionUpdateData)
    assert isinstance(built.acp, AgentMessageChunk)
    assert built.acp.text == "changed after decoding"


def test_an_untyped_update_is_typed_when_its_payload_is() -> None:
    event = _frame("session_update", {"sessionId": "s", "update": {"sessionUpdate": "odd"}})
    payload = event.payload
    assert isinstance(payload, SessionUpdateData)
    payload.update["sessionUpdate"] = "changed later"
    assert isinstance(payload.acp, RawUpdate) and payload.acp.kind == "odd"


# --- record ids without typing the payload -------------------------------------------------------------

_RID = {"qwen.session.recordId": "r1", "qwenTranscript": {"sourceRecordIds": ["r2", "r1", 3]}}
_TEXT = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}


@pytest.mark.parametrize(
    ("event_type", "data", "expected"),
    [
        ("session_update", {"sessionId": "s", "update": {**_TEXT, "_meta": _RID}}, ("r1", "r2")),
        ("session_update", {"update": {**_TEXT, "_meta": {"qwen.session.recordId": "r"}}},
         ("r",)),
        ("session_update", {"sessionId": "s", "update": _TEXT}, ()),
        ("session_update", {"update": {**_TEXT, "_meta": None}}, ()),
        ("session_update", {"update": {**_TEXT, "_meta": ["r1"]}}, ()),
        # _meta of the wrong shape: the update does not fit, the raw update has no meta either.
        ("session_update", {"update": {**_TEXT, "_meta": {**_RID, "source": 7}}}, ()),
        ("session_update", {"update": {"sessionUpdate": "new_kind", "_meta": _RID}}, ("r1", "r2")),
        ("session_update", {**_TEXT, "sessionId": "s", "_meta": _RID}, ("r1", "r2")),  # page shape
        ("session_update", {**_TEXT, "sessionId": "s"}, ()),
        ("session_update", {"update": "not an object", "sessionUpdate": "x", "_meta": _RID}, ()),
        ("session_update", {"sessionUpdate": 3, "_meta": _RID}, ()),
        ("session_update", ["not", "an", "object"], ()),
        ("session_update", None, ()),
        ("turn_complete", {"promptId": "p", "update": {**_TEXT, "_meta": _RID}}, ()),
    ],
)
@pytest.mark.parametrize("origin", ["built", "decoded", "kept"])
def test_record_ids_of_answers_what_the_typed_payload_says(
    event_type: str, data: Any, expected: tuple[str, ...], origin: str
) -> None:
    def make() -> DaemonEvent:
        if origin == "built":
            return DaemonEvent(type=event_type, data=msgspec.json.decode(msgspec.json.encode(data)))
        return _frame(event_type, data)

    typed = make().payload
    assert (typed.acp.record_ids if isinstance(typed, SessionUpdateData) else ()) == expected
    event = make()
    if origin == "kept":
        event.payload  # noqa: B018 - the payload kept on the event is the one read
    assert record_ids_of(event) == expected


def test_record_ids_of_reads_a_kept_payload_and_the_frame_bytes() -> None:
    event = _frame("session_update", {"update": {**_TEXT, "_meta": _RID}})
    event.data["update"]["_meta"]["qwen.session.recordId"] = "changed"
    assert record_ids_of(event) == ("r1", "r2")  # typed from the bytes, not from data
    built = DaemonEvent(type="session_update", data={"update": {**_TEXT, "_meta": _RID}})
    kept = built.payload
    assert isinstance(kept, SessionUpdateData)
    built.data = {"update": _TEXT}
    assert record_ids_of(built) == ("r1", "r2")  # the kept payload, not the new data
