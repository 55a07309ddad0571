"""Reducer details pinned down by mutation testing: the exact block
and notice each connection/lifecycle event produces, including the fallbacks for payloads that
lack their optional fields."""

from __future__ import annotations

from typing import Any

import pytest

from sdk.protocol.envelope import DaemonEvent
from webui_model import MessageBlock, ToolBlock, TranscriptStore
from webui_model.effects import ConnectionMetadata, Notice, WorkspaceSignal

# (event type, data) -> the one block it appends: (kind, text, code, source), or None.
BLOCKS: list[tuple[str, Any, tuple[str, str, str | None, str] | None]] = [
    ("slow_client_warning", {"queueSize": 3, "maxQueued": 10},
     ("status", "This client is falling behind the event stream (3 of 10 events queued).",
      "slow_client_warning", "slow_client_warning")),
    ("slow_client_warning", {"bogus": 1},
     ("status", "This client is falling behind the event stream (? of ? events queued).",
      "slow_client_warning", "slow_client_warning")),
    ("state_resync_required", {"reason": "ring_gap"},
     ("error", "The event stream lost continuity (ring_gap); the session will be reloaded.",
      "state_resync_required", "state_resync_required")),
    ("state_resync_required", {},
     ("error", "The event stream lost continuity; the session will be reloaded.",
      "state_resync_required", "state_resync_required")),
    ("session_closed", {"sessionId": "s", "reason": "deleted"},
     ("status", "Session closed (deleted).", "session_closed", "session_closed")),
    ("session_closed", {"sessionId": "s"},
     ("status", "Session closed.", "session_closed", "session_closed")),
    ("prompt_cancelled", {"promptId": "p", "reason": "user"},
     ("prompt_cancelled", "Cancellation requested (user).", None, "prompt_cancelled")),
    ("prompt_cancelled", {"promptId": "p"},
     ("prompt_cancelled", "Cancellation requested.", None, "prompt_cancelled")),
    ("turn_error", {"sessionId": "s", "promptId": "p", "message": "boom", "code": "-1"},
     ("error", "boom", "-1", "turn_error")),
    ("turn_error", {"sessionId": "s", "promptId": "p"},
     ("error", "The turn failed.", None, "turn_error")),
    ("permission_request", {"sessionId": "s", "requestId": "", "options": []},
     ("debug", "permission_request: missing requestId", "malformed_payload",
      "permission_request")),
    ("permission_request", 5,
     ("debug", "permission_request: malformed payload", "malformed_payload",
      "permission_request")),
    ("no_such_event", {"a": 1},
     ("debug", "unknown event type: no_such_event", "unknown_event_type", "no_such_event")),
    ("client_evicted", {"reason": "slow"}, None),
    ("session_died", {"sessionId": "s"}, None),
    ("stream_error", {"message": "x"}, None),
]


@pytest.mark.parametrize(("event_type", "data", "expected"), BLOCKS)
def test_event_appends_its_exact_block(
    event_type: str, data: Any, expected: tuple[str, str, str | None, str] | None
) -> None:
    store = TranscriptStore()
    store.dispatch(DaemonEvent(type=event_type, id=7, prompt_id="p", data=data))
    got = [(b.kind, getattr(b, "text", None), getattr(b, "code", None),
            getattr(b, "source", None)) for b in store.blocks]
    assert got == ([] if expected is None else [expected])
    if expected is not None:
        block = store.blocks[0]
        assert block.prompt_id == "p" and block.event_id == 7


# (event type) -> its notice: (message, severity, category, operation, recoverable).
NOTICES: list[tuple[str, Any, tuple[str, str, str, str | None, bool]]] = [
    ("slow_client_warning", {"queueSize": 3, "maxQueued": 10},
     ("This client is falling behind the event stream; updates may be delayed.",
      "warning", "connection", "subscribe", True)),
    ("client_evicted", {"reason": "slow"},
     ("The daemon closed this client's event stream because it fell too far behind.",
      "warning", "connection", "subscribe", True)),
    ("session_died", {"sessionId": "s", "exitCode": 1},
     ("The agent process of this session exited.", "error", "session", None, False)),
    ("stream_error", {"message": "x"},
     ("The event stream failed.", "error", "connection", "subscribe", True)),
]


@pytest.mark.parametrize(("event_type", "data", "expected"), NOTICES)
def test_event_raises_its_exact_notice(
    event_type: str, data: Any, expected: tuple[str, str, str, str | None, bool]
) -> None:
    effects = TranscriptStore().dispatch(DaemonEvent(type=event_type, id=7, data=data))
    assert len(effects) == 1
    notice = effects[0]
    assert isinstance(notice, Notice)
    assert (notice.message, notice.severity, notice.category, notice.operation,
            notice.recoverable) == expected
    assert notice.id == notice.code == f"daemon.{event_type}"
    assert (notice.event_id, notice.data) == (7, data)


def test_a_resync_is_reported_as_connection_metadata() -> None:
    effects = TranscriptStore().dispatch(
        DaemonEvent(type="state_resync_required", id=7, data={"reason": "ring_gap"}))
    assert effects == [ConnectionMetadata(type="state_resync_required",
                                          data={"reason": "ring_gap"}, event_id=7)]


def test_a_permission_request_becomes_a_permission_block() -> None:
    store = TranscriptStore()
    options = [{"optionId": "allow_once", "name": "Allow", "kind": "allow_once"}]
    store.dispatch(DaemonEvent(type="permission_request", id=4, prompt_id="p", data={
        "requestId": "r1", "sessionId": "s", "toolCall": {"toolCallId": "t1"},
        "options": options}))
    block = store.permission_block("r1")
    assert block is not None and block.kind == "permission"
    assert block.id == "permission-1" and block.prompt_id == "p" and block.event_id == 4
    assert (block.request_id, block.tool_call) == ("r1", {"toolCallId": "t1"})
    assert len(block.options) == 1


def _plan(entries: list[dict[str, Any]], event_id: int) -> DaemonEvent:
    return DaemonEvent(type="session_update", id=event_id, prompt_id="p", data={
        "sessionId": "s", "update": {"sessionUpdate": "plan", "entries": entries}})


def test_a_plan_is_one_tool_block_updated_in_place_until_completed() -> None:
    store = TranscriptStore()
    store.dispatch(_plan([{"content": "a", "status": "pending"}], 1))
    (block,) = store.blocks
    assert isinstance(block, ToolBlock)
    assert block.kind == "tool" and block.title == "Plan"
    assert block.status == "in_progress"
    assert block.data == {"entries": [{"content": "a", "status": "pending"}]}
    assert (block.prompt_id, block.event_id) == ("p", 1)
    done = [{"content": "a", "status": "completed"}]
    store.dispatch(_plan(done, 2))
    (block,) = store.blocks
    assert isinstance(block, ToolBlock)
    assert block.status == "completed"
    assert block.data == {"entries": done}
    assert (block.event_id, block.last_event_id) == (1, 2)


@pytest.mark.parametrize("event_type", ["replay_complete", "session_snapshot"])
def test_stream_metadata_is_passed_on_whole(event_type: str) -> None:
    data = {"replayedCount": 0} if event_type == "replay_complete" else {"sessionId": "s"}
    effects = TranscriptStore().dispatch(DaemonEvent(type=event_type, id=3, data=data))
    assert effects == [ConnectionMetadata(type=event_type, data=data, event_id=3)]


def test_a_truncation_marker_is_a_status_block_of_its_prompt() -> None:
    store = TranscriptStore()
    data = {"reason": "replay_window_exceeded", "scope": "live_journal", "truncatedEvents": 3,
            "retainedEvents": 2, "maxBytes": 100, "fullTranscriptAvailable": True}
    store.dispatch(DaemonEvent(type="history_truncated", prompt_id="p", data=data))
    (block,) = store.blocks
    assert isinstance(block, MessageBlock)
    assert (block.kind, block.code, block.source, block.prompt_id) == (
        "status", "replay_window_exceeded", "history_truncated", "p")
    assert block.data == data
    store.dispatch(DaemonEvent(type="history_truncated", prompt_id="q", data={"reason": 1}))
    block = store.blocks[-1]
    assert isinstance(block, MessageBlock)
    assert (block.kind, block.code, block.source, block.prompt_id) == (
        "debug", "malformed_payload", "history_truncated", "q")


def test_a_malformed_permission_resolution_changes_nothing() -> None:
    store = TranscriptStore()
    store.dispatch(DaemonEvent(type="permission_resolved", id=5, data=7))
    assert all(b.kind == "debug" for b in store.blocks)


# session_update data -> its debug block: (text, code). A bad frame is shown, never dropped.
DEBUG_UPDATES: list[tuple[Any, str, str]] = [
    ({"sessionId": "s"}, "session_update: missing update object", "malformed_payload"),
    ({"sessionId": "s", "update": 5}, "session_update: missing update object",
     "malformed_payload"),
    ({"sessionId": "s", "update": {"sessionUpdate": "tool_call", "title": "x"}},
     "tool_call: missing toolCallId", "malformed_payload"),
    ({"sessionId": "s", "update": {"sessionUpdate": "tool_call", "toolCallId": 5}},
     "tool_call: malformed update", "malformed_payload"),
    ({"sessionId": "s", "update": {"sessionUpdate": "plan", "entries": 5}},
     "plan: malformed update", "malformed_payload"),
    ({"sessionId": "s", "update": {"sessionUpdate": "brand_new_kind", "x": 1}},
     "unknown session update: brand_new_kind", "unknown_session_update"),
]


@pytest.mark.parametrize(("data", "text", "code"), DEBUG_UPDATES)
def test_an_unusable_session_update_becomes_a_debug_block(data: Any, text: str, code: str) -> None:
    store = TranscriptStore()
    assert store.dispatch(DaemonEvent(type="session_update", id=7, prompt_id="p",
                                      data=data)) == []
    (block,) = store.blocks
    assert isinstance(block, MessageBlock)
    assert (block.kind, block.text, block.code, block.source, block.prompt_id,
            block.event_id) == ("debug", text, code, "session_update", "p", 7)


def test_a_workspace_update_is_signalled_with_the_whole_update() -> None:
    update = {"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "c"}]}
    effects = TranscriptStore().dispatch(DaemonEvent(
        type="session_update", id=7, data={"sessionId": "s", "update": update}))
    assert effects == [WorkspaceSignal(kind="available_commands_update", data=update, event_id=7)]


def test_a_notice_carries_the_compact_payload_for_debugging() -> None:
    (notice,) = TranscriptStore().dispatch(
        DaemonEvent(type="stream_error", id=7, data={"message": "x", "n": [1, 2]}))
    assert isinstance(notice, Notice)
    assert notice.debug_message == '{"message":"x","n":[1,2]}'


def _su(update: dict[str, Any], event_id: int) -> DaemonEvent:
    return DaemonEvent(type="session_update", id=event_id, prompt_id="p",
                       data={"sessionId": "s", "update": update})


def test_a_tool_update_changes_only_the_fields_it_carries() -> None:
    store = TranscriptStore()
    store.dispatch(_su({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "Read",
                        "status": "pending", "kind": "read", "rawInput": {"a": 1}}, 1))
    store.dispatch(_su({"sessionUpdate": "tool_call_update", "toolCallId": "t"}, 2))
    (block,) = store.blocks
    assert isinstance(block, ToolBlock)
    assert (block.title, block.status, block.last_event_id) == ("Read", "pending", 2)
    assert block.data == {"kind": "read", "rawInput": {"a": 1}}
    store.dispatch(_su({"sessionUpdate": "tool_call_update", "toolCallId": "t",
                        "status": "completed", "rawOutput": {"b": 2}}, 3))
    (block,) = store.blocks
    assert isinstance(block, ToolBlock)
    assert (block.title, block.status, block.event_id, block.prompt_id) == (
        "Read", "completed", 1, "p")
    assert block.data == {"kind": "read", "rawInput": {"a": 1}, "rawOutput": {"b": 2}}


def test_an_update_for_an_unseen_tool_call_starts_an_untitled_pending_block() -> None:
    store = TranscriptStore()
    store.dispatch(_su({"sessionUpdate": "tool_call_update", "toolCallId": "u"}, 4))
    (block,) = store.blocks
    assert isinstance(block, ToolBlock)
    assert (block.tool_call_id, block.title, block.status, block.data, block.prompt_id) == (
        "u", "", "pending", {}, "p")
