"""Replay-window details pinned down by mutation testing: the marker's every
field, the spill threshold being strictly over the cap, the empty window, refusal texts."""

from __future__ import annotations

import msgspec
import pytest

from daemon.core.replay_window import ReplayWindow
from tests.builders.replay_window import size, turn


def test_marker_reports_counts_cap_anchor_and_transcript_flag() -> None:
    window = ReplayWindow(400)
    window.add_segment(turn(3, "a", pad=30))
    window.add_segment(turn(2, "b", pad=30))
    window.add_segment(turn(2, "c", pad=30))
    assert window.truncated_turns >= 1
    for full in (True, False):
        assert msgspec.to_builtins(window.marker(full_transcript_available=full)) == {
            "reason": "replay_window_exceeded",
            "truncatedEvents": window.truncated_events,
            "retainedEvents": window.event_count,
            "maxBytes": 400,
            "truncatedTurns": window.truncated_turns,
            "recordId": window.oldest_record_id,
            "fullTranscriptAvailable": full,
        }
    assert window.oldest_record_id is not None


def test_a_turn_exactly_at_the_cap_is_not_spillable() -> None:
    records = turn(3, "x", pad=20)
    window = ReplayWindow(size(records))
    handle = window.add_segment(records)
    assert window.total_bytes == window.max_bytes
    assert not window.spillable(handle)
    over = ReplayWindow(size(records) - 1)
    assert over.spillable(over.add_segment(turn(3, "x", pad=20)))


def test_an_empty_window_has_no_newest_segment() -> None:
    window = ReplayWindow()
    assert window.newest_handle() is None
    window.add_segment(turn(1, "t"))
    assert window.newest_handle() is not None


def test_refusals_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"^a replay window segment needs at least one event "
                       r"\(its terminal\)$"):
        ReplayWindow().add_segment([])
    with pytest.raises(ValueError, match=r"^seeded truncation counts must be >= 0, got "
                       r"truncated_events=-1, truncated_turns=0$"):
        ReplayWindow().seed([], truncated_events=-1, truncated_turns=0)
