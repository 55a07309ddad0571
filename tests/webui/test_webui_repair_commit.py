"""The pure half of the repair commit and side-effect suppression."""

from __future__ import annotations

import operator
from typing import Any

import pytest

from sdk._repair import find_suffix_start
from sdk.protocol.envelope import DaemonEvent
from tests.builders.repair_commit import (
    P2,
    P3,
    Episode,
    commands,
    echo,
    live_marker,
    mounted_episode,
    p1_turn,
    su,
    terminal,
    text,
    tool,
)
from webui_model import (
    DEFAULT_MAX_BLOCKS,
    HistoryPage,
    MessageBlock,
    StoreState,
    TextBlock,
    ToolBlock,
    TranscriptStore,
    WorkspaceSignal,
    apply_history_page,
    build_repair,
    build_repaired_state,
    make_is_new,
    mirror_page,
    mirror_status,
    replay_snapshot,
    take_checkpoint,
)

FULL_ANSWER = "chunk-0 chunk-1 chunk-2 chunk-3 chunk-4 chunk-5"


def fresh_snapshot(terminal_kind: str = "end_turn") -> tuple[list[DaemonEvent], list[DaemonEvent]]:
    """The memory-replay load after the terminal: the target turn compacted and complete."""
    compacted = [
        *p1_turn(),
        echo("q2", P2, id=20, record="r20"),
        commands(25),  # evicted from the live journal before the client saw it
        commands(38),  # was in the snapshot the client replayed
        text("agent_message_chunk", FULL_ANSWER, id=41, prompt=P2, record="r21"),
        tool("t9", "completed", id=40, prompt=P2, record="r22"),
        su({"sessionUpdate": "current_mode_update", "currentModeId": "auto"}, id=42),  # seen live
        terminal(terminal_kind, P2, 43),
    ]
    live = [commands(44)]  # newer than anything observed
    return compacted, live


def _build(episode: Episode, compacted: list[DaemonEvent], live: list[DaemonEvent], configured: int = 100) -> Any:
    events = [*compacted, *live]
    start = find_suffix_start(events, P2)
    assert start is not None
    return build_repair(
        episode.store.snapshot_state(), episode.checkpoint, events, start,
        make_is_new(episode.observed, episode.watermark, episode.highest_live), configured,
    )


def _is_live_marker(block: Any) -> bool:
    return isinstance(block, MessageBlock) and block.source == "history_truncated" and isinstance(block.data, dict) and block.data.get("scope") == "live_journal"


# --- checkpoint ------------------------------------------------------------------------------


def test_checkpoint_is_the_state_just_before_the_marker() -> None:
    live = [live_marker(P2), text("agent_message_chunk", "tail", prompt=P2)]
    result = replay_snapshot(p1_turn(), live, configured_max_blocks=100)
    checkpoint = take_checkpoint(result)
    assert checkpoint is not None
    assert checkpoint.prompt_id == P2
    assert checkpoint.marker_block_id == "status-1"
    assert result.state.block("status-1") is not None
    assert [b.id for b in checkpoint.state.blocks] == ["user-1", "assistant-1"]
    assert all(a is b for a, b in zip(checkpoint.state.blocks, result.state.blocks, strict=False))
    assert checkpoint.max_blocks == 100
    assert checkpoint.pagination == result.state.pagination


def test_no_checkpoint_without_a_recoverable_live_marker() -> None:
    not_full = live_marker(P2)
    not_full.data["fullTranscriptAvailable"] = False
    assert take_checkpoint(replay_snapshot(p1_turn(), [not_full], configured_max_blocks=10)) is None
    assert take_checkpoint(replay_snapshot(p1_turn(), [], configured_max_blocks=10)) is None


def test_checkpoint_inherits_the_effective_cap_of_an_oversized_replay() -> None:
    compacted = [tool(f"t{i}", "completed") for i in range(6)]
    result = replay_snapshot(compacted, [live_marker(P2)], configured_max_blocks=3)
    checkpoint = take_checkpoint(result)
    assert checkpoint is not None and checkpoint.max_blocks == 7 == result.state.max_blocks


def test_mirroring_is_idempotent_and_shares_blocks() -> None:
    episode = mounted_episode()
    again = mirror_page(episode.checkpoint, episode.history_blocks)
    assert again is episode.checkpoint
    assert mirror_status(episode.checkpoint, episode.status_block) is episode.checkpoint
    blocks = episode.checkpoint.state.blocks
    assert blocks[0] is episode.history_blocks[0] and blocks[-1] is episode.status_block
    assert [b.id for b in blocks] == ["user-2", "assistant-3", "user-1", "assistant-1", "status-2"]


# --- the checkpoint path ----------------------------------------------------------------------


@pytest.mark.parametrize("terminal_kind", ["end_turn", "cancelled", "turn_error"])
def test_repair_from_checkpoint_keeps_prefix_and_replaces_the_tail(terminal_kind: str) -> None:
    episode = mounted_episode(terminal_kind)
    before = episode.store.snapshot_state()
    compacted, live = fresh_snapshot(terminal_kind)
    build = _build(episode, compacted, live)
    assert build.from_checkpoint is True

    calls: list[None] = []
    episode.store.subscribe(lambda: calls.append(None))
    episode.store.reset(build.state)
    assert len(calls) == 1
    blocks = list(episode.store.blocks)

    # History, prefix and the provider status: same objects, same ids, same order.
    kept = [*episode.history_blocks, before.blocks[2], before.blocks[3], episode.status_block]
    assert all(map(operator.is_, blocks[: len(kept)], kept))
    assert [b.id for b in blocks[: len(kept)]] == ["user-2", "assistant-3", "user-1", "assistant-1", "status-2"]
    assert episode.store.pagination == before.pagination
    assert episode.store.pagination.has_more is True
    assert episode.store.pagination.loaded_pages == 1

    tail = blocks[len(kept):]
    assert not any(_is_live_marker(b) for b in blocks)
    answers = [b for b in blocks if isinstance(b, TextBlock) and FULL_ANSWER in b.text]
    assert len(answers) == 1 and answers[0].streaming is False
    assert not any(isinstance(b, TextBlock) and b.text in ("chunk-4", "chunk-4 chunk-5") for b in blocks)
    assert [b.text for b in tail if isinstance(b, TextBlock)] == ["q2", FULL_ANSWER]
    assert [b.status for b in tail if isinstance(b, ToolBlock)] == ["completed"]
    errors = [b for b in tail if b.kind == "error"]
    assert len(errors) == (1 if terminal_kind == "turn_error" else 0)
    statuses = [b for b in blocks if isinstance(b, MessageBlock) and b.text == "Commands are temporarily unavailable."]
    assert statuses == [episode.status_block]


def test_repair_side_effects_fire_only_for_new_events() -> None:
    episode = mounted_episode()
    compacted, live = fresh_snapshot()
    _state, effects = build_repaired_state(
        episode.store.snapshot_state(), episode.checkpoint, [*compacted, *live],
        find_suffix_start([*compacted, *live], P2) or 0,
        make_is_new(episode.observed, episode.watermark, episode.highest_live), 100,
    )
    fired = [e.event_id for e in effects if isinstance(e, WorkspaceSignal)]
    # 25 was evicted unseen (fires once), 38 was observed in the snapshot, 42 arrived live,
    # 44 is newer than anything observed.
    assert fired == [25, 44]
    assert len(effects) == 2


def test_suffix_that_overflows_the_checkpoint_cap_trims_the_oldest_blocks() -> None:
    episode = mounted_episode(configured=7)
    compacted, live = fresh_snapshot()
    build = _build(episode, compacted, live, configured=7)
    assert build.from_checkpoint is True
    assert len(build.state.blocks) == build.state.max_blocks == episode.checkpoint.max_blocks
    assert any(isinstance(b, TextBlock) and b.text == FULL_ANSWER for b in build.state.blocks)
    assert build.state.block("user-2") is None  # the oldest loaded history block went first


def test_fresh_replay_ending_with_another_live_marker_yields_a_new_checkpoint() -> None:
    episode = mounted_episode()
    compacted, _live = fresh_snapshot()
    live = [live_marker(P3), text("agent_message_chunk", "next turn tail", id=60, prompt=P3)]
    build = _build(episode, compacted, live)
    assert build.checkpoint is not None
    assert build.checkpoint.prompt_id == P3
    marker = build.state.block(build.checkpoint.marker_block_id)
    assert _is_live_marker(marker) and marker is not None and marker.prompt_id == P3
    assert not build.checkpoint.state.has_block(build.checkpoint.marker_block_id)
    assert build.checkpoint.pagination == build.state.pagination
    assert build.checkpoint.max_blocks == build.state.max_blocks


# --- the trimmed-marker fallback ---------------------------------------------------------------


def test_trimmed_marker_falls_back_to_a_bounded_rebuild_and_reanchors() -> None:
    configured = 6
    live = [live_marker(P2), text("agent_message_chunk", "chunk-4", id=39, prompt=P2)]
    result = replay_snapshot(p1_turn(), live, configured_max_blocks=configured, pagination_enabled=True, history_has_more=True)
    checkpoint = take_checkpoint(result)
    assert checkpoint is not None
    store = TranscriptStore(max_blocks=configured)
    store.reset(result.state)
    cursor_page = HistoryPage(events=[], has_more=True, next_cursor="opaque-cursor")
    paged = apply_history_page(store.snapshot_state(), cursor_page, configured_max_blocks=configured)
    store.reset(paged.state)
    checkpoint = mirror_page(checkpoint, paged.page_blocks, pagination=paged.state.pagination)
    assert checkpoint.pagination.cursor == "opaque-cursor"
    for i in range(10):  # the live turn pushes the marker out of the store
        store.dispatch(tool(f"live{i}", "completed", id=41 + i, prompt=P2))
    assert store.block(checkpoint.marker_block_id) is None

    compacted = [
        commands(2),  # before the suffix: never new in the fallback, even though unseen
        *p1_turn(),
        echo("q2", P2, id=20, record="r20"),
        *[tool(f"live{i}", "completed", id=41 + i, prompt=P2, record=f"rt{i}") for i in range(10)],
        text("agent_message_chunk", FULL_ANSWER, id=52, prompt=P2, record="r30"),
        terminal("end_turn", P2, 53),
    ]
    fresh = [*compacted, commands(54)]
    start = find_suffix_start(fresh, P2)
    assert start == 4
    build = build_repair(store.snapshot_state(), checkpoint, fresh, start, make_is_new({39}, 40, 53), configured)
    assert build.from_checkpoint is False
    state = build.state
    assert len(state.blocks) <= configured and state.max_blocks == configured
    assert state.pagination.anchor_record_id == "r1"
    assert state.pagination.cursor is None
    assert [e.event_id for e in build.side_effects if isinstance(e, WorkspaceSignal)] == [54]
    assert not any(_is_live_marker(b) for b in state.blocks)
    assert sum(1 for b in state.blocks if isinstance(b, TextBlock) and b.text == FULL_ANSWER) == 1


def test_suffix_start_outside_the_fresh_events_is_an_error() -> None:
    episode = mounted_episode()
    with pytest.raises(ValueError, match="suffix_start"):
        build_repair(episode.store.snapshot_state(), episode.checkpoint, [], 1, lambda _e: True, 10)


# --- scale: structural sharing -----------------------------------------------------------------


def test_repair_on_a_200k_history_with_a_10k_live_journal_shares_blocks() -> None:
    history = [tool(f"h{i}", "completed", id=i + 1) for i in range(200_000)]
    live: list[DaemonEvent] = [live_marker(P2, truncated=5_000)]
    for i in range(10_000):
        if i % 2:
            live.append(tool(f"l{i}", "in_progress", id=300_000 + i, prompt=P2))
        else:
            live.append(text("agent_message_chunk", f" w{i}", id=300_000 + i, prompt=P2))
    result = replay_snapshot(history, live, configured_max_blocks=DEFAULT_MAX_BLOCKS, pagination_enabled=True)
    assert len(result.state.blocks) == 210_001
    assert result.state.max_blocks == 210_001  # the oversized replay is kept whole
    checkpoint = take_checkpoint(result)
    assert checkpoint is not None
    store = TranscriptStore(max_blocks=DEFAULT_MAX_BLOCKS)
    store.reset(result.state)
    store.dispatch(terminal("end_turn", P2, 400_000))
    before: StoreState = store.snapshot_state()

    fresh = [*history, echo("big question", P2, id=250_000), text("agent_message_chunk", FULL_ANSWER, id=399_999, prompt=P2), terminal("end_turn", P2, 400_000)]
    build = build_repair(before, checkpoint, fresh, len(history), make_is_new(set(), 310_000, 400_000), DEFAULT_MAX_BLOCKS)
    assert build.from_checkpoint is True
    store.reset(build.state)

    blocks = store.blocks
    assert len(blocks) == 200_002
    # Every history block is the very object the first replay built: nothing was copied.
    assert all(map(operator.is_, blocks[:200_000], before.blocks[:200_000]))
    assert all(map(operator.is_, blocks[:200_000], checkpoint.state.blocks))
    assert [b.text for b in blocks[200_000:]] == ["big question", FULL_ANSWER]  # type: ignore[union-attr]
