"""Shared SSE frames: every subscriber gets exactly the frames of the ring events after its
cursor, subscribers at the same cursor share one bytes object, and the cache stays bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.core.envelope import Event
from daemon.core.frame_codec import sse_chunks, sse_frames
from daemon.core.ring import EventRing
from daemon.core.shared_frames import SharedFrames
from tests.hypothesis_profiles import examples


def event(event_id: int, size: int = 10) -> Event:
    return Event.from_env({"id": event_id, "v": 1, "type": "session_update", "data": "x" * size})


@settings(max_examples=examples(200), deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 30), st.lists(st.integers(0, 3), max_size=4)),
                   min_size=1, max_size=30),
    max_bytes=st.integers(1, 4000),
)
def test_every_subscriber_gets_exactly_the_frames_after_its_cursor(
        steps: list[tuple[int, list[int]]], max_bytes: int) -> None:
    ring = EventRing(capacity=1000)
    frames = SharedFrames(max_bytes)
    cursors = [0, 0, 0, 0]
    for published, readers in steps:
        for _ in range(published):
            ring.append(event(ring.next_id))
        for reader in readers:
            cursor = cursors[reader]
            expected = b"".join(sse_chunks(ring.since(cursor)))
            got, end = frames.since(ring, cursor)
            assert b"".join(got) == expected
            assert end == ring.last_id
            cursors[reader] = end
        # Bounded: the newest segment may exceed the bound alone, never two together.
        assert frames.held_bytes <= max_bytes or len(frames) <= 1


def test_subscribers_at_one_cursor_share_one_bytes_object() -> None:
    ring = EventRing(capacity=100)
    frames = SharedFrames()
    for i in range(1, 11):
        ring.append(event(i))
    first, end_a = frames.since(ring, 0)
    second, end_b = frames.since(ring, 0)
    assert end_a == end_b == 10
    assert len(first) == len(second) == 1 and first[0] is second[0]
    for i in range(11, 16):
        ring.append(event(i))
    # One subscriber at 10 builds the next segment; one still at 0 takes both, none rebuilt,
    # joined once: another subscriber at 0 takes that same join, not a copy of its own.
    newer, _ = frames.since(ring, 10)
    behind, end = frames.since(ring, 0)
    assert end == 15 and behind == [first[0] + newer[0]]
    again, end = frames.since(ring, 0)
    assert end == 15 and len(again) == 1 and again[0] is behind[0]
    assert frames.since(ring, 10)[0][0] is newer[0]  # the segments it joined are still there
    assert frames.since(ring, 15) == ([], 15)


def test_clear_forgets_every_segment() -> None:
    ring = EventRing(capacity=100)
    frames = SharedFrames()
    ring.append(event(1))
    frames.since(ring, 0)
    assert len(frames) == 1 and frames.held_bytes > 0
    frames.clear()
    assert len(frames) == 0 and frames.held_bytes == 0


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.sampled_from(["session_update", "session_update", "turn_complete", "x%d"]),
                max_size=20),
       st.integers(1, 50), st.booleans())
def test_sse_frames_is_the_frames_of_each(types: list[str], start: int, gap: bool) -> None:
    # The one-type fast path and the general one both give exactly sse_chunks' bytes, for
    # consecutive ids and (should a caller pass them) ids with a gap.

    ids = [start + i + (5 if gap and i >= len(types) // 2 else 0) for i in range(len(types))]
    events = [Event.from_env({"id": i, "v": 1, "type": t, "data": "%d" * i})
              for i, t in zip(ids, types, strict=True)]
    assert sse_frames(events) == b"".join(sse_chunks(events))
