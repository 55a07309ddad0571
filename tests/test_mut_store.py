"""Transcript-store details pinned down by mutation testing (CLIENT-SPEC §4.1): the version
counter, the active pointers by kind, local status blocks, permission lookup."""

from __future__ import annotations

import pytest

from sdk.events import DaemonEvent
from tests.test_webui_store import update
from webui_model import MessageBlock, PaginationState, StoreState, TranscriptStore


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
