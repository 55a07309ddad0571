"""Snapshot replay, marker hiding and history pagination."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from sdk.protocol.envelope import DaemonEvent
from tests.builders.webui_replay import (
    SID,
    _paged_state,
    agent,
    done,
    live_marker,
    replay_marker,
    user,
)
from webui_model import (
    HISTORY_FAILED_CODE,
    HistoryPage,
    MessageBlock,
    PageError,
    PageRequest,
    PaginationState,
    TextBlock,
    TranscriptStore,
    apply_history_page,
    initial_pagination,
    is_hidden_marker,
    load_more,
    replay_snapshot,
    take_checkpoint,
    visible_blocks,
)
from webui_model.pagination import after_page_error, is_transient_page_error


def texts(blocks: Any) -> list[str]:
    return [b.text for b in blocks]


# --- replay -----------------------------------------------------------------------------------


def test_replay_is_compacted_replay_then_live_journal() -> None:
    compacted = [user("q1", "r1", prompt="p1"), agent("a1", "r2", prompt="p1"), done("p1")]
    live = [agent("partial", prompt="p2")]
    result = replay_snapshot(compacted, live, configured_max_blocks=100)
    assert texts(result.state.blocks) == ["q1", "a1", "partial"]
    last = result.state.blocks[-1]
    assert isinstance(last, TextBlock) and last.streaming is True
    assert result.state.max_blocks == 100


def test_restored_sample_shape_replays_like_the_reference() -> None:
    # Shape of samples/load-restored-mid-turn-both-markers.json (ids, markers, record stamps).
    compacted = [
        replay_marker(recordId="bbb687de"),
        agent("Hello from fake", "cfbea792", id=8),
        agent("", "cfbea792", id=9),
        user("long CHUNKS=100", "82077158", id=10),
        agent(" w0 w1", "88780c27", id=11),
    ]
    live = [live_marker("cbc4f653", recordId="88780c27"), agent(" w33 w34", id=56, prompt="cbc4f653")]
    result = replay_snapshot(compacted, live, configured_max_blocks=1000, pagination_enabled=True)
    state = result.state
    assert [b.kind for b in state.blocks] == ["status", "assistant", "user", "assistant", "status", "assistant"]
    assert state.blocks[1].source_record_ids == ("cfbea792",)
    assert state.pagination.anchor_record_id == "cfbea792"
    assert state.pagination.has_more is True
    checkpoint = take_checkpoint(result)
    assert checkpoint is not None
    assert checkpoint.marker_block_id == "status-2"
    assert [b.id for b in checkpoint.state.blocks] == [b.id for b in state.blocks[:4]]


def test_a_replay_keeps_no_typed_payload_on_its_session_updates() -> None:
    # A snapshot is read once: a typed copy kept on each of 200,000 updates costs more in
    # garbage-collector scans than the decode itself (benchmarks/client.py, replay rows).
    # (Terminals and markers, a few per snapshot, are read through event.payload.)
    tool = DaemonEvent(type="session_update", id=3, data={"sessionId": SID, "update": {
        "sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Read", "status": "pending"}})
    compacted = [user("q1", "r1", prompt="p1"), tool, agent("a1", prompt="p1"), done("p1")]
    live = [live_marker(), agent("partial", prompt="p-live")]
    result = replay_snapshot(compacted, live, configured_max_blocks=100, pagination_enabled=True)
    assert texts(b for b in result.state.blocks if isinstance(b, TextBlock)) == [
        "q1", "a1", "partial"]
    assert result.state.tools.keys() == {"t1"}
    assert result.marker_event is live[0]
    updates = [e for e in [*compacted, *live] if e.type == "session_update"]
    assert len(updates) == 4
    assert [e for e in updates if "_payload" in e.__dict__] == []


# --- marker hiding -----------------------------------------------------------------------------


def test_replay_history_marker_is_hidden_while_older_pages_can_be_loaded() -> None:
    compacted = [replay_marker(recordId="r0"), user("q", "r1", prompt="p1"), done("p1")]
    result = replay_snapshot(compacted, [], configured_max_blocks=100, pagination_enabled=True)
    state = result.state
    marker = state.blocks[0]
    assert state.pagination.has_more
    assert is_hidden_marker(marker, state.pagination)
    assert [b.kind for b in visible_blocks(state.blocks, state.pagination)] == ["user"]


def test_replay_history_marker_is_shown_when_history_cannot_be_paged() -> None:
    compacted = [replay_marker(recordId="r0"), user("q", "r1", prompt="p1")]
    result = replay_snapshot(compacted, [], configured_max_blocks=100, pagination_enabled=False)
    assert not result.state.pagination.has_more
    assert [b.kind for b in visible_blocks(result.state.blocks, result.state.pagination)] == ["status", "user"]


def test_replay_history_marker_without_full_transcript_is_never_hidden() -> None:
    marker = replay_marker(recordId="r0", fullTranscriptAvailable=False)
    result = replay_snapshot(
        [marker], [], configured_max_blocks=10, pagination_enabled=True, history_has_more=True
    )
    assert result.state.pagination.has_more
    assert not is_hidden_marker(result.state.blocks[0], result.state.pagination)


def test_live_marker_is_never_hidden() -> None:
    result = replay_snapshot(
        [], [live_marker(), agent("tail", prompt="p-live")], configured_max_blocks=10,
        pagination_enabled=True, history_has_more=True, history_anchor_record_id="anchor",
    )
    assert result.state.pagination.has_more
    assert [b.kind for b in visible_blocks(result.state.blocks, result.state.pagination)] == ["status", "assistant"]


def test_replay_history_marker_stays_hidden_once_every_page_is_loaded() -> None:
    result = replay_snapshot(
        [replay_marker(recordId="r5"), user("q", "r5", prompt="p")], [],
        configured_max_blocks=100, pagination_enabled=True,
    )
    page = HistoryPage(events=[user("older", "r4", prompt="p0")], has_more=False)
    outcome = apply_history_page(result.state, page, configured_max_blocks=100)
    pagination = outcome.state.pagination
    assert (pagination.has_more, pagination.history_complete) == (False, True)
    assert [b.kind for b in visible_blocks(outcome.state.blocks, pagination)] == ["user", "user"]


# --- anchor and has_more ------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["both", "record", "sources"])
def test_anchor_is_the_first_transcript_record_id(style: str) -> None:
    events = [
        replay_marker(recordId="marker-rec"),
        agent("x", id=3),
        agent("y", "first-rec", meta_style=style),
        agent("z", "second-rec"),
    ]
    pagination = initial_pagination(events, enabled=True, history_anchor_record_id="load-anchor")
    assert pagination.anchor_record_id == "first-rec"


def test_anchor_falls_back_to_the_marker_record_id_then_the_load_anchor() -> None:
    with_marker = [replay_marker(recordId="marker-rec"), agent("x")]
    assert initial_pagination(with_marker, enabled=True, history_anchor_record_id="load").anchor_record_id == "marker-rec"
    without = [replay_marker(), agent("x")]
    assert initial_pagination(without, enabled=True, history_anchor_record_id="load").anchor_record_id == "load"
    assert initial_pagination([agent("x")], enabled=True).anchor_record_id is None


@pytest.mark.parametrize(
    ("enabled", "history_has_more", "events", "anchor", "expected"),
    [
        (True, True, [agent("x")], "a", True),  # historyHasMore
        (True, False, [replay_marker()], "a", True),  # a replayed full marker
        (True, False, [live_marker()], "a", True),  # ... of either scope
        (True, False, [agent("x")], "a", False),  # neither
        (True, False, [replay_marker(fullTranscriptAvailable=False)], "a", False),
        (False, True, [replay_marker()], "a", False),  # no capability
        (True, True, [replay_marker()], None, False),  # no anchor
    ],
)
def test_has_more_rules(
    enabled: bool, history_has_more: bool, events: list[DaemonEvent], anchor: str | None, expected: bool
) -> None:
    pagination = initial_pagination(
        events, enabled=enabled, history_has_more=history_has_more, history_anchor_record_id=anchor
    )
    assert pagination.has_more is expected


def test_load_more_asks_for_the_page_before_the_anchor_or_at_the_cursor() -> None:
    pagination = PaginationState(enabled=True, anchor_record_id="r9", has_more=True, page_size=25)
    assert load_more(pagination)[1] == PageRequest(limit=25, before_record_id="r9")
    with_cursor = msgspec.structs.replace(pagination, cursor="opaque")
    assert load_more(with_cursor)[1] == PageRequest(limit=25, cursor="opaque")
    assert load_more(msgspec.structs.replace(pagination, has_more=False))[1] is None
    assert initial_pagination([], enabled=True).page_size == 100


# --- pages ---------------------------------------------------------------------------------------


def test_page_is_prepended_with_one_reset_keeping_existing_blocks() -> None:
    state = _paged_state()
    store = TranscriptStore(max_blocks=100)
    store.reset(state)
    before = list(store.blocks)
    calls: list[None] = []
    store.subscribe(lambda: calls.append(None))
    page = HistoryPage(
        events=[user("q8", "r8", prompt="p8"), agent("a8", "r9", prompt="p8"), done("p8")],
        has_more=True,
    )
    outcome = apply_history_page(store.snapshot_state(), page, configured_max_blocks=100)
    store.reset(outcome.state)
    assert len(calls) == 1
    assert texts(outcome.page_blocks) == ["q8", "a8"]
    assert list(store.blocks[:2]) == list(outcome.page_blocks)
    assert all(a is b for a, b in zip(store.blocks[2:], before, strict=True))
    ids = [b.id for b in store.blocks]
    assert len(set(ids)) == len(ids)
    assert store.pagination.anchor_record_id == "r8"
    assert store.pagination.cursor is None
    assert (store.pagination.has_more, store.pagination.loaded_pages) == (True, 1)


def test_page_events_already_displayed_are_dropped() -> None:
    state = _paged_state()
    page = HistoryPage(
        events=[user("q9", "r9", prompt="p9"), user("q10", "r10", prompt="p10"), agent("a10", "r11", prompt="p10")],
        has_more=True,
    )
    outcome = apply_history_page(state, page, configured_max_blocks=100)
    assert outcome.dropped_events == 2
    assert texts(outcome.page_blocks) == ["q9"]
    assert [t for t in texts(outcome.state.blocks[:1])] == ["q9"]
    assert sum(1 for b in outcome.state.blocks if getattr(b, "text", None) == "q10") == 1


def test_page_without_record_ids_continues_at_next_cursor() -> None:
    state = _paged_state()
    page = HistoryPage(events=[agent("raw")], has_more=True, next_cursor="c2")
    pagination = apply_history_page(state, page, configured_max_blocks=100).state.pagination
    assert (pagination.cursor, pagination.anchor_record_id, pagination.has_more) == ("c2", "r10", True)
    assert load_more(pagination)[1] == PageRequest(limit=100, cursor="c2")


def test_has_more_after_a_page_needs_room_below_the_configured_cap() -> None:
    state = _paged_state(configured=100)
    assert len(state.blocks) == 3
    page = HistoryPage(events=[user("q9", "r9", prompt="p9")], has_more=True)
    # 4 blocks after the page: room left under 5, none left under 4.
    assert apply_history_page(state, page, configured_max_blocks=5).state.pagination.has_more is True
    assert apply_history_page(state, page, configured_max_blocks=4).state.pagination.has_more is False
    assert apply_history_page(state, HistoryPage(events=page.events, has_more=False), configured_max_blocks=100).state.pagination.has_more is False


def test_page_exceeding_max_blocks_is_rejected_atomically() -> None:
    state = _paged_state(configured=4)
    assert state.max_blocks == 4 and len(state.blocks) == 3
    page = HistoryPage(
        events=[user("q8", "r8", prompt="p8"), agent("a8", "r9", prompt="p8")], has_more=True
    )
    outcome = apply_history_page(state, page, configured_max_blocks=4)
    assert outcome.accepted is False
    assert outcome.page_blocks == ()
    assert outcome.state.blocks is state.blocks
    assert outcome.state.pagination.has_more is False
    assert outcome.state.pagination.capacity_reached is True
    assert outcome.state.pagination.anchor_record_id == state.pagination.anchor_record_id
    assert load_more(outcome.state.pagination)[1] is None


# --- page errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [None, 500, 503, 408, 429])
def test_transient_page_errors_keep_has_more_and_add_a_notice(status: int | None) -> None:
    pagination = PaginationState(enabled=True, anchor_record_id="r", has_more=True)
    error = PageError(message="connection reset", status=status)
    assert is_transient_page_error(error)
    after, notice = after_page_error(pagination, error)
    assert after == pagination
    assert notice is not None and (notice.id, notice.code) == (HISTORY_FAILED_CODE, "daemon.transcript_history.failed")
    assert notice.debug_message == "connection reset"
    assert load_more(after)[1] is not None


@pytest.mark.parametrize("status", [400, 401, 404])
def test_other_page_errors_latch_until_a_forced_load(status: int) -> None:
    pagination = PaginationState(enabled=True, anchor_record_id="r", has_more=True)
    latched, notice = after_page_error(pagination, PageError(message="invalid_transcript_cursor", status=status))
    assert notice is None
    assert latched.pagination_error == "invalid_transcript_cursor"
    assert load_more(latched) == (latched, None)
    cleared, request = load_more(latched, force=True)
    assert cleared.pagination_error is None
    assert request == PageRequest(limit=100, before_record_id="r")


def test_replay_marker_block_keeps_its_payload() -> None:
    marker = replay_marker(recordId="r0", truncatedTurns=1)
    result = replay_snapshot([marker], [], configured_max_blocks=10)
    block = result.state.blocks[0]
    assert isinstance(block, MessageBlock) and block.data == marker.data
    assert block.text.startswith("History truncated in replay history: kept the latest 5 events")
