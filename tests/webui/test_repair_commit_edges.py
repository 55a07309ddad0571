"""Repair-commit details pinned down by mutation testing: the
argument bounds, which replayed events of a rebuild may repeat side effects, and the
checkpoint of a second episode found by the rebuild."""

from __future__ import annotations

import pytest

from tests.builders.repair_commit import (
    P2,
    P3,
    commands,
    live_marker,
    mounted_episode,
    p1_turn,
    text,
)
from webui_model import (
    ReplayResult,
    StoreState,
    WorkspaceSignal,
    build_repair,
    replay_snapshot,
    take_checkpoint,
)


def _always(_event: object) -> bool:
    return True


def test_suffix_start_may_be_zero_or_the_end_and_nothing_outside() -> None:
    episode = mounted_episode()
    state, checkpoint = episode.store.snapshot_state(), episode.checkpoint
    events = [commands(50), commands(51)]
    for start in (0, 2):
        build_repair(state, checkpoint, events, start, _always, 10)
    for start in (-1, 3):
        with pytest.raises(ValueError, match=rf"^suffix_start {start} is outside the fresh "
                           r"replay \(0\.\.2\)$"):
            build_repair(state, checkpoint, events, start, _always, 10)


def test_configured_max_blocks_may_be_one_and_not_zero() -> None:
    episode = mounted_episode()
    state, checkpoint = episode.store.snapshot_state(), episode.checkpoint
    assert build_repair(StoreState(), checkpoint, [commands(50)], 0, _always, 1).state.max_blocks == 1
    with pytest.raises(ValueError, match=r"^configured_max_blocks must be >= 1, got 0$"):
        build_repair(state, checkpoint, [], 0, _always, 0)


def test_a_rebuild_repeats_side_effects_from_the_suffix_start_on() -> None:
    episode = mounted_episode()
    # The marker block is not in this store state: the whole fresh replay is rebuilt.
    build = build_repair(StoreState(), episode.checkpoint,
                         [commands(50), commands(51), commands(52)], 1, _always, 100)
    assert build.from_checkpoint is False
    assert [e.event_id for e in build.side_effects if isinstance(e, WorkspaceSignal)] == [51, 52]


def test_a_rebuild_that_meets_another_live_marker_checkpoints_it_with_the_new_paging() -> None:
    episode = mounted_episode()
    fresh = [*p1_turn(), live_marker(P3), text("agent_message_chunk", "tail", id=60, prompt=P3)]
    build = build_repair(StoreState(), episode.checkpoint, fresh, 3, _always, 100)
    assert build.from_checkpoint is False
    assert build.checkpoint is not None
    assert build.checkpoint.prompt_id == P3
    assert build.checkpoint.pagination == build.state.pagination
    assert build.checkpoint.max_blocks == build.state.max_blocks
    assert build.state.has_block(build.checkpoint.marker_block_id)


def test_a_checkpoint_needs_both_the_state_and_the_marker_block() -> None:
    result = replay_snapshot(p1_turn(), [live_marker(P2)], configured_max_blocks=10)
    assert result.marker_state is not None and result.marker_block_id is not None
    checkpoint = take_checkpoint(result)
    assert checkpoint is not None and checkpoint.prompt_id == P2
    assert take_checkpoint(ReplayResult(state=result.state, marker_state=result.marker_state)) is None
    assert take_checkpoint(ReplayResult(state=result.state,
                                        marker_block_id=result.marker_block_id)) is None
    unstamped = ReplayResult(state=result.state, marker_state=result.marker_state,
                             marker_block_id=result.marker_block_id)
    assert (checkpoint := take_checkpoint(unstamped)) is not None and checkpoint.prompt_id is None
