"""EventRing and decide_resume."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.envelope import Event
from daemon.core.ring import (
    DEFAULT_RING_BYTES,
    DEFAULT_RING_SIZE,
    REPLAY_BUDGET_BYTES,
    EventRing,
    ResumePlan,
    decide_resume,
)
from daemon.core.subscriber import Eviction, SubscriberState
from tests.builders.ring import EPOCH, NOW, ev, filled


def env(event: Event) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(event.raw)
    return decoded


def synth(plan_part: list[Event]) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, env(e)["data"]) for e in plan_part]


def ids(events: list[Event]) -> list[int | None]:
    return [e.id for e in events]


def complete(last: int | None, count: int) -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {}
    if last is not None:
        data = {"lastReplayedEventId": last, "lastEventId": last}
    data["replayedCount"] = count
    return ("replay_complete", data)


# -- EventRing ---------------------------------------------------------------------------------


def test_ring_defaults_and_validation() -> None:
    assert DEFAULT_RING_SIZE == 8000
    assert REPLAY_BUDGET_BYTES == 8 * 1024 * 1024
    ring = EventRing()
    assert (ring.capacity, ring.next_id, ring.first_id, ring.last_id, len(ring)) == (
        8000, 1, None, 0, 0
    )
    for bad in (0, -3, True):
        with pytest.raises(ValueError, match="capacity"):
            EventRing(bad)
    with pytest.raises(ValueError, match="next_id"):
        EventRing(5, next_id=0)


def test_ring_rejects_out_of_order_ids() -> None:
    ring = filled(3)
    with pytest.raises(ValueError, match="expects id 4"):
        ring.append(ev(5))
    with pytest.raises(ValueError, match="expects id 4"):
        ring.append(ev(3))
    assert ring.next_id == 4 and len(ring) == 3


def test_ring_drops_head_past_capacity() -> None:
    ring = filled(12, capacity=5)
    assert (ring.first_id, ring.last_id, ring.next_id, len(ring)) == (8, 12, 13, 5)
    assert ids(ring.since(0)) == [8, 9, 10, 11, 12]
    assert ids(ring.since(9)) == [10, 11, 12]
    assert ring.since(12) == [] and ring.since(99) == []
    assert ring.get(7) is None and ring.get(13) is None
    got = ring.get(10)
    assert got is not None and got.id == 10


def test_ring_starting_after_seeded_ids() -> None:
    ring = filled(2, capacity=4, start=13)
    assert (ring.first_id, ring.last_id) == (13, 14)
    assert ids(ring.since(0)) == [13, 14]


def test_bytes_since_matches_held_sizes() -> None:
    pads = [i * 7 % 23 for i in range(17)]
    ring = filled(17, capacity=6, pads=pads)
    held = ring.since(0)
    assert ring.total_bytes == sum(e.size for e in held)
    for after in range(0, 20):
        assert ring.bytes_since(after) == sum(e.size for e in held if e.id is not None
                                              and e.id > after)


@given(st.integers(1, 12), st.lists(st.integers(0, 40), max_size=40), st.integers(-1, 45))
def test_property_bytes_since_and_since(capacity: int, pads: list[int], after: int) -> None:
    ring = filled(len(pads), capacity=capacity, pads=pads)
    all_events = [ev(i + 1, pad) for i, pad in enumerate(pads)]
    held = all_events[max(0, len(pads) - capacity):]
    expected = [e for e in held if e.id is not None and e.id > after]
    assert ids(ring.since(after)) == ids(expected)
    assert ring.bytes_since(after) == sum(e.size for e in expected)
    assert len(ring) == len(held)


# -- EventRing: byte cap ------------------------------------------------------------------------


def test_ring_byte_cap_default_and_validation() -> None:
    assert DEFAULT_RING_BYTES == 16 * 1024 * 1024
    assert EventRing().max_bytes == DEFAULT_RING_BYTES
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max_bytes"):
            EventRing(5, max_bytes=bad)  # type: ignore[arg-type]


def test_ring_drops_head_past_byte_cap_and_frees_the_slots() -> None:
    cap = sum(ev(i, 100).size for i in (8, 9, 10))
    ring = EventRing(100, max_bytes=cap)
    for i in range(1, 11):
        ring.append(ev(i, 100))
    # Count would allow 100; bytes allow 3.
    assert (ring.first_id, ring.last_id, len(ring)) == (8, 10, 3)
    assert ring.total_bytes == cap
    assert ids(ring.since(0)) == [8, 9, 10]
    assert ring.get(7) is None
    assert ring.bytes_since(0) == ring.bytes_since(7) == cap
    assert ring.bytes_since(8) == cap - ev(8, 100).size
    # The slots of dropped events are empty: the ring no longer references their bytes.
    held = {id(e) for e in ring.since(0)}
    assert sum(1 for e in ring._events if e is not None) == 3
    assert all(id(e) in held for e in ring._events if e is not None)


def test_one_event_larger_than_the_byte_cap_stays_alone() -> None:
    ring = EventRing(10, max_bytes=50)
    ring.append(ev(1))
    ring.append(ev(2, 500))
    assert (ring.first_id, len(ring)) == (2, 1)
    assert ring.total_bytes == ev(2, 500).size > ring.max_bytes
    ring.append(ev(3))  # small again: the big one goes
    assert (ring.first_id, len(ring)) == (3, 1)


def test_event_dropped_for_bytes_is_a_ring_eviction_on_resume_and_for_a_subscriber() -> None:
    ring = EventRing(100, max_bytes=sum(ev(i, 100).size for i in (8, 9, 10)))
    for i in range(1, 11):
        ring.append(ev(i, 100))
    plan = decide_resume(ring, 4, EPOCH, EPOCH)
    assert synth(plan.before) == [("state_resync_required", {
        "reason": "ring_evicted", "lastDeliveredId": 4, "earliestAvailableId": 8})]
    assert ids(plan.replay) == [8, 9, 10]
    # A live subscriber whose next event (5) left the ring for bytes is evicted, same as
    # for count, even though its lag is far below the frame and byte caps.
    verdict = SubscriberState(4, max_queued=1000, max_queued_bytes=10**9).check(ring)
    assert isinstance(verdict, Eviction) and verdict.data.reason == "queue_overflow"
    assert SubscriberState(7, max_queued=1000, max_queued_bytes=10**9).check(ring) is None


@given(
    capacity=st.integers(1, 30),
    max_bytes=st.integers(1, 3000),
    pads=st.lists(st.integers(0, 600), max_size=80),
)
def test_property_ring_within_byte_cap_bar_one_event(
    capacity: int, max_bytes: int, pads: list[int],
) -> None:
    ring = EventRing(capacity, max_bytes=max_bytes)
    published: list[Event] = []
    for i, pad in enumerate(pads):
        event = ev(i + 1, pad)
        ring.append(event)
        published.append(event)
        held = ring.since(0)
        # Held events are the newest ones, contiguous, ending at the newest id.
        assert ids(held) == ids(published[len(published) - len(held):])
        assert ring.total_bytes == sum(e.size for e in held)
        # Within both caps, except one event larger than the byte cap, alone.
        assert len(held) <= capacity
        assert ring.total_bytes <= max_bytes or len(held) == 1
        # Nothing dropped that either cap allowed to keep.
        if len(held) < min(capacity, len(published)):
            older = published[len(published) - len(held) - 1]
            assert ring.total_bytes + older.size > max_bytes
        for after in (0, i - 3, i, i + 1):
            assert ring.bytes_since(after) == sum(
                e.size for e in held if e.id is not None and e.id > after)


# -- decide_resume: branches -------------------------------------------------------------------


def test_no_cursor_is_live_only() -> None:
    ring = filled(7)
    plan = decide_resume(ring, None, EPOCH, EPOCH, now_ms=NOW)
    assert plan == ResumePlan([], [], [], 7)
    plan = decide_resume(ring, None, "other-epoch", EPOCH, now_ms=NOW)
    assert plan.frames() == [] and plan.cursor == 7


def test_cursor_inside_ring_replays_the_rest() -> None:
    # samples/sse-frames.txt section B
    ring = filled(7)
    plan = decide_resume(ring, 3, EPOCH, EPOCH, now_ms=NOW)
    assert plan.before == []
    assert ids(plan.replay) == [4, 5, 6, 7]
    assert all(a is b for a, b in zip(plan.replay, ring.since(3), strict=True))
    assert synth(plan.after) == [complete(7, 4)]
    assert plan.cursor == 7


def test_replay_complete_frame_shape() -> None:
    plan = decide_resume(filled(7), 3, EPOCH, EPOCH, now_ms=NOW)
    assert plan.after[0].raw == (
        b'{"v":1,"type":"replay_complete","data":{"lastReplayedEventId":7,"lastEventId":7,'
        b'"replayedCount":4},"_meta":{"serverTimestamp":1796204640885}}'
    )
    assert plan.after[0].id is None


def test_up_to_date_cursor_replays_nothing() -> None:
    plan = decide_resume(filled(7), 7, None, EPOCH, now_ms=NOW)
    assert plan.before == [] and plan.replay == []
    assert synth(plan.after) == [complete(None, 0)]
    assert plan.cursor == 7


def test_epoch_mismatch_replays_whole_ring() -> None:
    # samples/sse-frames.txt section C
    ring = filled(7)
    plan = decide_resume(ring, 5, "wrong-epoch", EPOCH, now_ms=NOW)
    assert plan.before[0].raw == (
        b'{"v":1,"type":"state_resync_required","data":{"reason":"epoch_reset",'
        b'"detail":"epoch_mismatch","lastDeliveredId":5,"earliestAvailableId":1},'
        b'"_meta":{"serverTimestamp":1796204640885}}'
    )
    assert len(plan.before) == 1
    assert ids(plan.replay) == [1, 2, 3, 4, 5, 6, 7]
    assert synth(plan.after) == [complete(7, 7)]
    assert plan.cursor == 7


def test_epoch_mismatch_after_eviction_reports_ring_head() -> None:
    ring = filled(30, capacity=10)
    plan = decide_resume(ring, 25, "wrong", EPOCH)
    assert synth(plan.before) == [("state_resync_required", {
        "reason": "epoch_reset", "detail": "epoch_mismatch", "lastDeliveredId": 25,
        "earliestAvailableId": 21})]
    assert ids(plan.replay) == list(range(21, 31))


def test_cursor_beyond_next_id_is_an_epoch_reset_without_detail() -> None:
    ring = filled(7)
    for epoch in (None, EPOCH):
        plan = decide_resume(ring, 8, epoch, EPOCH, now_ms=NOW)
        assert synth(plan.before) == [("state_resync_required", {
            "reason": "epoch_reset", "lastDeliveredId": 8, "earliestAvailableId": 1})]
        assert ids(plan.replay) == [1, 2, 3, 4, 5, 6, 7]
        assert synth(plan.after) == [complete(7, 7)]
    plan = decide_resume(ring, 100, "wrong", EPOCH)
    assert synth(plan.before)[0][1]["detail"] == "epoch_mismatch"


def test_ring_evicted() -> None:
    # samples/sse-frames.txt section D: --event-ring-size 20, 64 events, Last-Event-ID 2
    ring = filled(64, capacity=20)
    plan = decide_resume(ring, 2, EPOCH, EPOCH, now_ms=NOW)
    assert plan.before[0].raw == (
        b'{"v":1,"type":"state_resync_required","data":{"reason":"ring_evicted",'
        b'"lastDeliveredId":2,"earliestAvailableId":45},"_meta":{"serverTimestamp":1796204640885}}'
    )
    assert ids(plan.replay) == list(range(45, 65))
    assert synth(plan.after) == [complete(64, 20)]
    assert plan.cursor == 64


def test_cursor_right_before_ring_head_is_not_evicted() -> None:
    ring = filled(64, capacity=20)
    plan = decide_resume(ring, 44, None, EPOCH)
    assert plan.before == []
    assert ids(plan.replay) == list(range(45, 65))


def test_last_event_id_zero_on_new_session_replays_whole_ring() -> None:
    ring = filled(5)
    plan = decide_resume(ring, 0, None, EPOCH, now_ms=NOW)
    assert plan.before == []
    assert ids(plan.replay) == [1, 2, 3, 4, 5]
    assert synth(plan.after) == [complete(5, 5)]


def test_last_event_id_zero_on_empty_new_session() -> None:
    ring = EventRing()
    plan = decide_resume(ring, 0, EPOCH, EPOCH, now_ms=NOW)
    assert plan.before == [] and plan.replay == []
    assert synth(plan.after) == [complete(None, 0)]
    assert plan.cursor == 0


def test_empty_ring_after_seeding_reports_seeded_replay() -> None:
    ring = EventRing(next_id=13)  # ids 1..12 went to the seeded replay window
    plan = decide_resume(ring, 4, EPOCH, EPOCH, now_ms=NOW)
    assert synth(plan.before) == [("state_resync_required", {
        "reason": "seeded_replay_not_in_ring", "lastDeliveredId": 4, "earliestAvailableId": 13})]
    assert plan.replay == []
    assert synth(plan.after) == [complete(None, 0)]
    assert plan.cursor == 12
    # Up to date with the seeded ids: nothing missing, nothing announced.
    plan = decide_resume(ring, 12, EPOCH, EPOCH)
    assert plan.before == [] and plan.replay == []


def test_empty_ring_epoch_mismatch_reports_next_id() -> None:
    ring = EventRing(next_id=13)
    plan = decide_resume(ring, 4, "wrong", EPOCH)
    assert synth(plan.before) == [("state_resync_required", {
        "reason": "epoch_reset", "detail": "epoch_mismatch", "lastDeliveredId": 4,
        "earliestAvailableId": 13})]
    assert plan.replay == []


def test_seeded_then_live_events_is_ring_evicted() -> None:
    ring = filled(3, start=13)
    plan = decide_resume(ring, 0, None, EPOCH)
    assert synth(plan.before) == [("state_resync_required", {
        "reason": "ring_evicted", "lastDeliveredId": 0, "earliestAvailableId": 13})]
    assert ids(plan.replay) == [13, 14, 15]


def test_replay_budget_exceeded_stops_and_skips_to_newest() -> None:
    ring = filled(10, pads=[100] * 10)
    size = ring.since(0)[0].size
    plan = decide_resume(ring, 2, EPOCH, EPOCH, now_ms=NOW, budget_bytes=3 * size + size // 2)
    assert plan.before == []
    assert ids(plan.replay) == [3, 4, 5]
    assert plan.after[0].raw == (
        b'{"v":1,"type":"state_resync_required","data":{"reason":"replay_budget_exceeded",'
        b'"lastDeliveredId":5,"earliestAvailableId":11},"_meta":{"serverTimestamp":1796204640885}}'
    )
    assert synth(plan.after[1:]) == [complete(5, 3)]
    assert plan.cursor == 10


def test_replay_budget_applies_after_an_epoch_reset_too() -> None:
    ring = filled(6, pads=[50] * 6)
    size = ring.since(0)[0].size
    plan = decide_resume(ring, 3, "wrong", EPOCH, budget_bytes=2 * size)
    assert [t for t, _ in synth(plan.before)] == ["state_resync_required"]
    assert ids(plan.replay) == [1, 2]
    assert synth(plan.after) == [
        ("state_resync_required", {"reason": "replay_budget_exceeded", "lastDeliveredId": 2,
                                   "earliestAvailableId": 7}),
        complete(2, 2),
    ]


def test_replay_budget_always_sends_one_frame() -> None:
    ring = filled(3, pads=[500, 0, 0])
    plan = decide_resume(ring, 0, None, EPOCH, budget_bytes=10)
    assert ids(plan.replay) == [1]
    assert synth(plan.after)[0] == ("state_resync_required", {
        "reason": "replay_budget_exceeded", "lastDeliveredId": 1, "earliestAvailableId": 4})


def test_replay_exactly_at_budget_is_complete() -> None:
    ring = filled(4, pads=[10, 20, 30, 40])
    plan = decide_resume(ring, 0, None, EPOCH, budget_bytes=ring.total_bytes)
    assert ids(plan.replay) == [1, 2, 3, 4]
    assert synth(plan.after) == [complete(4, 4)]


def test_synthetic_frames_without_now_have_no_meta() -> None:
    plan = decide_resume(filled(3, capacity=2), 0, None, EPOCH)
    assert all(set(env(e)) == {"v", "type", "data"} for e in plan.before + plan.after)
    assert all(e.id is None for e in plan.before + plan.after)


def test_negative_cursor_is_rejected() -> None:
    with pytest.raises(ValueError, match="cursor"):
        decide_resume(filled(1), -1, None, EPOCH)


# -- property: no duplicate, increasing ids, every gap announced first -------------------------

_BUDGETS = st.one_of(st.just(REPLAY_BUDGET_BYTES), st.integers(1, 2000))


@given(
    capacity=st.integers(1, 25),
    seeded=st.integers(0, 5),
    published_before=st.integers(0, 60),
    published_after=st.integers(0, 10),
    cursor_offset=st.integers(-70, 8),
    cursor_given=st.booleans(),
    epoch=st.sampled_from([None, EPOCH, "other-epoch"]),
    budget=_BUDGETS,
    pads=st.lists(st.integers(0, 200), min_size=1, max_size=8),
    ring_bytes=st.one_of(st.just(DEFAULT_RING_BYTES), st.integers(1, 3000)),
)
def test_property_resume_never_duplicates_and_announces_gaps(
    capacity: int,
    seeded: int,
    published_before: int,
    published_after: int,
    cursor_offset: int,
    cursor_given: bool,
    epoch: str | None,
    budget: int,
    pads: list[int],
    ring_bytes: int,
) -> None:
    start = seeded + 1
    ring = EventRing(capacity, next_id=start, max_bytes=ring_bytes)

    def pad(i: int) -> int:
        return pads[i % len(pads)]

    for i in range(published_before):
        ring.append(ev(ring.next_id, pad(i)))
    cursor = max(0, ring.last_id + cursor_offset) if cursor_given else None
    plan = decide_resume(ring, cursor, epoch, EPOCH, budget_bytes=budget)
    assert plan.cursor == ring.last_id

    frames: list[Event] = plan.frames()
    for i in range(published_after):
        event = ev(ring.next_id, pad(i))
        ring.append(event)
        # Live delivery: every event published after the plan with id > plan.cursor.
        if event.id is not None and event.id > plan.cursor:
            frames.append(event)
    final = ring.last_id

    delivered = [e.id for e in frames if e.id is not None]
    assert delivered == sorted(set(delivered)), "duplicate or out-of-order id"
    if cursor is None:
        assert plan.frames() == []
        assert delivered == list(range(plan.cursor + 1, final + 1))
        return

    types = [e.type for e in plan.frames()]
    assert types.count("replay_complete") == 1 and types[-1] == "replay_complete"
    done = env(plan.after[-1])["data"]
    assert done["replayedCount"] == len(plan.replay)
    if plan.replay:
        assert done["lastReplayedEventId"] == done["lastEventId"] == plan.replay[-1].id
    else:
        assert "lastReplayedEventId" not in done and "lastEventId" not in done
    assert sum(e.size for e in plan.replay[:-1]) <= budget

    got = set(delivered)
    for missing in range(cursor + 1, final + 1):
        if missing in got:
            continue
        later = [i for i, e in enumerate(frames) if e.id is not None and e.id > missing]
        horizon = later[0] if later else len(frames)
        announced = [
            env(e)["data"] for e in frames[:horizon] if e.type == "state_resync_required"
        ]
        assert any(
            d["lastDeliveredId"] < missing < d["earliestAvailableId"] for d in announced
        ), f"id {missing} skipped without a state_resync_required announcing it"


# -- EventRing.extend ---------------------------------------------------------------------------


@given(st.integers(1, 12), st.lists(st.integers(0, 60), max_size=60),
       st.lists(st.integers(1, 15), min_size=1, max_size=60), st.integers(150, 2000),
       st.integers(1, 5))
def test_extend_is_append_of_each(capacity: int, pads: list[int], runs: list[int],
                                  max_bytes: int, start: int) -> None:
    # A run appended at once leaves the ring exactly as appending its events one by one:
    # same ids held, same bytes, same suffix sizes, the same slots freed.
    events = [ev(start + i, pad) for i, pad in enumerate(pads)]
    one = EventRing(capacity, next_id=start, max_bytes=max_bytes)
    for event in events:
        one.append(event)
    many = EventRing(capacity, next_id=start, max_bytes=max_bytes)
    at, k = 0, 0
    appended = 0
    while at < len(events):
        step = runs[k % len(runs)]
        run = events[at:at + step]
        # What it returns: the bytes appended before each event of the run, and after it.
        offsets = many.extend(run)
        assert offsets[0] == appended
        assert [b - a for a, b in pairwise(offsets)] == [e.size for e in run]
        appended = offsets[-1]
        at += step
        k += 1
    assert many.extend([]) == [appended]
    assert (many.first_id, many.last_id, len(many), many.total_bytes, many.next_id) == (
        one.first_id, one.last_id, len(one), one.total_bytes, one.next_id)
    assert ids(many.since(0)) == ids(one.since(0))
    for after in range(start - 1, start + len(pads) + 1):
        assert many.bytes_since(after) == one.bytes_since(after)
    assert [e is None for e in many._events] == [e is None for e in one._events]


def test_extend_refuses_ids_out_of_order() -> None:
    ring = filled(3, capacity=10)
    with pytest.raises(ValueError, match=r"expects ids 4\.\.5"):
        ring.extend([ev(5), ev(6)])
    assert ring.last_id == 3


# -- a ring's array grows with what it holds ------------------------------------------------------


def test_a_new_ring_allocates_a_few_slots_and_grows_to_its_capacity() -> None:
    # An idle session's ring must not cost its capacity: 8,000 slots are 128 KB per session.
    ring = EventRing(DEFAULT_RING_SIZE)
    assert ring.slots <= 64
    for i in range(1, 101):
        ring.append(ev(i))
    assert 100 <= ring.slots <= 128
    ring.extend([ev(i) for i in range(101, DEFAULT_RING_SIZE + 51)])
    assert ring.slots == DEFAULT_RING_SIZE
    assert (ring.first_id, ring.last_id) == (51, DEFAULT_RING_SIZE + 50)


@given(st.integers(1, 40), st.integers(1, 8), st.lists(st.integers(0, 60), max_size=90),
       st.lists(st.integers(1, 20), min_size=1, max_size=30), st.integers(150, 3000),
       st.integers(1, 5))
def test_a_growing_ring_holds_what_a_full_size_one_holds(
        capacity: int, initial: int, pads: list[int], runs: list[int], max_bytes: int,
        start: int) -> None:
    # The same appends and runs into a ring that starts with `initial` slots and one that
    # starts with all of them: the same events held, by id, with the same suffix sizes.
    grown = EventRing(capacity, next_id=start, max_bytes=max_bytes, initial_slots=initial)
    full = EventRing(capacity, next_id=start, max_bytes=max_bytes, initial_slots=capacity)
    events = [ev(start + i, pad) for i, pad in enumerate(pads)]
    at, k = 0, 0
    while at < len(events):
        step = runs[k % len(runs)]
        run = events[at:at + step]
        if k % 2:
            assert grown.extend(run) == full.extend(run)
        else:
            for event in run:
                grown.append(event)
                full.append(event)
        at += step
        k += 1
        assert (grown.first_id, grown.last_id, len(grown), grown.total_bytes) == (
            full.first_id, full.last_id, len(full), full.total_bytes)
        assert grown.slots <= capacity
        assert ids(grown.since(0)) == ids(full.since(0))
        for after in range(start - 1, start + at + 1):
            assert grown.bytes_since(after) == full.bytes_since(after)
            got = grown.get(after)
            assert (got.id if got else None) == (full.get(after).id if full.get(after) else None)
