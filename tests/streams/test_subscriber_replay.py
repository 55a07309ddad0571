"""The slow-client rules while a subscriber replays: replayed frames do not count
against the caps, live events published meanwhile do, and a replay whose next event left the
ring is evicted. Pure cores: ``SubscriberState`` and the replay grouping of ``streams``."""

from __future__ import annotations

import trio
import trio.testing

from daemon.core.envelope import Event, make_event
from daemon.core.ring import EventRing
from daemon.core.subscriber import Eviction, SubscriberState
from daemon.streams import Subscription, replay_events, replay_groups, watch_stalled_writes


def event(i: int, size: int = 100) -> Event:
    made = make_event(i, "x", "p" * size, now_ms=0)
    assert made is not None
    return made


def ring_of(first: int, last: int, capacity: int) -> EventRing:
    ring = EventRing(capacity=capacity, next_id=first)
    for i in range(first, last + 1):
        ring.append(event(i))
    return ring


def test_replayed_frames_do_not_count_against_the_caps() -> None:
    # 1,000 events in the ring, cursor at the newest: replaying all of them is no lag.
    ring = ring_of(1, 1000, capacity=2000)
    state = SubscriberState(cursor=1000, max_queued=16)
    state.replay_pos = 0
    assert state.check(ring) is None


def test_live_events_published_during_the_replay_count() -> None:
    ring = ring_of(1, 1000, capacity=2000)
    state = SubscriberState(cursor=1000, max_queued=16)
    state.replay_pos = 10
    for i in range(1001, 1018):
        ring.append(event(i))
    verdict = state.check(ring)
    assert isinstance(verdict, Eviction) and verdict.data.reason == "queue_overflow"
    assert verdict.data.dropped_after == 10  # the last id it was handed
    assert verdict.data.queue_size == 17


def test_replay_whose_next_event_left_the_ring_is_evicted() -> None:
    ring = ring_of(1, 100, capacity=100)
    state = SubscriberState(cursor=100, max_queued=2048)
    state.replay_pos = 5
    for i in range(101, 106):  # ids 1..5 leave the ring: 6 is still there
        ring.append(event(i))
    assert state.check(ring) is None
    ring.append(event(106))  # id 6, the next one to replay, leaves the ring
    verdict = state.check(ring)
    assert isinstance(verdict, Eviction) and verdict.data.reason == "queue_overflow"
    assert verdict.data.dropped_after == 5
    assert verdict.data.queue_size == 101
    # Once the replay is over only the live cursor matters.
    state2 = SubscriberState(cursor=106, max_queued=2048)
    assert state2.check(ring) is None


def test_replay_groups_cut_by_bytes_and_keep_every_event_once() -> None:
    events = [event(i, size=300) for i in range(1, 101)]
    groups = replay_groups(events, max_bytes=1000)
    assert [e for g in groups for e in g] == events
    assert all(sum(e.size for e in g[:-1]) < 1000 for g in groups)
    assert all(g for g in groups) and len(groups) > 10
    assert replay_groups([], 1000) == []
    assert [len(g) for g in replay_groups(events[:1], 10)] == [1]


async def test_replay_events_tracks_the_position_and_stops_once_evicted() -> None:
    events = [event(i, size=300) for i in range(1, 11)]
    state = SubscriberState(cursor=10)
    sub = Subscription(state)
    positions: list[int | None] = []

    async def write(group: object) -> None:
        positions.append(state.replay_pos)
        await trio.lowlevel.checkpoint()

    assert await replay_events(sub, events, write)
    assert positions[0] == 0 and state.replay_pos is None

    seen: list[int] = []
    state2 = SubscriberState(cursor=10)

    async def write_then_evict(group: list[Event]) -> None:
        seen.extend(e.id or 0 for e in group)
        state2.evicted = Eviction({})

    many = [event(i, size=600_000) for i in range(1, 6)]
    assert not await replay_events(Subscription(state2), many, write_then_evict)
    assert seen == [1, 2] and state2.replay_pos is None  # nothing after the eviction


async def test_watch_stalled_writes_cuts_only_a_write_without_progress(
        autojump_clock: trio.testing.MockClock) -> None:
    """Virtual time: a write that keeps progressing and an idle stream are left alone; a write
    with no progress is cut between ``limit`` and ``limit + limit / 4`` after it stalled."""
    sub = Subscription(SubscriberState(0))
    cuts: list[float] = []
    sub.abort = lambda: cuts.append(trio.current_time())
    limit = 2.0
    async with trio.open_nursery() as nursery:
        sub.scope = trio.CancelScope()  # (the stream's scope; cancelled along with the cut)
        nursery.start_soon(watch_stalled_writes, sub, limit)
        sub.begin_write()
        for _ in range(20):  # 15 s of a slow write that progresses every 0.75 s
            await trio.sleep(0.75)
            sub.writes_done += 1
        sub.end_write()
        await trio.sleep(10 * limit)  # idle is not stalled
        assert cuts == []
        sub.begin_write()
        stalled_at = trio.current_time()
        await trio.sleep(3 * limit)
        assert len(cuts) == 1
        assert limit <= cuts[0] - stalled_at <= limit + limit / 4 + 1e-9
        assert sub.scope.cancel_called
        nursery.cancel_scope.cancel()
