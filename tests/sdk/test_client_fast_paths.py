"""The client's hot paths keep the rules of the slow ones they replaced.

The reducer's text and tool paths read the typed update inline, code-built updates are
converted straight to their kind's Struct, the envelope's server time has an integer fast path,
snapshot replay checks markers inline and skips trimming an unbounded draft, and blocks are not
tracked by the cycle collector. Each test pins one rule those shortcuts could break.
"""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest

from sdk.protocol.envelope import DaemonEvent, decode_event, read_payload, server_timestamp
from sdk.protocol.events import (
    AgentMessageChunk,
    RawUpdate,
    SessionUpdateData,
    ToolCall,
    ToolCallUpdate,
    payload_from_data,
)
from webui_model import DEFAULT_MAX_BLOCKS, TextBlock, ToolBlock, TranscriptStore
from webui_model.blocks import MessageBlock, PermissionBlock
from webui_model.draft import TranscriptDraft
from webui_model.replay import run_events

P1 = "prompt-1"


def su(update: dict[str, Any], *, id: int | None = None, prompt: str | None = P1,
       meta: dict[str, Any] | None = None) -> DaemonEvent:
    return DaemonEvent(type="session_update", id=id, prompt_id=prompt, meta=meta,
                       data={"sessionId": "s", "update": update})


def chunk(kind: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": content, **extra}


# --- code-built updates ----------------------------------------------------------------------


def acp_of(update: dict[str, Any]) -> Any:
    payload = payload_from_data("session_update", {"sessionId": "s", "update": update})
    assert isinstance(payload, SessionUpdateData)
    return payload.acp


def test_code_built_update_becomes_its_kinds_struct() -> None:
    assert type(acp_of({"sessionUpdate": "tool_call", "toolCallId": "t"})) is ToolCall
    assert type(acp_of({"sessionUpdate": "tool_call_update", "toolCallId": "t"})) is ToolCallUpdate
    typed = acp_of(chunk("agent_message_chunk", {"type": "text", "text": "hi"}))
    assert type(typed) is AgentMessageChunk and typed.text == "hi"


@pytest.mark.parametrize("kind", [["agent_message_chunk"], {"k": 1}, 7, None])
def test_code_built_update_with_a_non_string_kind_passes_through_raw(kind: object) -> None:
    typed = acp_of({"sessionUpdate": kind, "x": 1})
    assert isinstance(typed, RawUpdate)
    assert typed.kind is None and typed.data == {"sessionUpdate": kind, "x": 1}


def test_code_built_update_of_a_typed_kind_that_does_not_fit_is_raw_and_malformed() -> None:
    typed = acp_of({"sessionUpdate": "tool_call", "toolCallId": 5})
    assert isinstance(typed, RawUpdate) and typed.typed_kind


def test_code_built_and_decoded_updates_agree() -> None:
    update = {"sessionUpdate": "tool_call", "toolCallId": "t", "title": "Read",
              "status": "pending", "_meta": {"qwen.session.recordId": "r1"}, "extra": [1]}
    built = su(update)
    decoded = decode_event(msgspec.json.encode({"v": 1, "type": "session_update",
                                           "data": {"sessionId": "s", "update": update}}))
    assert decoded is not None
    assert read_payload(built) == read_payload(decoded)
    built_payload, decoded_payload = read_payload(built), read_payload(decoded)
    assert isinstance(built_payload, SessionUpdateData)
    assert isinstance(decoded_payload, SessionUpdateData)
    assert built_payload.acp == decoded_payload.acp


# --- envelope and update times ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [(1796204622451, 1796204622451.0), (12.5, 12.5), (True, None), (False, None),
     ("1", None), (float("inf"), None), (float("nan"), None), (None, None)],
)
def test_server_timestamp_takes_finite_numbers_only(stamp: object, expected: float | None) -> None:
    event = DaemonEvent(type="x", meta={"serverTimestamp": stamp})
    value = server_timestamp(event)
    assert value == expected
    assert value is None or type(value) is float


def test_server_timestamp_without_meta_is_none() -> None:
    assert server_timestamp(DaemonEvent(type="x")) is None


@pytest.mark.parametrize(
    ("update_fields", "expected"),
    [({}, None), ({"timestamp": 5}, 5.0), ({"_meta": {"timestamp": 7}}, 7.0),
     ({"timestamp": True, "_meta": {"timestamp": 7}}, 7.0),
     ({"timestamp": "x"}, None), ({"timestamp": 3, "_meta": {"timestamp": 7}}, 3.0)],
)
def test_block_takes_the_agent_time_of_the_update(
    update_fields: dict[str, Any], expected: float | None
) -> None:
    store = TranscriptStore()
    store.dispatch(su({"sessionUpdate": "tool_call", "toolCallId": "t", **update_fields}))
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": "a"},
                            **update_fields)))
    tool, text = store.blocks
    assert isinstance(tool, ToolBlock) and isinstance(text, TextBlock)
    assert tool.timestamp == expected and text.timestamp == expected


# --- text chunks -------------------------------------------------------------------------------


def test_text_chunk_shows_non_text_content_by_its_type() -> None:
    store = TranscriptStore()
    store.dispatch(su(chunk("agent_message_chunk", {"type": "image", "data": "..."}), id=1))
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": 5}), id=2))
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": " ok"}), id=3))
    (block,) = store.blocks
    assert isinstance(block, TextBlock) and block.text == "[image][text] ok"
    assert block.event_id == 1 and block.last_event_id == 3


def test_appended_chunk_keeps_the_last_id_and_time_when_the_event_has_none() -> None:
    store = TranscriptStore()
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": "a"}), id=4,
                      meta={"serverTimestamp": 100}))
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": "b"})))
    (block,) = store.blocks
    assert isinstance(block, TextBlock)
    assert (block.text, block.last_event_id, block.updated_at) == ("ab", 4, 100.0)
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": "c"}), id=9,
                      meta={"serverTimestamp": 200}))
    (block,) = store.blocks
    assert isinstance(block, TextBlock)
    assert (block.last_event_id, block.updated_at, block.server_timestamp) == (9, 200.0, 100.0)


def test_empty_chunk_with_a_record_id_stamps_the_active_block() -> None:
    store = TranscriptStore()
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": "a"},
                            _meta={"qwen.session.recordId": "r1"})))
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": ""},
                            _meta={"qwen.session.recordId": "r2"})))
    store.dispatch(su(chunk("agent_message_chunk", {"type": "text", "text": ""},
                            _meta={"qwen.session.recordId": "r1"})))
    (block,) = store.blocks
    assert isinstance(block, TextBlock) and block.source_record_ids == ("r1", "r2")


def test_each_text_kind_extends_only_its_own_block() -> None:
    store = TranscriptStore()
    for kind, text in [("agent_thought_chunk", "t1"), ("agent_message_chunk", "a1"),
                       ("agent_thought_chunk", "t2"), ("user_message_chunk", "u1"),
                       ("user_message_chunk", "u2")]:
        store.dispatch(su(chunk(kind, {"type": "text", "text": text})))
    assert [(b.kind, getattr(b, "text", None)) for b in store.blocks] == [
        ("thought", "t1"), ("assistant", "a1"), ("thought", "t2"), ("user", "u1u2")]


# --- snapshot replay ---------------------------------------------------------------------------


def live_marker() -> DaemonEvent:
    return DaemonEvent(type="history_truncated", prompt_id=P1, data={
        "reason": "replay_window_exceeded", "scope": "live_journal", "truncatedEvents": 5,
        "retainedEvents": 2, "maxBytes": 100, "fullTranscriptAvailable": True})


def test_run_events_trims_a_bounded_draft_after_every_event() -> None:
    draft = TranscriptDraft(max_blocks=2)
    events = [su({"sessionUpdate": "tool_call", "toolCallId": f"t{i}"}) for i in range(5)]
    run_events(draft, events)
    assert [b.tool_call_id for b in draft.blocks if isinstance(b, ToolBlock)] == ["t3", "t4"]


def test_run_events_keeps_an_unbounded_draft_whole() -> None:
    draft = TranscriptDraft(max_blocks=None)
    run_events(draft, [su({"sessionUpdate": "tool_call", "toolCallId": f"t{i}"})
                       for i in range(5)])
    assert len(draft.blocks) == 5


def test_run_events_captures_the_state_before_the_first_live_marker_only() -> None:
    draft = TranscriptDraft(max_blocks=None)
    events = [su({"sessionUpdate": "tool_call", "toolCallId": "t0"}), live_marker(),
              su({"sessionUpdate": "tool_call", "toolCallId": "t1"}), live_marker()]
    run = run_events(draft, events)
    assert run.marker_event is events[1]
    assert run.marker_state is not None and len(run.marker_state.blocks) == 1
    assert run.marker_block_id == draft.blocks[1].id
    assert len(draft.blocks) == 4


# --- the collector -------------------------------------------------------------------------------


def test_blocks_are_not_tracked_by_the_cycle_collector() -> None:
    store = TranscriptStore(max_blocks=DEFAULT_MAX_BLOCKS)
    store.dispatch(su({"sessionUpdate": "tool_call", "toolCallId": "t", "rawInput": {"a": [1]}}))
    store.dispatch(DaemonEvent(type="permission_request",
                               data={"requestId": "r", "options": [{"optionId": "o"}],
                                     "toolCall": {"toolCallId": "t"}}))
    store.dispatch(DaemonEvent(type="agent_lifecycle_hint", data={"nested": {"a": [1]}}))
    kinds = {type(b) for b in store.blocks}
    assert kinds == {ToolBlock, PermissionBlock, MessageBlock}
    for block in store.blocks:
        assert not gc.is_tracked(block), block
