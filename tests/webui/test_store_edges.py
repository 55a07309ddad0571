"""Transcript-store details pinned down by mutation testing: the version
counter, the active pointers by kind, local status blocks, permission lookup."""

from __future__ import annotations

import msgspec
import pytest

from sdk.protocol.envelope import DaemonEvent
from tests.builders.webui_store import update
from webui_model import MessageBlock, PaginationState, StoreState, ToolBlock, TranscriptStore
from webui_model.blocks import Block, PermissionBlock
from webui_model.draft import TranscriptDraft, append_block, bump_counters, prepend_blocks


def test_version_counts_notifications_from_zero() -> None:
    store = TranscriptStore()
    assert store.version == 0
    store.dispatch(update("agent_message_chunk", text="a"))
    store.add_status("s")
    store.set_pagination(PaginationState())
    store.reset(StoreState())
    assert store.version == 4


def test_max_blocks_error_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"^max_blocks must be >= 1, got 0$"):
        TranscriptStore(max_blocks=0)


def test_active_block_by_kind() -> None:
    store = TranscriptStore()
    store.dispatch(update("user_message_chunk", text="question"))
    assert store.active_block("user") is store.blocks[0]
    assert store.active_block("assistant") is None
    store.dispatch(update("agent_thought_chunk", text="hmm"))
    assert store.active_block("thought") is store.blocks[-1]
    store.dispatch(update("agent_message_chunk", text="answer"))
    assert store.active_block("assistant") is store.blocks[-1]
    with pytest.raises(ValueError, match=r"^no active pointer for block kind 'tool'$"):
        store.active_block("tool")


def test_add_status_keeps_text_code_source_and_data() -> None:
    store = TranscriptStore()
    block = store.add_status("Load failed.", source="loader", code="e.code", data={"k": 1})
    assert block == MessageBlock(id="status-1", kind="status", text="Load failed.",
                                 code="e.code", source="loader", data={"k": 1})
    assert store.blocks[-1] is block
    assert store.block("status-1") is block
    assert store.block("status-2") is None


def test_permission_block_is_found_by_request_id() -> None:
    store = TranscriptStore()
    store.dispatch(DaemonEvent(type="permission_request", id=4, data={
        "requestId": "r1", "sessionId": "s", "toolCall": {"toolCallId": "t1"},
        "options": [{"optionId": "allow_once", "name": "Allow", "kind": "allow_once"}]}))
    block = store.permission_block("r1")
    assert block is not None and block is store.blocks[-1]
    assert store.permission_block("r2") is None


# --- the state value and the draft (webui_model.draft) -----------------------------------------


def _msg(block_id: str, text: str = "") -> MessageBlock:
    return MessageBlock(id=block_id, kind="status", text=text)


def _tool(block_id: str, call_id: str) -> ToolBlock:
    return ToolBlock(id=block_id, tool_call_id=call_id, title=call_id, status="completed")


def test_prepending_puts_older_blocks_in_front_and_indexes_them() -> None:
    state = append_block(StoreState(), _tool("tool-5", "t"))
    state = msgspec.structs.replace(state, tools={"t": "tool-5"})
    older: list[Block] = [_msg("status-7", "old"), _tool("tool-2", "t"), _tool("tool-3", "u"),
             PermissionBlock(id="permission-4", request_id="r", tool_call={}, options=())]
    paged = PaginationState(enabled=True, loaded_pages=1)
    after = prepend_blocks(state, older, pagination=paged)
    assert [b.id for b in after.blocks] == [
        "status-7", "tool-2", "tool-3", "permission-4", "tool-5"]
    assert after.base == state.base - 4
    for block in after.blocks:
        assert after.block(block.id) is block and after.has_block(block.id)
    # Newer index entries win; the prepended ones fill only what is missing.
    assert after.tools == {"t": "tool-5", "u": "tool-3"}
    assert after.permissions == {"r": "permission-4"}
    assert after.counters == {"tool": 5, "status": 7, "permission": 4}
    assert after.pagination is paged
    assert prepend_blocks(state, []).pagination is state.pagination
    assert not state.has_block("tool-2") and state.block("tool-2") is None
    with pytest.raises(ValueError, match=r"^prepended block id 'tool-5' is already stored$"):
        prepend_blocks(after, [_tool("tool-5", "x")])


def test_appending_to_a_state_bumps_the_counters() -> None:
    state = append_block(StoreState(counters={"status": 2}), _msg("status-9"))
    assert state.counters == {"status": 9}
    state = append_block(state, _msg("status-3"))
    assert state.counters == {"status": 9}
    assert [b.id for b in state.blocks] == ["status-9", "status-3"]
    assert bump_counters({"tool": 4}, [_tool("tool-4", "x")]) == {"tool": 4}
    assert bump_counters({}, [_tool("tool-1", "x")]) == {"tool": 1}


def test_a_draft_round_trips_every_field_of_a_state() -> None:
    blocks = (_tool("tool-1", "t"), _msg("status-2"))
    state = StoreState(
        blocks=blocks, base=3, positions={"tool-1": 3, "status-2": 4}, tools={"t": "tool-1"},
        permissions={"r": "x"}, in_flight_tools={"tool-1": None}, active_user="u",
        active_assistant="a", active_thought="th", counters={"tool": 1, "status": 2},
        open_prompt_id="p", max_blocks=7, pagination=PaginationState(enabled=True))
    draft = TranscriptDraft.from_state(state)
    assert draft.max_blocks == 7 and len(draft) == 2
    assert draft.to_state() == state
    assert TranscriptDraft.from_state(state, max_blocks=9).to_state().max_blocks == 9
    assert draft.to_state(max_blocks=8).max_blocks == 8
    assert draft.get("status-2") is blocks[1] and draft.get(None) is None
    assert draft.new_id("status") == "status-3"
    assert TranscriptDraft(max_blocks=None, counters={"tool": 4}).new_id("tool") == "tool-5"


def test_draft_refusals() -> None:
    with pytest.raises(ValueError, match=r"^max_blocks must be >= 1, got 0$"):
        TranscriptDraft(max_blocks=0)
    TranscriptDraft(max_blocks=1)
    with pytest.raises(ValueError, match="explicit max_blocks"):
        TranscriptDraft(max_blocks=None).to_state()
    draft = TranscriptDraft(max_blocks=3)
    draft.append(_msg("status-1"))
    with pytest.raises(ValueError, match=r"^duplicate block id 'status-1'$"):
        draft.append(_msg("status-1"))
    with pytest.raises(KeyError, match="no stored block 'status-2' to replace"):
        draft.replace(_msg("status-2"))
    draft.replace(_msg("status-1", "new"))
    assert draft.get("status-1") == _msg("status-1", "new")


def test_trimming_forgets_every_pointer_to_an_evicted_block() -> None:
    draft = TranscriptDraft(max_blocks=2)
    for block in (_tool("tool-1", "t"), PermissionBlock(id="permission-2", request_id="r",
                                                       tool_call={}, options=()),
                  _msg("status-3"), _msg("status-4")):
        draft.append(block)
    draft.tools["t"] = "tool-1"
    draft.permissions["r"] = "permission-2"
    draft.in_flight_tools["tool-1"] = None
    draft.active_user = "tool-1"
    draft.active_assistant = "permission-2"
    draft.active_thought = "status-4"
    assert [b.id for b in draft.trim()] == ["tool-1", "permission-2"]
    assert [b.id for b in draft.blocks] == ["status-3", "status-4"] and draft.base == 2
    assert (draft.tools, draft.permissions, draft.in_flight_tools) == ({}, {}, {})
    pointers: tuple[str | None, ...] = (
        draft.active_user, draft.active_assistant, draft.active_thought)
    assert pointers == (None, None, "status-4")
    assert draft.trim() == []
    assert draft.get("status-3") is draft.blocks[0]
