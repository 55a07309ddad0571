"""Snapshot-replay details pinned down by mutation testing: what a
replay reports besides its state (side effects, the live marker and the state before it), its
defaults, and the exact page-capacity boundary."""

from __future__ import annotations

import pytest

from sdk.protocol.envelope import DaemonEvent
from tests.builders.webui_replay import SID, _paged_state, agent, done, live_marker, user
from webui_model import HistoryPage, apply_history_page, replay_snapshot
from webui_model.effects import WorkspaceSignal
from webui_model.replay import run_events
from webui_model.store import TranscriptDraft


def _commands(event_id: int) -> DaemonEvent:
    return DaemonEvent(type="session_update", id=event_id, data={"sessionId": SID, "update": {
        "sessionUpdate": "available_commands_update", "availableCommands": []}})


def test_replay_reports_the_side_effects_of_the_replayed_events() -> None:
    result = replay_snapshot([_commands(3)], [_commands(9)], configured_max_blocks=10)
    assert [(e.kind, e.event_id) for e in result.side_effects
            if isinstance(e, WorkspaceSignal)] == [
        ("available_commands_update", 3), ("available_commands_update", 9)]


def test_replay_reports_the_live_marker_and_the_state_just_before_it() -> None:
    marker = live_marker()
    compacted = [user("q", "r1", prompt="p1"), agent("a", "r2", prompt="p1"), done("p1")]
    live = [marker, agent("tail", prompt="p-live")]
    result = replay_snapshot(compacted, live, configured_max_blocks=1, pagination_enabled=True)
    assert result.marker_event is marker
    assert result.marker_block_id is not None
    assert result.state.block(result.marker_block_id) is not None
    before = result.marker_state
    assert before is not None
    # The state before the marker: the compacted turn only, with the replay's cap and paging.
    assert [b.id for b in before.blocks] == [b.id for b in result.state.blocks][: len(before.blocks)]
    assert result.marker_block_id not in {b.id for b in before.blocks}
    assert before.max_blocks == result.state.max_blocks == len(result.state.blocks)
    assert before.pagination == result.state.pagination
    assert before.pagination.enabled is True


def test_replay_defaults_to_no_pagination_and_accepts_a_cap_of_one() -> None:
    result = replay_snapshot([user("q", "r1", prompt="p1")], [], configured_max_blocks=1)
    assert result.state.pagination.enabled is False
    assert result.state.pagination.has_more is False
    assert result.marker_event is None and result.marker_state is None
    with pytest.raises(ValueError, match=r"^configured_max_blocks must be >= 1, got 0$"):
        replay_snapshot([], [], configured_max_blocks=0)


def test_replay_passes_the_page_size_on() -> None:
    result = replay_snapshot([], [], configured_max_blocks=5, page_size=7)
    assert result.state.pagination.page_size == 7


def test_run_events_keeps_only_the_effects_the_filter_accepts() -> None:
    events = [_commands(1), _commands(2), _commands(3)]
    seen: list[tuple[int, int | None]] = []

    def keep(index: int, event: DaemonEvent) -> bool:
        seen.append((index, event.id))
        return index != 1

    run = run_events(TranscriptDraft(max_blocks=None), events, keep_effects=keep)
    assert [e.event_id for e in run.side_effects if isinstance(e, WorkspaceSignal)] == [1, 3]
    assert seen == [(0, 1), (1, 2), (2, 3)]


def test_a_page_that_exactly_fills_the_cap_is_accepted() -> None:
    state = _paged_state(configured=5)
    assert (state.max_blocks, len(state.blocks)) == (5, 3)
    page = HistoryPage(events=[user("q8", "r8", prompt="p8"), agent("a8", "r9", prompt="p8")],
                       has_more=True)
    outcome = apply_history_page(state, page, configured_max_blocks=5)
    assert outcome.accepted is True
    assert len(outcome.state.blocks) == 5


def test_a_rejected_page_still_counts_its_already_displayed_events() -> None:
    state = _paged_state(configured=3)
    page = HistoryPage(events=[user("q10", "r10", prompt="p10"), user("q8", "r8", prompt="p8"),
                               user("q7", "r7", prompt="p7")], has_more=True)
    outcome = apply_history_page(state, page, configured_max_blocks=3)
    assert outcome.accepted is False
    assert outcome.dropped_events == 1


def test_every_displayed_event_of_a_page_is_dropped_not_only_the_first() -> None:
    state = _paged_state()
    page = HistoryPage(events=[user("q10", "r10", prompt="p10"), agent("a10", "r11", prompt="p10"),
                               user("q8", "r8", prompt="p8")], has_more=True)
    outcome = apply_history_page(state, page, configured_max_blocks=100)
    assert outcome.dropped_events == 2
    assert [getattr(b, "text", None) for b in outcome.page_blocks] == ["q8"]
