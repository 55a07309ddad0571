"""The shared wire protocol (``sdk.protocol``): envelope rules, typed payloads decoded straight
from frame bytes, the ACP update union, marker validation on real frames, the SSE codec, the
resume cursor, and terminal builders/outcomes. Pure: no daemon, no sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from daemon.core.envelope import build_envelope, encode_json, synthetic
from sdk._errors import TurnError
from sdk.protocol import cursor as cursor_mod
from sdk.protocol.constants import MAX_EVENT_ID
from sdk.protocol.cursor import ResumeCursor, check_cursor
from sdk.protocol.envelope import DaemonEvent, UnknownEventCounter, decode_event, encode_envelope
from sdk.protocol.events import (
    AgentMessageChunk,
    AgentThoughtChunk,
    AvailableCommandsUpdate,
    CurrentModeUpdate,
    DaemonHistoryTruncatedData,
    Plan,
    RawUpdate,
    SessionUpdateData,
    StateResyncRequiredData,
    ToolCall,
    ToolCallUpdate,
    TurnCompleteData,
    TurnErrorData,
    UserMessageChunk,
    parse_truncation,
)
from sdk.protocol.sse import SSEParser, encode_sse_frame, parse_sse, sse_head
from sdk.protocol.terminals import (
    CHANNEL_CLOSED,
    SESSION_CLOSED,
    TerminalOutcome,
    terminal_for,
    terminal_of,
    turn_complete,
    turn_error,
)
from tests.builders import wire_bodies

SAMPLES = json.loads((Path(__file__).parents[1] / "fixtures" / "wire_samples.json").read_text())
MARKERS: list[dict[str, Any]] = SAMPLES["markers"]


def frame(kind: str, data: Any, **envelope: Any) -> bytes:
    return msgspec.json.encode({"v": 1, "type": kind, "data": data, **envelope})


# --- history_truncated from real frames ------------------------------------------------------------


@pytest.mark.parametrize("sample", MARKERS, ids=lambda s: f"{s['sample']}:{s['list']}")
def test_convert_decodes_real_marker_payloads(sample: dict[str, Any]) -> None:
    payload = sample["frame"]["data"]
    marker = msgspec.convert(payload, DaemonHistoryTruncatedData)
    assert marker.truncated_events == payload["truncatedEvents"]
    assert marker.retained_events == payload["retainedEvents"]
    assert marker.max_bytes == payload["maxBytes"]
    assert marker.full_transcript_available is payload["fullTranscriptAvailable"]
    assert marker.scope == payload.get("scope")
    assert marker.max_events == payload.get("maxEvents")
    assert marker.truncated_turns == payload.get("truncatedTurns")
    assert marker.record_id == payload.get("recordId")
    assert marker.is_live == (sample["list"] == "liveJournal")
    # The whole frame decodes in one pass to the same typed payload, data kept whole.
    event = decode_event(msgspec.json.encode(sample["frame"]))
    assert event is not None and event.payload == marker and event.data == payload


BASE = MARKERS[0]["frame"]["data"]


def test_marker_rules_hold_under_convert_and_parse() -> None:
    as_float = msgspec.convert({**BASE, "truncatedEvents": 24.0, "maxBytes": 4096.0},
                               DaemonHistoryTruncatedData)
    assert as_float.truncated_events == 24 and type(as_float.truncated_events) is int
    assert type(as_float.max_bytes) is int
    odd_record = msgspec.convert({**BASE, "recordId": 7}, DaemonHistoryTruncatedData)
    assert odd_record.record_id is None
    for bad in (
        {**BASE, "retainedEvents": True},  # booleans are not counts
        {**BASE, "maxEvents": 1.5},
        {**BASE, "maxEvents": -1},
        {**BASE, "maxEvents": None},
        {**BASE, "scope": None},
        {**BASE, "scope": ""},
        {**BASE, "fullTranscriptAvailable": 1},
        {**BASE, "reason": "other"},
    ):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, DaemonHistoryTruncatedData)
        assert parse_truncation(bad) is None


def test_malformed_marker_is_an_unrecognised_event_never_an_exception() -> None:
    counter = UnknownEventCounter()
    event = decode_event(frame("history_truncated", {**BASE, "maxEvents": "4"}))
    assert event is not None
    assert counter.observe(event) is None
    assert counter.by_type == {"history_truncated": 1}
    assert list(counter.recent) == [event] and event.data["maxEvents"] == "4"


def test_unknown_marker_keys_are_kept_in_extra() -> None:
    marker = parse_truncation({**BASE, "futureKey": [1], "extra": 5})
    assert marker is not None and marker.extra == {"futureKey": [1], "extra": 5}


# --- one-pass decoding ------------------------------------------------------------------------------


def test_payload_is_decoded_from_the_frame_bytes_not_from_data() -> None:
    event = decode_event(frame("turn_error", {"sessionId": "s", "message": "boom",
                                              "code": "channel_closed", "promptId": "p"}))
    assert event is not None
    event.data["message"] = "changed after decoding"
    payload = event.payload
    assert isinstance(payload, TurnErrorData) and payload.message == "boom"
    # A frame built in code converts its data instead.
    built = DaemonEvent(type="turn_error", data={"promptId": "p", "message": "hi"})
    assert built.payload == TurnErrorData(prompt_id="p", message="hi")


def test_unknown_types_and_fields_pass_through() -> None:
    counter = UnknownEventCounter()
    raw = frame("future_event", {"anything": [1, 2]}, id=4, promptId="p", futureEnvelopeKey=1)
    event = decode_event(raw)
    assert event is not None and (event.id, event.prompt_id) == (4, "p")
    assert event.payload is None and event.data == {"anything": [1, 2]}
    assert counter.observe(event) is None and counter.total == 1
    known = decode_event(frame("turn_complete", {"promptId": "p", "branchPoint": {"x": 1}}))
    assert known is not None and known.payload == TurnCompleteData(prompt_id="p")
    assert known.data["branchPoint"] == {"x": 1}


@pytest.mark.parametrize(
    ("update", "cls"),
    [
        ({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "a"}},
         UserMessageChunk),
        ({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "a"}},
         AgentMessageChunk),
        ({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "a"}},
         AgentThoughtChunk),
        ({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "Read"}, ToolCall),
        ({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "done"},
         ToolCallUpdate),
        ({"sessionUpdate": "plan", "entries": [{"content": "x", "status": "completed"}]}, Plan),
        ({"sessionUpdate": "available_commands_update", "availableCommands": []},
         AvailableCommandsUpdate),
        ({"sessionUpdate": "current_mode_update", "currentModeId": "code"}, CurrentModeUpdate),
    ],
)
def test_acp_updates_decode_by_their_tag(update: dict[str, Any], cls: type) -> None:
    event = decode_event(frame("session_update", {"sessionId": "s", "update": update}))
    assert event is not None and isinstance(event.payload, SessionUpdateData)
    assert type(event.payload.acp) is cls
    assert event.payload.acp == DaemonEvent(type="session_update", data={"update": update}
                                            ).payload.acp  # type: ignore[union-attr]


def test_acp_update_fields_and_meta_are_typed() -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"},
              "_meta": {"qwen.session.recordId": "r1", "source": "bridge-echo",
                        "qwenTranscript": {"sourceRecordIds": ["r1", "r2", 3]},
                        "timestamp": 5}}
    event = decode_event(frame("session_update", {"sessionId": "s", "update": update}))
    assert event is not None and isinstance(event.payload, SessionUpdateData)
    acp = event.payload.acp
    assert isinstance(acp, AgentMessageChunk)
    assert (acp.text, acp.record_ids, acp.agent_timestamp) == ("hi", ("r1", "r2"), 5.0)
    assert acp.meta is not None and acp.meta.source == "bridge-echo"


def test_unknown_and_malformed_update_kinds_pass_through_raw() -> None:
    new_kind = {"sessionUpdate": "brand_new", "x": 1, "_meta": {"promptId": "p"}}
    event = decode_event(frame("session_update", {"update": new_kind}))
    assert event is not None and isinstance(event.payload, SessionUpdateData)
    raw = event.payload.acp
    assert isinstance(raw, RawUpdate) and raw.kind == "brand_new" and raw.data == new_kind
    assert not raw.typed_kind and raw.meta is not None and raw.meta.prompt_id == "p"
    bad = {"sessionUpdate": "tool_call", "toolCallId": 5}
    event = decode_event(frame("session_update", {"update": bad}))
    assert event is not None and isinstance(event.payload, SessionUpdateData)
    assert isinstance(event.payload.acp, RawUpdate) and event.payload.acp.typed_kind


def test_reference_page_shape_is_a_session_update_too() -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "r"}}
    event = decode_event(frame("session_update", update))
    assert event is not None and isinstance(event.payload, SessionUpdateData)
    assert isinstance(event.payload.acp, AgentMessageChunk) and event.payload.acp.text == "r"


# --- the envelope and the SSE codec share the daemon's bytes -------------------------------------------


@pytest.mark.parametrize("event_id", [None, 9])
def test_encode_envelope_is_byte_identical_to_the_daemons(event_id: int | None) -> None:
    data = {"sessionId": "s", "stopReason": "end_turn", "promptId": "p"}
    meta = {"serverTimestamp": 1796204622728}
    daemon_bytes = encode_json(build_envelope(
        event_id, "turn_complete", data, now_ms=1796204622728, prompt_id="p",
        originator_client_id="c",
    ))
    ours = encode_envelope("turn_complete", data, event_id=event_id, prompt_id="p",
                           originator_client_id="c", meta=meta)
    assert ours == daemon_bytes
    typed = encode_envelope("turn_complete", turn_complete("s", "p"), event_id=event_id,
                            prompt_id="p", originator_client_id="c", meta=meta)
    assert typed == daemon_bytes


def test_sse_frames_match_the_daemons_and_parse_back() -> None:
    published = synthetic("state_resync_required", {"reason": "epoch_reset"}, now_ms=1)
    assert encode_sse_frame(published.raw, published.type, None) == published.sse_frame
    assert sse_head("session_update", 3) == b"id: 3\nevent: session_update\ndata: "
    frames = [msgspec.json.encode(f) for f in SAMPLES["sse_frames"]]
    stream = b"retry: 3000\n\n" + b"".join(
        encode_sse_frame(raw, f["type"], f.get("id")) for raw, f in zip(
            frames, SAMPLES["sse_frames"], strict=True))
    parser = SSEParser()
    events = [e for i in range(0, len(stream), 7) for e in parser.feed(stream[i:i + 7])]
    assert [msgspec.to_builtins(e) for e in events] == [
        msgspec.to_builtins(decode_event(raw)) for raw in frames]
    assert parser.retry_ms == 3000


def test_the_real_capture_parses_into_typed_events() -> None:
    events = parse_sse([SAMPLES["sse_text"].encode()])
    assert len(events) == len(SAMPLES["sse_frames"])
    kinds = {type(e.payload).__name__ for e in events}
    assert {"SessionUpdateData", "TurnCompleteData", "ReplayCompleteData",
            "StateResyncRequiredData"} <= kinds
    resync = [e.payload for e in events if isinstance(e.payload, StateResyncRequiredData)]
    assert resync[0].reason == "epoch_reset"


# --- the resume cursor ---------------------------------------------------------------------------------


def ev(kind: str, event_id: int | None = None, **data: Any) -> DaemonEvent:
    return DaemonEvent(type=kind, id=event_id, data=data)


def test_cursor_advances_only_from_ids_to_the_max() -> None:
    cursor = ResumeCursor(None, "e1")
    cursor.observe(ev("replay_complete"))
    assert cursor.last_event_id is None
    for ident in (3, 7, 5):
        cursor.observe(ev("session_update", ident))
    assert cursor.last_event_id == 7
    cursor.observe(ev("state_resync_required", reason="ring_evicted"))
    assert cursor.last_event_id == 7


def test_cursor_restarts_at_zero_on_an_epoch_reset() -> None:
    cursor = ResumeCursor(40, "old")
    cursor.observe(ev("state_resync_required", reason="epoch_reset", lastDeliveredId=40))
    assert cursor.last_event_id == 0
    cursor.answered("new")
    cursor.observe(ev("session_update", 1))
    assert (cursor.last_event_id, cursor.epoch) == (1, "new")
    cursor.answered(None)
    assert cursor.epoch == "new"


@pytest.mark.parametrize("bad", [-1, MAX_EVENT_ID + 1, True, 1.0, "3"])
def test_cursor_values_are_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match="last_event_id"):
        check_cursor(bad)
    assert check_cursor(0) == 0 and check_cursor(MAX_EVENT_ID) == MAX_EVENT_ID


def test_the_sdk_streams_and_handle_share_one_cursor_type() -> None:
    import sdk._client
    import sdk._session
    import sdk._ws

    for module in (sdk._client, sdk._ws, sdk._session):
        assert module.ResumeCursor is cursor_mod.ResumeCursor


# --- terminals -------------------------------------------------------------------------------------------


def test_builders_need_a_prompt_id_and_match_the_daemons_bytes() -> None:
    with pytest.raises(ValueError):
        turn_error("s", "", CHANNEL_CLOSED, "Agent process exited")
    hand_built = {"sessionId": "s", "message": "Session closed", "code": "session_closed",
                  "promptId": "p"}
    assert msgspec.json.encode(turn_error("s", "p", SESSION_CLOSED, "Session closed")) == (
        encode_json(hand_built))


def test_terminal_outcome_keeps_code_and_message_of_a_malformed_turn_error() -> None:
    event = ev("turn_error", promptId="p", code=-32603, message="internal")
    assert event.payload is None  # a numeric code does not fit TurnErrorData
    outcome = terminal_for(event, "p")
    assert outcome == TerminalOutcome(prompt_id="p", type="turn_error", code="-32603",
                                      message="internal")
    with pytest.raises(TurnError) as info:
        outcome.result()
    assert (info.value.code, info.value.message, info.value.prompt_id) == (
        "-32603", "internal", "p")


def test_terminal_for_matches_data_prompt_id_strictly() -> None:
    done = ev("turn_complete", promptId="p", stopReason="cancelled")
    assert terminal_for(done, "q") is None
    assert terminal_for(ev("session_update", 1, promptId="p"), "p") is None
    outcome = terminal_for(done, "p")
    assert outcome is not None and outcome.result() == TurnCompleteData(
        prompt_id="p", stop_reason="cancelled")
    assert terminal_of(ev("turn_complete", stopReason="end_turn")) is None


# --- load answers and transcript pages decode their frames the same way -----------------------------


async def test_load_and_page_frames_decode_from_the_answer_bytes() -> None:
    import httpx

    from sdk._client import DaemonClient

    error = {"v": 1, "type": "turn_error", "id": 3,
             "data": {"sessionId": "s", "message": "boom", "code": "channel_closed",
                      "promptId": "p"}}
    page_update = {"sessionUpdate": "agent_message_chunk",
                   "content": {"type": "text", "text": "ref"}}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/load"):
            return httpx.Response(200, json=wire_bodies.resume(
                "s", last_event_id=3, epoch="e",
                compactedReplay=[error, {"v": 2, "type": "x"}], liveJournal=[]))
        return httpx.Response(200, json={
            "v": 1, "sessionId": "s", "hasMore": True, "nextCursor": "c1",
            "events": [{"v": 1, "type": "session_update", "data": page_update}, 7]})

    async with DaemonClient("http://127.0.0.1:9", transport=httpx.MockTransport(answer)) as c:
        load = await c.load_session("s")
        page = await c.transcript_page("s")
    assert [e.id for e in load.events] == [3] and load.last_event_id == 3
    event = load.compacted_replay[0]
    event.data["message"] = "changed after decoding"
    assert isinstance(event.payload, TurnErrorData) and event.payload.message == "boom"
    assert (page.has_more, page.next_cursor, len(page.events)) == (True, "c1", 1)
    assert page.events[0].data == {"sessionId": "s", "update": page_update}
    payload = page.events[0].payload
    assert isinstance(payload, SessionUpdateData) and isinstance(payload.acp, AgentMessageChunk)
