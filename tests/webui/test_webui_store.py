"""The transcript store: trimming with index repair, listeners, reset, snapshots, caps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdk.protocol.envelope import DaemonEvent
from tests.builders.webui_store import P1, update
from webui_model import (
    DEFAULT_MAX_BLOCKS,
    STORE_MAX_BLOCKS,
    PaginationState,
    StoreState,
    TextBlock,
    ToolBlock,
    TranscriptStore,
    replay_snapshot,
)


def tool(call_id: str, status: str = "pending") -> DaemonEvent:
    return update("tool_call", toolCallId=call_id, title=call_id, status=status)


def warning() -> DaemonEvent:
    return DaemonEvent(type="slow_client_warning", data={"queueSize": 1, "maxQueued": 2})


def test_defaults() -> None:
    assert DEFAULT_MAX_BLOCKS == 200_000
    assert STORE_MAX_BLOCKS == 1_000
    store = TranscriptStore()
    assert (store.max_blocks, store.configured_max_blocks) == (1_000, 1_000)
    with pytest.raises(ValueError):
        TranscriptStore(max_blocks=0)


# --- trimming ------------------------------------------------------------------------------------


def test_dispatch_keeps_the_newest_max_blocks_and_forgets_evicted_tools() -> None:
    store = TranscriptStore(max_blocks=3)
    for i in range(5):
        store.dispatch(tool(f"t{i}"))
    assert [b.id for b in store.blocks] == ["tool-3", "tool-4", "tool-5"]
    assert store.tool_block("t0") is None and store.tool_block("t1") is None
    assert store.block("tool-1") is None
    assert store.tool_block("t3") is store.blocks[1]
    # An update for an evicted tool makes a new block instead of touching a dead index entry.
    store.dispatch(update("tool_call_update", toolCallId="t0", status="completed"))
    assert [b.id for b in store.blocks] == ["tool-4", "tool-5", "tool-6"]
    assert store.tool_block("t0") is store.blocks[-1]


def test_active_pointer_to_an_evicted_block_is_cleared() -> None:
    store = TranscriptStore(max_blocks=2)
    store.dispatch(update("agent_message_chunk", text="old"))
    assert store.active_block("assistant") is store.blocks[0]
    store.dispatch(warning())
    store.dispatch(warning())  # evicts the streaming assistant block
    assert [b.kind for b in store.blocks] == ["status", "status"]
    assert store.active_block("assistant") is None
    store.dispatch(update("agent_message_chunk", text="new"))
    last = store.blocks[-1]
    assert isinstance(last, TextBlock) and (last.id, last.text) == ("assistant-2", "new")


def test_evicted_in_flight_tool_is_not_resurrected_by_a_cancel() -> None:
    store = TranscriptStore(max_blocks=2)
    store.dispatch(tool("gone", "in_progress"))
    store.dispatch(tool("kept", "in_progress"))
    store.dispatch(warning())
    store.dispatch(DaemonEvent(type="turn_complete", prompt_id=P1, data={"stopReason": "cancelled", "promptId": P1}))
    assert [b.id for b in store.blocks] == ["tool-2", "status-1"]
    kept = store.blocks[0]
    assert isinstance(kept, ToolBlock) and kept.status == "cancelled"


def test_evicted_permission_is_forgotten() -> None:
    store = TranscriptStore(max_blocks=1)
    store.dispatch(DaemonEvent(type="permission_request", data={"requestId": "r1", "toolCall": {}, "options": []}))
    store.dispatch(warning())
    assert store.permission_block("r1") is None
    store.dispatch(DaemonEvent(type="permission_resolved", data={"requestId": "r1", "outcome": {}}))
    assert [b.kind for b in store.blocks] == ["status"]


# --- listeners ---------------------------------------------------------------------------------


def test_one_notification_per_dispatch_even_when_trimming() -> None:
    store = TranscriptStore(max_blocks=2)
    calls: list[int] = []
    unsubscribe = store.subscribe(lambda: calls.append(len(store.blocks)))
    for i in range(4):
        store.dispatch(tool(f"t{i}"))
    store.dispatch(update("available_commands_update", availableCommands=[]))
    assert calls == [1, 2, 2, 2, 2]
    unsubscribe()
    store.dispatch(tool("after"))
    assert len(calls) == 5


def test_add_status_and_set_pagination_notify_once() -> None:
    store = TranscriptStore()
    calls: list[str] = []
    store.subscribe(lambda: calls.append("x"))
    block = store.add_status("Commands are temporarily unavailable.")
    assert (block.kind, block.source, block.id) == ("status", "provider", "status-1")
    store.set_pagination(PaginationState(enabled=True, has_more=True, anchor_record_id="r"))
    assert calls == ["x", "x"]
    assert store.pagination.anchor_record_id == "r"


# --- reset and snapshots -------------------------------------------------------------------------


def test_reset_is_one_notification_and_shares_block_objects() -> None:
    source = TranscriptStore()
    for i in range(5):
        source.dispatch(tool(f"t{i}"))
    seed = source.snapshot_state()
    assert all(a is b for a, b in zip(seed.blocks, source.blocks, strict=True))

    target = TranscriptStore()
    target.dispatch(tool("other"))
    calls: list[int] = []
    target.subscribe(lambda: calls.append(len(target.blocks)))
    target.reset(seed)
    assert calls == [5]
    assert len(target.blocks) == len(seed.blocks)
    assert all(a is b for a, b in zip(target.blocks, seed.blocks, strict=True))
    assert target.tool_block("t3") is seed.blocks[3]


def test_the_seed_is_not_changed_by_later_dispatches() -> None:
    store = TranscriptStore()
    store.dispatch(update("agent_message_chunk", text="a"))
    seed = store.snapshot_state()
    original = seed.blocks[0]
    store.reset(seed)
    store.dispatch(update("agent_message_chunk", text="b"))
    store.dispatch(tool("t"))
    assert seed.blocks == (original,)
    assert original.text == "a"  # type: ignore[union-attr]
    assert store.blocks[0].text == "ab"  # type: ignore[union-attr]
    # Re-using the seed restores the earlier state, pointers included.
    store.reset(seed)
    store.dispatch(update("agent_message_chunk", text="c"))
    assert [b.text for b in store.blocks] == ["ac"]  # type: ignore[union-attr]


def test_snapshot_is_unaffected_by_trimming() -> None:
    store = TranscriptStore(max_blocks=2)
    store.dispatch(tool("a"))
    store.dispatch(tool("b"))
    snap = store.snapshot_state()
    store.dispatch(tool("c"))
    assert [b.id for b in snap.blocks] == ["tool-1", "tool-2"]
    assert snap.block("tool-1") is snap.blocks[0]
    assert store.block("tool-1") is None


def test_clear_resets_to_an_empty_store_with_the_configured_cap() -> None:
    store = TranscriptStore(max_blocks=4)
    store.reset(StoreState(max_blocks=10))
    assert store.max_blocks == 10
    store.clear()
    assert (len(store.blocks), store.max_blocks) == (0, 4)


# --- effective cap --------------------------------------------------------------------------


def test_oversized_initial_replay_is_kept_whole_with_an_effective_cap() -> None:
    events = [tool(f"t{i}", "completed") for i in range(8)]
    result = replay_snapshot(events, [], configured_max_blocks=5)
    assert result.state.max_blocks == 8
    store = TranscriptStore(max_blocks=5)
    store.reset(result.state)
    assert (len(store.blocks), store.max_blocks, store.configured_max_blocks) == (8, 8, 5)
    store.dispatch(tool("next"))
    assert len(store.blocks) == 8
    assert store.blocks[0].id == "tool-2"


def test_small_replay_uses_the_configured_cap() -> None:
    result = replay_snapshot([tool("a")], [], configured_max_blocks=5)
    assert result.state.max_blocks == 5


# --- invariants under arbitrary event streams ------------------------------------------------

_events = st.one_of(
    st.builds(lambda t, p: update("agent_message_chunk", text=t, prompt=p), st.sampled_from(["a", "", "bc"]), st.sampled_from([P1, "p2", None])),
    st.builds(lambda t, p: update("agent_thought_chunk", text=t, prompt=p), st.sampled_from(["x", "y"]), st.sampled_from([P1, "p2"])),
    st.builds(lambda t, p: update("user_message_chunk", text=t, prompt=p), st.sampled_from(["u", "v"]), st.sampled_from([P1, "p2"])),
    st.builds(lambda c, s: update("tool_call_update", toolCallId=c, status=s), st.sampled_from(["t1", "t2", "t3"]), st.sampled_from(["pending", "in_progress", "completed"])),
    st.builds(lambda r: DaemonEvent(type="turn_complete", prompt_id=P1, data={"stopReason": r, "promptId": P1}), st.sampled_from(["end_turn", "cancelled"])),
    st.builds(lambda r: DaemonEvent(type="permission_request", data={"requestId": r, "toolCall": {}, "options": []}), st.sampled_from(["r1", "r2"])),
    st.builds(lambda r: DaemonEvent(type="permission_resolved", data={"requestId": r, "outcome": {}}), st.sampled_from(["r1", "r2"])),
    st.just(warning()),
)


@given(events=st.lists(_events, max_size=40), cap=st.integers(min_value=1, max_value=6))
def test_store_invariants_hold_for_any_event_stream(events: list[DaemonEvent], cap: int) -> None:
    store = TranscriptStore(max_blocks=cap)
    notifications: list[None] = []
    store.subscribe(lambda: notifications.append(None))
    for event in events:
        store.dispatch(event)
        state = store.snapshot_state()
        assert len(state.blocks) <= cap
        ids = [b.id for b in state.blocks]
        assert len(set(ids)) == len(ids)
        assert dict(state.positions) == {bid: state.base + i for i, bid in enumerate(ids)}
        for pointer in (state.active_user, state.active_assistant, state.active_thought):
            assert pointer is None or pointer in state.positions
        for call_id, bid in state.tools.items():
            found = state.block(bid)
            assert isinstance(found, ToolBlock) and found.tool_call_id == call_id
        assert all(bid in state.positions for bid in state.in_flight_tools)
        assert all(bid in state.positions for bid in state.permissions.values())
        streaming = [b.id for b in state.blocks if isinstance(b, TextBlock) and b.streaming]
        assert set(streaming) <= {state.active_assistant, state.active_thought}
    assert len(notifications) == len(events)
