"""The reducer's rules and its side-effect table, one rule per test."""

from __future__ import annotations

from typing import Any

import pytest

from sdk.protocol.envelope import DaemonEvent
from webui_model import (
    ConnectionMetadata,
    FollowUpSuggestion,
    InjectedMessage,
    MessageBlock,
    Notice,
    PendingPromptPublication,
    PermissionBlock,
    TextBlock,
    ToolBlock,
    TranscriptStore,
    WorkspaceSignal,
)

P1 = "prompt-1"
P2 = "prompt-2"


def update(
    session_kind: str,
    /,
    *,
    id: int | None = None,
    prompt: str | None = None,
    text: str | None = None,
    meta: dict[str, Any] | None = None,
    server_ts: float | None = None,
    **fields: Any,
) -> DaemonEvent:
    body: dict[str, Any] = {"sessionUpdate": session_kind, **fields}
    if text is not None:
        body["content"] = {"type": "text", "text": text}
    if meta is not None:
        body["_meta"] = meta
    return DaemonEvent(
        type="session_update",
        id=id,
        prompt_id=prompt,
        data={"sessionId": "s", "update": body},
        meta=None if server_ts is None else {"serverTimestamp": server_ts},
    )


def frame(type_: str, *, id: int | None = None, prompt: str | None = None, **data: Any) -> DaemonEvent:
    return DaemonEvent(type=type_, id=id, prompt_id=prompt, data=data)


def echo(text: str, prompt: str = P1, id: int | None = None) -> DaemonEvent:
    return update(
        "user_message_chunk", id=id, prompt=prompt, text=text, meta={"source": "bridge-echo"}
    )


def kinds(store: TranscriptStore) -> list[str]:
    return [block.kind for block in store.blocks]


def only(store: TranscriptStore) -> Any:
    assert len(store.blocks) == 1, store.blocks
    return store.blocks[0]


# --- text ---------------------------------------------------------------------------------------


def test_user_chunks_merge_into_the_active_user_block_of_the_same_prompt() -> None:
    store = TranscriptStore()
    store.dispatch(echo("hello ", id=1))
    store.dispatch(echo("world", id=2))
    block = only(store)
    assert isinstance(block, TextBlock)
    assert (block.id, block.kind, block.text, block.streaming) == ("user-1", "user", "hello world", False)
    assert (block.event_id, block.last_event_id, block.prompt_id) == (1, 2, P1)


def test_user_chunk_of_another_prompt_starts_a_new_user_block() -> None:
    store = TranscriptStore()
    store.dispatch(echo("one", P1))
    store.dispatch(echo("two", P2))
    assert [(b.id, b.text) for b in store.blocks] == [("user-1", "one"), ("user-2", "two")]  # type: ignore[union-attr]


def test_agent_chunks_append_to_one_streaming_assistant_block() -> None:
    store = TranscriptStore()
    for i, piece in enumerate(["Hello", " from", " fake"], start=3):
        store.dispatch(update("agent_message_chunk", id=i, prompt=P1, text=piece))
    block = only(store)
    assert isinstance(block, TextBlock)
    assert (block.kind, block.text, block.streaming) == ("assistant", "Hello from fake", True)
    assert store.active_block("assistant") is block


def test_thought_chunks_go_to_a_collapsed_thought_block() -> None:
    store = TranscriptStore()
    store.dispatch(update("agent_thought_chunk", prompt=P1, text="think"))
    store.dispatch(update("agent_thought_chunk", prompt=P1, text="ing"))
    block = only(store)
    assert isinstance(block, TextBlock)
    assert (block.id, block.text, block.collapsed, block.streaming) == ("thought-1", "thinking", True, True)


def test_an_update_replaces_the_block_object_and_leaves_the_old_one_untouched() -> None:
    store = TranscriptStore()
    store.dispatch(update("agent_message_chunk", prompt=P1, text="a"))
    first = store.blocks[0]
    store.dispatch(update("agent_message_chunk", prompt=P1, text="b"))
    second = store.blocks[0]
    assert second is not first
    assert isinstance(first, TextBlock) and isinstance(second, TextBlock)
    assert (first.text, second.text, second.id) == ("a", "ab", first.id)


def test_a_tool_call_ends_the_text_run_so_later_text_starts_a_new_block() -> None:
    store = TranscriptStore()
    store.dispatch(update("agent_message_chunk", prompt=P1, text="before"))
    store.dispatch(update("tool_call", prompt=P1, toolCallId="t1", title="ls", status="pending"))
    store.dispatch(update("agent_message_chunk", prompt=P1, text="after"))
    assert [b.id for b in store.blocks] == ["assistant-1", "tool-1", "assistant-2"]
    before = store.blocks[0]
    assert isinstance(before, TextBlock) and before.streaming is False


def test_a_status_line_does_not_split_an_answer() -> None:
    store = TranscriptStore()
    store.dispatch(update("agent_message_chunk", prompt=P1, text="a"))
    store.dispatch(frame("slow_client_warning", queueSize=200, maxQueued=256))
    store.dispatch(update("agent_message_chunk", prompt=P1, text="b"))
    assert kinds(store) == ["assistant", "status"]
    assert store.blocks[0].text == "ab"  # type: ignore[union-attr]


def test_block_stamps_come_from_the_event() -> None:
    store = TranscriptStore()
    event = update(
        "agent_message_chunk",
        id=8,
        text="x",
        server_ts=1796204746015,
        meta={
            "timestamp": 1796204746000,
            "qwenTranscript": {"sourceRecordIds": ["rec-a"]},
            "qwen.session.recordId": "rec-a",
            "promptId": "from-meta",
        },
    )
    store.dispatch(event)
    block = only(store)
    assert block.server_timestamp == 1796204746015
    assert block.updated_at == 1796204746015
    assert block.timestamp == 1796204746000
    assert block.source_record_ids == ("rec-a",)
    # A restored record carries its prompt only inside update._meta.
    assert block.prompt_id == "from-meta"


# --- tools and plans ------------------------------------------------------------------------


def test_tool_call_and_updates_upsert_one_block_by_tool_call_id() -> None:
    store = TranscriptStore()
    store.dispatch(update("tool_call", id=1, prompt=P1, toolCallId="t1", title="Read", status="pending", kind="read", rawInput={"path": "a"}))
    store.dispatch(update("tool_call_update", id=2, prompt=P1, toolCallId="t1", status="in_progress", rawInput=None))
    store.dispatch(update("tool_call_update", id=3, prompt=P1, toolCallId="t1", status="completed", rawOutput="ok"))
    block = only(store)
    assert isinstance(block, ToolBlock)
    assert (block.id, block.tool_call_id, block.title, block.status) == ("tool-1", "t1", "Read", "completed")
    # Later non-null fields win; a null never erases an earlier value.
    assert block.data == {"kind": "read", "rawInput": {"path": "a"}, "rawOutput": "ok"}
    assert (block.event_id, block.last_event_id) == (1, 3)
    assert store.tool_block("t1") is block


def test_tool_call_update_for_an_unknown_tool_creates_its_block() -> None:
    store = TranscriptStore()
    store.dispatch(update("tool_call_update", toolCallId="late", status="in_progress"))
    block = only(store)
    assert isinstance(block, ToolBlock) and (block.tool_call_id, block.status) == ("late", "in_progress")


def test_tool_call_without_an_id_is_a_debug_block() -> None:
    store = TranscriptStore()
    store.dispatch(update("tool_call", title="?"))
    block = only(store)
    assert isinstance(block, MessageBlock)
    assert (block.kind, block.code) == ("debug", "malformed_payload")


def test_plan_is_a_tool_block_with_tool_call_id_plan_upserted_per_prompt() -> None:
    store = TranscriptStore()
    entries = [{"content": "a", "status": "pending"}]
    store.dispatch(update("plan", prompt=P1, entries=entries))
    done = [{"content": "a", "status": "completed"}]
    store.dispatch(update("plan", prompt=P1, entries=done))
    block = only(store)
    assert isinstance(block, ToolBlock)
    assert (block.tool_call_id, block.title, block.status) == ("plan", "Plan", "completed")
    assert block.data == {"entries": done}
    store.dispatch(update("plan", prompt=P2, entries=entries))
    assert [b.id for b in store.blocks] == ["tool-1", "tool-2"]
    assert store.tool_block("plan") is store.blocks[1]


# --- history_truncated ------------------------------------------------------------------------

LIVE_MARKER = {
    "reason": "replay_window_exceeded",
    "scope": "live_journal",
    "truncatedEvents": 4,
    "retainedEvents": 2,
    "maxBytes": 512,
    "maxEvents": 10000,
    "fullTranscriptAvailable": True,
    "futureKey": {"kept": True},
}


def test_valid_marker_becomes_a_status_block_with_the_full_payload_and_exact_text() -> None:
    store = TranscriptStore()
    store.dispatch(DaemonEvent(type="history_truncated", prompt_id=P1, data=LIVE_MARKER))
    block = only(store)
    assert isinstance(block, MessageBlock)
    assert (block.kind, block.source, block.prompt_id) == ("status", "history_truncated", P1)
    assert block.data == LIVE_MARKER  # unknown keys included
    assert block.text == (
        "History truncated for live turn replay: kept the latest 2 source events and dropped 4 "
        "older source events (limits: 10000 replay entries / 512 bytes). Complete content "
        "remains available after the turn finishes."
    )


@pytest.mark.parametrize(
    "bad",
    [
        {**LIVE_MARKER, "maxEvents": -1},
        {**LIVE_MARKER, "fullTranscriptAvailable": "yes"},
        {**LIVE_MARKER, "scope": ""},
        {**LIVE_MARKER, "reason": "other"},
        {**LIVE_MARKER, "truncatedEvents": "3"},
    ],
)
def test_malformed_marker_becomes_one_debug_block(bad: dict[str, Any]) -> None:
    store = TranscriptStore()
    store.dispatch(DaemonEvent(type="history_truncated", data=bad))
    block = only(store)
    assert isinstance(block, MessageBlock)
    assert block.kind == "debug"
    assert block.code == "malformed_payload"
    assert block.text == "history_truncated: malformed history_truncated payload"
    assert block.data == bad


# --- terminals ----------------------------------------------------------------------------------


def _turn_with_tools(store: TranscriptStore) -> None:
    store.dispatch(echo("go"))
    store.dispatch(update("tool_call", prompt=P1, toolCallId="done", status="completed"))
    store.dispatch(update("tool_call", prompt=P1, toolCallId="running", status="in_progress"))
    store.dispatch(update("tool_call", prompt=P1, toolCallId="waiting", status="pending"))
    store.dispatch(update("agent_thought_chunk", prompt=P1, text="hmm"))
    store.dispatch(update("agent_message_chunk", prompt=P1, text="partial"))


def _statuses(store: TranscriptStore) -> dict[str, str]:
    return {b.tool_call_id: b.status for b in store.blocks if isinstance(b, ToolBlock)}


def test_turn_complete_end_turn_ends_streaming_and_keeps_tools() -> None:
    store = TranscriptStore()
    _turn_with_tools(store)
    store.dispatch(frame("turn_complete", prompt=P1, stopReason="end_turn", promptId=P1))
    assert all(not b.streaming for b in store.blocks if isinstance(b, TextBlock))
    assert _statuses(store) == {"done": "completed", "running": "in_progress", "waiting": "pending"}
    assert store.active_block("assistant") is None
    assert kinds(store) == ["user", "tool", "tool", "tool", "thought", "assistant"]


def test_turn_complete_without_stop_reason_is_end_turn() -> None:
    store = TranscriptStore()
    _turn_with_tools(store)
    store.dispatch(frame("turn_complete", prompt=P1, promptId=P1))
    assert _statuses(store)["running"] == "in_progress"
    assert store.blocks[-1].streaming is False  # type: ignore[union-attr]


def test_cancelled_turn_marks_in_flight_tools_cancelled() -> None:
    store = TranscriptStore()
    _turn_with_tools(store)
    store.dispatch(frame("turn_complete", prompt=P1, stopReason="cancelled", promptId=P1))
    assert _statuses(store) == {"done": "completed", "running": "cancelled", "waiting": "cancelled"}
    assert all(not b.streaming for b in store.blocks if isinstance(b, TextBlock))


def test_turn_error_is_an_error_block_and_cancels_in_flight_tools() -> None:
    store = TranscriptStore()
    _turn_with_tools(store)
    store.dispatch(
        frame("turn_error", id=9, prompt=P1, message="boom", code="channel_closed", promptId=P1)
    )
    error = store.blocks[-1]
    assert isinstance(error, MessageBlock)
    assert (error.kind, error.text, error.code, error.source) == ("error", "boom", "channel_closed", "turn_error")
    assert _statuses(store)["running"] == "cancelled"
    assert all(not b.streaming for b in store.blocks if isinstance(b, TextBlock))


def test_assistant_done_can_be_dispatched_on_its_own() -> None:
    store = TranscriptStore()
    _turn_with_tools(store)
    store.dispatch(frame("assistant.done", reason="cancelled"))
    assert _statuses(store)["waiting"] == "cancelled"
    assert store.blocks[-1].streaming is False  # type: ignore[union-attr]


# --- permissions and other frames ----------------------------------------------------------


def test_permission_request_is_resolved_by_permission_resolved() -> None:
    store = TranscriptStore()
    options = [{"optionId": "allow_once", "kind": "allow_once", "name": "Allow"}]
    store.dispatch(frame("permission_request", id=4, requestId="r1", sessionId="s", toolCall={"toolCallId": "t1"}, options=options))
    pending = only(store)
    assert isinstance(pending, PermissionBlock)
    assert (pending.request_id, pending.resolved, pending.options) == ("r1", False, tuple(options))
    store.dispatch(frame("permission_resolved", id=5, requestId="r1", outcome={"outcome": "selected", "optionId": "allow_once"}))
    resolved = only(store)
    assert isinstance(resolved, PermissionBlock)
    assert resolved.resolved is True
    assert resolved.outcome == {"outcome": "selected", "optionId": "allow_once"}
    assert pending.resolved is False  # the old object is never edited


def test_permission_resolved_for_an_unknown_request_changes_nothing() -> None:
    store = TranscriptStore()
    store.dispatch(frame("permission_resolved", requestId="nope", outcome={}))
    assert store.blocks == []


def test_slow_client_warning_is_a_status_block_and_a_notice() -> None:
    store = TranscriptStore()
    effects = store.dispatch(frame("slow_client_warning", queueSize=192, maxQueued=256))
    block = only(store)
    assert (block.kind, block.source) == ("status", "slow_client_warning")
    assert len(effects) == 1 and isinstance(effects[0], Notice)
    assert effects[0].code == "daemon.slow_client_warning"


def test_session_closed_is_a_status_block() -> None:
    store = TranscriptStore()
    assert store.dispatch(frame("session_closed", sessionId="s", reason="client_close")) == []
    block = only(store)
    assert isinstance(block, MessageBlock)
    assert (block.kind, block.text) == ("status", "Session closed (client_close).")


def test_prompt_cancelled_is_a_prompt_cancelled_block() -> None:
    store = TranscriptStore()
    store.dispatch(frame("prompt_cancelled", id=6, prompt=P1, sessionId="s"))
    block = only(store)
    assert (block.id, block.kind, block.prompt_id) == ("prompt_cancelled-1", "prompt_cancelled", P1)


def test_state_resync_required_is_an_error_block_and_connection_metadata() -> None:
    store = TranscriptStore()
    effects = store.dispatch(frame("state_resync_required", reason="ring_evicted", lastDeliveredId=2, earliestAvailableId=45))
    block = only(store)
    assert (block.kind, block.source) == ("error", "state_resync_required")
    assert effects == [ConnectionMetadata(type="state_resync_required", data={"reason": "ring_evicted", "lastDeliveredId": 2, "earliestAvailableId": 45})]


@pytest.mark.parametrize("type_", ["client_evicted", "session_died", "stream_error"])
def test_eviction_death_and_stream_errors_are_notices_without_blocks(type_: str) -> None:
    store = TranscriptStore()
    effects = store.dispatch(frame(type_, reason="queue_overflow"))
    assert store.blocks == []
    assert len(effects) == 1 and isinstance(effects[0], Notice)
    assert effects[0].id == f"daemon.{type_}"


def test_unknown_event_type_is_a_debug_block_keeping_the_raw_frame() -> None:
    store = TranscriptStore()
    store.dispatch(DaemonEvent(type="brand_new_frame", id=3, data={"x": 1}))
    block = only(store)
    assert isinstance(block, MessageBlock)
    assert (block.kind, block.code) == ("debug", "unknown_event_type")
    assert block.data == {"type": "brand_new_frame", "v": 1, "id": 3, "data": {"x": 1}}


def test_unknown_session_update_kind_is_a_debug_block() -> None:
    store = TranscriptStore()
    store.dispatch(update("usage_update", used=3))
    assert (only(store).kind, only(store).code) == ("debug", "unknown_session_update")


# --- no-block frames and side effects ----------------------------------------------------------


def test_workspace_updates_make_no_block_but_a_workspace_signal() -> None:
    store = TranscriptStore()
    commands = update("available_commands_update", id=1, availableCommands=[{"name": "status"}])
    mode = update("current_mode_update", id=2, currentModeId="auto")
    effects = store.dispatch(commands) + store.dispatch(mode)
    assert store.blocks == []
    assert [(e.kind, e.event_id) for e in effects if isinstance(e, WorkspaceSignal)] == [
        ("available_commands_update", 1),
        ("current_mode_update", 2),
    ]


@pytest.mark.parametrize(
    "type_", ["pending_prompt_added", "pending_prompt_started", "pending_prompt_completed"]
)
def test_pending_prompt_frames_make_no_block_but_a_publication(type_: str) -> None:
    store = TranscriptStore()
    effects = store.dispatch(frame(type_, id=7, sessionId="s", promptId=P2, text="queued"))
    assert store.blocks == []
    assert effects == [
        PendingPromptPublication(
            type=type_, prompt_id=P2, data={"sessionId": "s", "promptId": P2, "text": "queued"}, event_id=7
        )
    ]


def test_replay_complete_makes_no_block_but_connection_metadata() -> None:
    store = TranscriptStore()
    effects = store.dispatch(frame("replay_complete", lastReplayedEventId=7, replayedCount=4))
    assert store.blocks == []
    assert [type(e) for e in effects] == [ConnectionMetadata]


def test_follow_up_suggestion_in_update_meta_is_published() -> None:
    store = TranscriptStore()
    effects = store.dispatch(
        update("agent_message_chunk", id=5, prompt=P1, text="done", meta={"followupSuggestion": "Run the tests?"})
    )
    assert effects == [FollowUpSuggestion(suggestion="Run the tests?", prompt_id=P1, event_id=5)]
    assert only(store).text == "done"


def test_non_echo_user_message_mid_turn_is_an_injected_message() -> None:
    store = TranscriptStore()
    assert store.dispatch(echo("start", id=1)) == []  # the daemon's own echo is not injected
    store.dispatch(update("agent_message_chunk", id=2, prompt=P1, text="working"))
    effects = store.dispatch(update("user_message_chunk", id=3, prompt=P1, text="also this"))
    assert effects == [InjectedMessage(text="also this", prompt_id=P1, event_id=3)]
    assert kinds(store) == ["user", "assistant", "user"]


def test_user_message_outside_a_turn_is_not_injected() -> None:
    store = TranscriptStore()
    store.dispatch(echo("first", id=1))
    store.dispatch(frame("turn_complete", id=2, prompt=P1, stopReason="end_turn", promptId=P1))
    # A restored record: no envelope prompt, no bridge-echo source, and no turn running.
    assert store.dispatch(update("user_message_chunk", id=3, text="replayed")) == []


def test_side_effects_false_suppresses_effects_but_not_state() -> None:
    with_effects, without = TranscriptStore(), TranscriptStore()
    events = [
        frame("slow_client_warning", queueSize=1, maxQueued=2),
        update("available_commands_update", availableCommands=[]),
        frame("pending_prompt_added", promptId=P2),
        echo("hi"),
        update("agent_message_chunk", prompt=P1, text="x", meta={"followupSuggestion": "y"}),
    ]
    seen = [effect for event in events for effect in with_effects.dispatch(event)]
    hidden = [effect for event in events for effect in without.dispatch(event, side_effects=False)]
    assert len(seen) == 4 and hidden == []
    assert list(without.blocks) == list(with_effects.blocks)
