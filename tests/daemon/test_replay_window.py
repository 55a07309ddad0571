"""ReplayWindow."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.replay_window import DEFAULT_MAX_BYTES, Record, ReplayWindow, SpilledTurn
from tests.builders.replay_window import size, turn


def decode(snapshot: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(b) for b in snapshot]


def test_defaults_and_invalid_cap() -> None:
    assert DEFAULT_MAX_BYTES == 4 * 1024 * 1024
    assert ReplayWindow().max_bytes == DEFAULT_MAX_BYTES
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_bytes"):
            ReplayWindow(bad)  # type: ignore[arg-type]


def test_empty_segment_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one event"):
        ReplayWindow().add_segment([])


def test_within_cap_keeps_everything_and_snapshot_reuses_raw_bytes() -> None:
    window = ReplayWindow()
    t1, t2 = turn(3, "a"), turn(2, "b")
    window.add_segment(t1)
    window.add_segment(t2)
    assert window.segment_count == 2
    assert window.event_count == 5
    assert window.total_bytes == size(t1) + size(t2)
    assert window.truncated_events == 0 and window.truncated_turns == 0
    snap = window.snapshot(full_transcript_available=True)
    assert snap == [r.event.raw for r in t1 + t2]
    assert all(a is r.event.raw for a, r in zip(snap, t1 + t2, strict=True))
    assert window.records() == t1 + t2


def test_oldest_segments_dropped_past_cap_with_marker() -> None:
    t1, t2, t3 = turn(4, "a", pad=50), turn(2, "b", pad=50), turn(3, "c", pad=50)
    cap = size(t2) + size(t3)
    window = ReplayWindow(cap)
    window.add_segment(t1)
    window.add_segment(t2)
    assert window.segment_count == 1  # t1 + t2 > cap: t1 dropped
    window.add_segment(t3)
    assert window.segment_count == 2  # exactly at the cap: nothing more dropped
    assert window.total_bytes == cap
    assert (window.truncated_events, window.truncated_turns) == (4, 1)
    assert window.oldest_record_id == "b-rec-0"
    snap = decode(window.snapshot(full_transcript_available=True))
    assert snap[0] == {
        "v": 1,
        "type": "history_truncated",
        "data": {
            "reason": "replay_window_exceeded",
            "truncatedEvents": 4,
            "retainedEvents": 5,
            "maxBytes": cap,
            "truncatedTurns": 1,
            "recordId": "b-rec-0",
            "fullTranscriptAvailable": True,
        },
    }
    assert list(snap[0]["data"]) == [
        "reason", "truncatedEvents", "retainedEvents", "maxBytes", "truncatedTurns", "recordId",
        "fullTranscriptAvailable",
    ]
    assert [e["id"] for e in snap[1:]] == [r.event.id for r in t2 + t3]


def test_marker_has_no_scope_prompt_or_meta_and_reports_transcript_flag() -> None:
    window = ReplayWindow(1)
    window.add_segment(turn(2, "a"))
    window.add_segment(turn(2, "b"))
    marker = decode(window.snapshot(full_transcript_available=False))[0]
    assert set(marker) == {"v", "type", "data"}
    assert "scope" not in marker["data"]
    assert marker["data"]["fullTranscriptAvailable"] is False


def test_newest_segment_survives_even_when_alone_over_cap() -> None:
    window = ReplayWindow(10)
    big = turn(3, "big", pad=100)
    window.add_segment(turn(2, "a"))
    window.add_segment(big)
    assert window.segment_count == 1
    assert window.total_bytes == size(big) > 10
    snap = window.snapshot(full_transcript_available=True)
    assert snap[1:] == [r.event.raw for r in big]
    assert json.loads(snap[0])["data"]["retainedEvents"] == 3


def test_several_segments_dropped_in_one_add() -> None:
    small = [turn(2, f"s{i}") for i in range(4)]
    big = turn(2, "big", pad=400)
    window = ReplayWindow(size(big) + size(small[3]) - 1)
    for seg in small:
        window.add_segment(seg)
    window.add_segment(big)
    assert window.segment_count == 1
    assert (window.truncated_events, window.truncated_turns) == (8, 4)


def test_anchor_skips_records_without_id_and_is_omitted_when_unknown() -> None:
    window = ReplayWindow(1)
    window.add_segment(turn(2, "a"))
    window.add_segment(turn(2, "b", record_ids=False))
    assert window.oldest_record_id is None
    assert "recordId" not in decode(window.snapshot(full_transcript_available=True))[0]["data"]

    mixed = turn(3, "c")
    mixed[0] = Record(mixed[0].event, None)
    window.add_segment(mixed)
    assert window.oldest_record_id == "c-rec-1"


def test_seed_replaces_content_and_reports_left_out_records() -> None:
    window = ReplayWindow()
    window.add_segment(turn(2, "old"))
    seg1, seg2 = turn(2, "r1"), turn(3, "r2")
    window.seed([seg1, seg2], truncated_events=7, truncated_turns=2)
    assert window.segment_count == 2 and window.event_count == 5
    assert window.total_bytes == size(seg1) + size(seg2)
    marker, *rest = decode(window.snapshot(full_transcript_available=True))
    assert marker["data"] == {
        "reason": "replay_window_exceeded",
        "truncatedEvents": 7,
        "retainedEvents": 5,
        "maxBytes": DEFAULT_MAX_BYTES,
        "truncatedTurns": 2,
        "recordId": "r1-rec-0",
        "fullTranscriptAvailable": True,
    }
    assert [e["id"] for e in rest] == [r.event.id for r in seg1 + seg2]


def test_seed_without_truncation_has_no_marker_and_then_behaves_normally() -> None:
    seg = turn(2, "r")
    window = ReplayWindow(size(seg) + 1)
    window.seed([seg], truncated_events=0, truncated_turns=0)
    assert window.snapshot(full_transcript_available=True) == [r.event.raw for r in seg]
    window.add_segment(turn(2, "next"))
    assert (window.truncated_events, window.truncated_turns) == (2, 1)


def test_seed_over_cap_evicts_and_counts_on_top() -> None:
    segs = [turn(2, f"r{i}", pad=100) for i in range(3)]
    window = ReplayWindow(size(segs[2]))
    window.seed(segs, truncated_events=5, truncated_turns=1)
    assert window.segment_count == 1
    assert (window.truncated_events, window.truncated_turns) == (9, 3)
    assert window.oldest_record_id == "r2-rec-0"


def test_seed_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="truncation counts"):
        ReplayWindow().seed([], truncated_events=-1, truncated_turns=0)


def test_marker_without_truncated_turns_omits_the_field() -> None:
    window = ReplayWindow()
    window.seed([turn(2, "r")], truncated_events=3, truncated_turns=0)
    data = decode(window.snapshot(full_transcript_available=True))[0]["data"]
    assert "truncatedTurns" not in data
    assert data["truncatedEvents"] == 3


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(0, 60)), min_size=1, max_size=25),
    st.integers(1, 3000),
)
def test_property_window_accounting(turns: list[tuple[int, int]], cap: int) -> None:
    window = ReplayWindow(cap)
    segments = [turn(n, f"t{i}", pad=pad) for i, (n, pad) in enumerate(turns)]
    for seg in segments:
        window.add_segment(seg)
    kept = segments[len(segments) - window.segment_count :]
    assert window.segment_count >= 1
    assert window.total_bytes == sum(size(s) for s in kept)
    assert window.total_bytes <= cap or window.segment_count == 1
    dropped = segments[: len(segments) - window.segment_count]
    assert window.truncated_turns == len(dropped)
    assert window.truncated_events == sum(len(s) for s in dropped)
    # Minimal eviction: the newest dropped segment would not have fit.
    if dropped:
        assert size(dropped[-1]) + window.total_bytes > cap
    snap = window.snapshot(full_transcript_available=True)
    body = snap[1:] if dropped else snap
    assert body == [r.event.raw for s in kept for r in s]
    if dropped:
        assert json.loads(snap[0])["data"]["retainedEvents"] == len(body)


# -- spilled segments: over-cap turns served from the transcript ------------------------------


def resolve(snapshot: list[bytes | SpilledTurn], stored: dict[str, bytes]) -> list[bytes]:
    """What the bus does at load: spilled turns replaced by their stored records."""
    out: list[bytes] = []
    for item in snapshot:
        if isinstance(item, SpilledTurn):
            out.extend(stored[rid] for rid in item.record_ids)
        else:
            out.append(item)
    return out


def test_over_cap_turn_spills_to_ids_and_sizes_only() -> None:
    window = ReplayWindow(100)
    big = turn(4, "big", pad=80)
    handle = window.add_segment(big)
    assert window.spillable(handle)
    assert window.spill(handle)
    assert not window.spill(handle)  # once
    # The wire-level accounting is unchanged ...
    assert window.total_bytes == size(big) and window.event_count == 4
    assert window.marker(full_transcript_available=True) is None
    assert window.oldest_record_id == "big-rec-0"
    # ... but nothing of the events is held any more.
    assert window.held_bytes == 0 and window.spilled_segments == 1
    assert window.records() == []
    snap = window.snapshot(full_transcript_available=True)
    assert snap == [SpilledTurn(tuple(r.record_id or "" for r in big), size(big))]
    stored = {r.record_id or "": r.event.raw for r in big}
    assert resolve(snap, stored) == [r.event.raw for r in big]


def test_only_over_cap_turns_with_record_ids_can_spill() -> None:
    window = ReplayWindow(10_000)
    small = window.add_segment(turn(3, "s"))
    assert not window.spillable(small) and not window.spill(small)
    assert window.held_bytes == window.total_bytes
    window = ReplayWindow(10)
    no_ids = window.add_segment(turn(3, "n", record_ids=False))
    assert not window.spillable(no_ids)  # the transcript could not give it back
    window = ReplayWindow(10)
    old = window.add_segment(turn(2, "o", pad=40))
    window.add_segment(turn(2, "p", pad=40))  # evicts the first
    assert not window.spill(old)


def test_spilled_turn_is_evicted_and_counted_like_any_other() -> None:
    window = ReplayWindow(100)
    big = turn(5, "big", pad=80)
    window.spill(window.add_segment(big))
    nxt = turn(2, "next")
    window.add_segment(nxt)
    assert (window.truncated_events, window.truncated_turns) == (5, 1)
    assert window.spilled_segments == 0 and window.event_count == 2
    snap = decode(window.snapshot(full_transcript_available=True))  # type: ignore[arg-type]
    assert snap[0]["data"]["truncatedEvents"] == 5
    assert snap[0]["data"]["recordId"] == "next-rec-0"


def test_lost_spilled_turn_is_reported_as_dropped() -> None:
    window = ReplayWindow(100)
    window.add_segment(turn(2, "old"))
    big = turn(4, "big", pad=80)
    handle = window.add_segment(big)  # evicts "old"
    window.spill(handle)
    spilled = [item for item in window.snapshot(full_transcript_available=True)
               if isinstance(item, SpilledTurn)]
    snap = window.snapshot(full_transcript_available=False, lost=spilled)
    assert len(snap) == 1 and isinstance(snap[0], bytes)
    data = json.loads(snap[0])["data"]
    assert data["truncatedEvents"] == 2 + 4 and data["truncatedTurns"] == 2
    assert data["retainedEvents"] == 0 and data["fullTranscriptAvailable"] is False
    assert "recordId" not in data


def test_seeded_over_cap_turn_can_spill() -> None:
    window = ReplayWindow(50)
    window.seed([turn(2, "a"), turn(3, "b", pad=60)], truncated_events=0, truncated_turns=0)
    newest = window.newest_handle()
    assert newest is not None and window.spill(newest)
    assert window.held_bytes == 0 and window.truncated_turns == 1


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(0, 200)), min_size=1, max_size=20),
    st.integers(1, 1500),
)
def test_property_spilling_never_changes_what_load_returns(
    turns: list[tuple[int, int]], cap: int,
) -> None:
    """Two windows fed the same turns, one spilling whatever it may: the resolved snapshots
    are identical after every turn, and the spilling one holds at most ``cap`` bytes."""
    plain, spilling = ReplayWindow(cap), ReplayWindow(cap)
    stored: dict[str, bytes] = {}
    for i, (n, pad) in enumerate(turns):
        seg = turn(n, f"t{i}", pad=pad)
        stored.update({r.record_id or "": r.event.raw for r in seg})
        plain.add_segment(seg)
        handle = spilling.add_segment(seg)
        if spilling.spillable(handle):
            assert size(seg) > cap
            spilling.spill(handle)
        for flag in (True, False):
            assert resolve(spilling.snapshot(full_transcript_available=flag), stored) == \
                plain.snapshot(full_transcript_available=flag)
        assert spilling.held_bytes <= cap
        assert (spilling.total_bytes, spilling.event_count, spilling.truncated_events) == (
            plain.total_bytes, plain.event_count, plain.truncated_events)
