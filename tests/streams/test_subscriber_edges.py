"""Slow-client rule details pinned down by mutation testing: the exact warning and
eviction thresholds in frames and bytes, the re-arm boundary, a replay position that left the
ring, and the frames' data. A fake ring view makes every count exact."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from daemon.core.subscriber import (
    MAX_QUEUED_BYTES,
    MAX_QUEUED_DEFAULT,
    Eviction,
    SubscriberState,
    Warning,
)


@dataclass
class Ring:
    """A ring view whose events are each ``size`` bytes."""

    last_id: int
    first_id: int | None = 1
    size: int = 1

    def bytes_since(self, after_id: int) -> int:
        first = self.first_id if self.first_id is not None else self.last_id + 1
        return max(0, self.last_id - max(after_id, first - 1)) * self.size


def test_defaults() -> None:
    state = SubscriberState(cursor=5)
    assert (state.max_queued, state.max_queued_bytes) == (MAX_QUEUED_DEFAULT, MAX_QUEUED_BYTES)
    assert (state.warned, state.evicted, state.replay_pos) == (False, None, None)
    assert state.check(Ring(last_id=5)) is None


def test_frame_warning_at_exactly_three_quarters_with_its_data() -> None:
    state = SubscriberState(cursor=0, max_queued=16, max_queued_bytes=1000)
    assert state.check(Ring(last_id=11)) is None
    warning = state.check(Ring(last_id=12))
    assert isinstance(warning, Warning)
    assert msgspec.to_builtins(warning.data) == {"queueSize": 12, "maxQueued": 16, "lastEventId": 0,
                            "queuedBytes": 12, "maxQueuedBytes": 1000, "threshold": "frames"}
    assert state.warned is True


def test_byte_warning_and_both_thresholds() -> None:
    state = SubscriberState(cursor=0, max_queued=100, max_queued_bytes=1000)
    assert state.check(Ring(last_id=10, size=74)) is None  # 740 bytes
    warning = state.check(Ring(last_id=10, size=75))  # 750: exactly 75%
    assert isinstance(warning, Warning) and warning.data.threshold == "bytes"
    assert warning.data.queued_bytes == 750
    both = SubscriberState(cursor=0, max_queued=100, max_queued_bytes=1000)
    warning = both.check(Ring(last_id=80, size=10))
    assert isinstance(warning, Warning) and warning.data.threshold == "frames_and_bytes"


def test_the_warning_rearms_only_below_three_eighths_of_both_caps() -> None:
    state = SubscriberState(cursor=0, max_queued=16, max_queued_bytes=1000)
    assert isinstance(state.check(Ring(last_id=12)), Warning)
    assert state.check(Ring(last_id=6)) is None  # 6 frames = 37.5%: still latched
    assert state.warned is True
    assert state.check(Ring(last_id=5)) is None  # below: re-armed
    assert state.warned is False
    assert isinstance(state.check(Ring(last_id=12)), Warning)
    # Frames are low but the bytes are not: still latched.
    assert state.check(Ring(last_id=2, size=200)) is None  # 400 bytes >= 375
    assert state.warned is True
    assert state.check(Ring(last_id=2, size=187)) is None  # 374 bytes
    assert state.warned is False


def test_catching_up_fully_rearms() -> None:
    state = SubscriberState(cursor=0, max_queued=16)
    assert isinstance(state.check(Ring(last_id=12)), Warning)
    state.cursor = 12
    assert state.check(Ring(last_id=12)) is None
    assert state.warned is False


def test_a_full_queue_is_within_the_cap_and_one_more_is_evicted() -> None:
    state = SubscriberState(cursor=0, max_queued=16, max_queued_bytes=10_000)
    assert isinstance(state.check(Ring(last_id=16)), Warning)
    assert state.evicted is None
    eviction = state.check(Ring(last_id=17))
    assert isinstance(eviction, Eviction)
    assert msgspec.to_builtins(eviction.data) == {"reason": "queue_overflow", "droppedAfter": 0, "queueSize": 17,
                             "maxQueued": 16, "queuedBytes": 17, "maxQueuedBytes": 10_000}


def test_bytes_exactly_at_the_cap_are_within_it() -> None:
    state = SubscriberState(cursor=0, max_queued=100, max_queued_bytes=1000)
    assert not isinstance(state.check(Ring(last_id=10, size=100)), Eviction)
    eviction = state.check(Ring(last_id=11, size=100))
    assert isinstance(eviction, Eviction)
    assert eviction.data.reason == "queue_bytes_overflow"
    assert eviction.data.queued_bytes == 1100 and eviction.data.queue_size == 11


def test_a_cursor_whose_next_event_left_the_ring_is_evicted() -> None:
    state = SubscriberState(cursor=3, max_queued=100)
    assert state.check(Ring(last_id=10, first_id=4)) is None  # event 4 still held
    eviction = SubscriberState(cursor=3, max_queued=100).check(Ring(last_id=10, first_id=5))
    assert isinstance(eviction, Eviction) and eviction.data.reason == "queue_overflow"
    assert eviction.data.dropped_after == 3 and eviction.data.queue_size == 7


def test_a_stalled_replay_whose_next_event_left_the_ring_is_evicted() -> None:
    state = SubscriberState(cursor=50, max_queued=100)
    state.replay_pos = 20
    assert state.check(Ring(last_id=50, first_id=21)) is None
    eviction = state.check(Ring(last_id=50, first_id=22))
    assert isinstance(eviction, Eviction)
    assert msgspec.to_builtins(eviction.data) == {"reason": "queue_overflow", "droppedAfter": 20, "queueSize": 30,
                             "maxQueued": 100, "queuedBytes": 29,
                             "maxQueuedBytes": MAX_QUEUED_BYTES}
    assert state.check(Ring(last_id=50)) is eviction  # sticky


def test_evict_now_reports_the_current_lag() -> None:
    state = SubscriberState(cursor=4, max_queued=100)
    eviction = state.evict_now("client_closed", Ring(last_id=9, size=3))
    assert msgspec.to_builtins(eviction.data) == {"reason": "client_closed", "droppedAfter": 4, "queueSize": 5,
                             "maxQueued": 100, "queuedBytes": 15,
                             "maxQueuedBytes": MAX_QUEUED_BYTES}
    assert state.evicted is eviction


def test_a_single_huge_event_warns_and_a_bigger_one_evicts() -> None:
    state = SubscriberState(cursor=0, max_queued=100, max_queued_bytes=1000)
    warning = state.check(Ring(last_id=1, size=800))
    assert isinstance(warning, Warning) and warning.data.threshold == "bytes"
    eviction = SubscriberState(cursor=0, max_queued=100, max_queued_bytes=1000).check(
        Ring(last_id=1, size=1001))
    assert isinstance(eviction, Eviction) and eviction.data.reason == "queue_bytes_overflow"


def test_a_gap_eviction_reports_the_queued_bytes() -> None:
    eviction = SubscriberState(cursor=3, max_queued=100).check(
        Ring(last_id=10, first_id=5, size=2))
    assert isinstance(eviction, Eviction)
    assert eviction.data.queued_bytes == 12  # events 5..10 still held


def test_bytes_exactly_at_three_eighths_keep_the_warning_latched() -> None:
    state = SubscriberState(cursor=0, max_queued=16, max_queued_bytes=1000)
    assert isinstance(state.check(Ring(last_id=12)), Warning)
    assert state.check(Ring(last_id=3, size=125)) is None  # 375 bytes: not below 37.5%
    assert state.warned is True
